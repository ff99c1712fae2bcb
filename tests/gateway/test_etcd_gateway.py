"""The gateway on etcd: the spec's storage section, one owner per store, moving a gateway
to another state directory, and a replicated 3-member etcd losing a member and then its
leader while a client writes through the gateway."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from socialweb_computer import testing
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.testing import gateway as gateway_mod

ENDPOINTS = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]


def etcd_spec(cluster: testing.EtcdCluster, prefix: str) -> dict[str, Any]:
    return {"backend": "etcd", "etcd": {"endpoints": cluster.endpoints, "keyPrefix": prefix}}


def unique_prefix() -> str:
    return f"/swc-test-{uuid.uuid4().hex[:12]}"


# -- the spec ---------------------------------------------------------------------------


def test_storage_section_parses_with_paths_from_the_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "storage": {
                    "backend": "etcd",
                    "etcd": {
                        "endpoints": ENDPOINTS,
                        "caFile": "etcd/ca.crt",
                        "certFile": "/etc/swc/etcd.crt",
                        "keyFile": "/etc/swc/etcd.key",
                        "keyPrefix": "/tenants-a",
                    },
                }
            }
        )
    )
    spec = spec_mod.load(str(path))
    assert spec.storage_backend == "etcd" and spec.etcd is not None
    assert spec.etcd.endpoints == tuple(ENDPOINTS)
    assert spec.etcd.ca_file == str(tmp_path / "etcd" / "ca.crt")
    assert (spec.etcd.cert_file, spec.etcd.key_file) == ("/etc/swc/etcd.crt", "/etc/swc/etcd.key")
    assert spec.etcd.key_prefix == "/tenants-a" and spec.etcd.owner_lease_seconds == 15
    assert spec_mod.parse(None).storage_backend == "sqlite"


def test_the_example_etcd_spec_parses() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "gateway-spec-etcd.yaml"
    spec = spec_mod.load(str(example))
    assert spec.etcd is not None and len(spec.etcd.endpoints) == 3 and spec.etcd.cert_file


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ({"backend": "mysql"}, "storage.backend: 'mysql' is not a storage backend; use sqlite or etcd"),
        ({"backend": "etcd"}, "storage.etcd is missing"),
        ({"etcd": {"endpoints": ENDPOINTS}}, "set backend: etcd to use it"),
        ({"backend": "etcd", "etcd": {"endpoints": ["http://10.0.0.1:2379"]}}, "unencrypted"),
        (
            {"backend": "etcd", "etcd": {"endpoints": ENDPOINTS, "certFile": "a.crt"}},
            "both certFile and keyFile",
        ),
        ({"backend": "etcd", "etcd": {"endpoints": ENDPOINTS, "keyPrefix": "x/"}}, "key prefix 'x/'"),
        ({"backend": "etcd", "etcd": {"endpoint": ENDPOINTS}}, "unknown field 'endpoint'"),
        ({"backend": "etcd", "etcd": {"endpoints": ENDPOINTS, "ownerLeaseSeconds": 1}}, "ownerLeaseSeconds"),
    ],
)
def test_storage_section_errors_name_the_field(storage: dict[str, Any], message: str) -> None:
    with pytest.raises(spec_mod.SpecError, match="spec: storage") as info:
        spec_mod.parse({"storage": storage})
    assert message in str(info.value)


# -- one store, one gateway -------------------------------------------------------------


def test_two_gateways_never_both_own_a_store_and_the_second_can_take_over(
    etcd_server: testing.EtcdCluster, tmp_path: Path
) -> None:
    """A gateway started on another state directory (another host, say) on the same etcd is
    refused while the first runs; once the first is stopped it serves the same clusters,
    with the same objects, CAs and ports, from an empty state directory."""
    storage = etcd_spec(etcd_server, unique_prefix())
    first = gateway_mod.GatewayProcess.start(
        tmp_path / "a", {"storage": storage, "clusters": [{"name": "ci"}]}
    )
    try:
        url = first.wait_phase("ci", "Ready")["status"]["url"]
        tenant = first.tenant_kubeconfig("ci")
        first.kubectl_with(tenant, "create", "configmap", "kept", "--from-literal=k=v")
        token = first.kubectl_with(tenant, "create", "token", "default", "-n", "default").stdout.strip()
        with pytest.raises(testing.ServerStartError) as refused:
            gateway_mod.GatewayProcess.start(tmp_path / "b", {"storage": storage}, timeout=30)
        message = str(refused.value)
        assert "is owned by another process" in message and str(tmp_path / "a") in message
        assert "stop the other gateway first" in message
        assert (
            first.kubectl_with(tenant, "get", "configmap", "kept", "-o", "name").stdout == "configmap/kept\n"
        )
    finally:
        first.stop()

    second = gateway_mod.GatewayProcess.start(tmp_path / "b", {"storage": storage})
    try:
        cluster = second.wait_phase("ci", "Ready")
        assert cluster["status"]["url"] == url  # the same port: runners' kubeconfigs still work
        # The first gateway's credentials work against the second: same serving CA and ClientCA.
        assert (
            second.kubectl_with(tenant, "get", "configmap", "kept", "-o", "jsonpath={.data.k}").stdout == "v"
        )
        old_admin = yaml.safe_load(first.kubeconfig.read_text())
        old_admin["clusters"][0]["cluster"]["server"] = second.url
        moved = tmp_path / "old-admin.kubeconfig"
        moved.write_text(yaml.safe_dump(old_admin))
        assert (
            second.kubectl_with(moved, "get", "cluster", "ci", "-o", "name").stdout
            == "cluster.socialweb.computer/ci\n"
        )
        # ServiceAccount tokens signed there verify here: the signing keys moved with the store.
        with_token = yaml.safe_load(tenant.read_text())
        with_token["users"][0]["user"] = {"token": token}
        token_kubeconfig = tmp_path / "token.kubeconfig"
        token_kubeconfig.write_text(yaml.safe_dump(with_token))
        whoami = second.kubectl_with(
            token_kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"
        )
        assert whoami.stdout == "system:serviceaccount:default:default"
        for relative in ("pki/serving-ca.crt", "clusters/ci/pki/client-ca.crt", "clusters/ci/cluster.json"):
            assert (second.state_dir / relative).read_bytes() == (first.state_dir / relative).read_bytes()
        assert (second.state_dir / "clusters/ci/pki/client-ca.key").stat().st_mode & 0o077 == 0
        config = second.config()
        assert (
            config["storage"]["backend"] == "etcd"
            and config["storage"]["keyPrefix"] == storage["etcd"]["keyPrefix"]
        )
    finally:
        second.stop()


def test_a_killed_gateways_claim_is_taken_over_at_once(
    etcd_server: testing.EtcdCluster, tmp_path: Path
) -> None:
    storage = etcd_spec(etcd_server, unique_prefix())
    first = gateway_mod.GatewayProcess.start(
        tmp_path / "a", {"storage": storage, "clusters": [{"name": "ci"}]}, timeout=60
    )
    first.wait_phase("ci", "Ready", timeout=60)
    owner = json.loads(etcd_server.etcdctl("get", f"{storage['etcd']['keyPrefix']}/.gateway/owner",
                                           "-w", "json").stdout)["kvs"][0]
    # Its lease would hold the claim for 15 s after the kill; the test keeps that lease alive, so
    # the claim still stands when the next gateway starts, however long a loaded machine makes
    # that take: only the claim naming a process of this host that is gone lets it take over.
    keeper = subprocess.Popen(etcd_server.etcdctl_command("lease", "keep-alive", format(owner["lease"], "x")),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first.kill()
        first.wait(10)
        again = gateway_mod.GatewayProcess.start(tmp_path / "a", None, timeout=60)
        try:
            again.wait_phase("ci", "Ready", timeout=60)
            assert "taking over the etcd claim of a process that is gone" in again.stderr_path.read_text()
        finally:
            again.stop()
    finally:
        keeper.kill()
        keeper.wait()


def test_deleting_a_cluster_removes_its_copy_in_the_store(
    etcd_server: testing.EtcdCluster, tmp_path: Path
) -> None:
    storage = etcd_spec(etcd_server, unique_prefix())
    prefix = storage["etcd"]["keyPrefix"]
    gateway = gateway_mod.GatewayProcess.start(
        tmp_path / "a", {"storage": storage, "clusters": [{"name": "ci"}]}
    )
    try:
        gateway.wait_phase("ci", "Ready")
        keys = etcd_server.etcdctl("get", "--prefix", f"{prefix}/.gateway/", "--keys-only").stdout.split()
        assert keys == [
            f"{prefix}/.gateway/clusters/ci",
            f"{prefix}/.gateway/owner",
            f"{prefix}/.gateway/pki/admin",
        ]
        gateway.kubectl("delete", "cluster", "ci", "--timeout=30s")
        keys = etcd_server.etcdctl("get", "--prefix", prefix, "--keys-only").stdout.split()
        assert not [k for k in keys if k.startswith((f"{prefix}/ci/", f"{prefix}/.gateway/clusters/"))]
    finally:
        gateway.stop()


def test_a_gateway_that_lost_its_claim_stops_serving(
    etcd_server: testing.EtcdCluster, tmp_path: Path
) -> None:
    storage = etcd_spec(etcd_server, unique_prefix())
    gateway = gateway_mod.GatewayProcess.start(tmp_path / "a", {"storage": storage})
    try:
        # As if its lease had expired while it was cut off and another gateway had claimed the store.
        etcd_server.etcdctl("del", storage["etcd"]["keyPrefix"] + "/.gateway/owner")
        refused = gateway.kubectl("create", "namespace", "after-loss", check=False)
        assert refused.returncode != 0 and "no longer owns" in refused.stderr, refused.stderr
        assert gateway.wait(30) != 0
        assert "lost its claim on the etcd store" in gateway.stderr_path.read_text()
    finally:
        gateway.stop()


# -- a replicated etcd ------------------------------------------------------------------


class LineReader(threading.Thread):
    """Collects the names a `kubectl get --watch -o name` prints, as it prints them."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.process = process
        self.names: list[str] = []
        self.start()

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.names.append(line.strip().removeprefix("configmap/"))


class ConfigMapWriter(threading.Thread):
    """Creates ConfigMaps in a tenant with the official Python client, one after another, and
    records the answer to each: acknowledged (201), refused (503), unknown outcome (504)."""

    def __init__(self, gateway: gateway_mod.GatewayProcess, kubeconfig: Path) -> None:
        super().__init__(daemon=True)
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.retries = 0
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.acknowledged: list[str] = []
        self.answers: dict[int, int] = {}
        self.messages: dict[int, str] = {}
        self.unknown: list[str] = []
        self.running = True

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        i = 0
        while self.running:
            name = f"w-{i:05}"
            i += 1
            body = {"metadata": {"name": name}, "data": {"i": str(i)}}
            try:
                self.core.create_namespaced_config_map("default", body, _request_timeout=30)
            except ApiException as e:
                self.answers[e.status] = self.answers.get(e.status, 0) + 1
                self.messages.setdefault(e.status, json.loads(e.body or "{}").get("message", ""))
                if e.status == 504:
                    self.unknown.append(name)
                time.sleep(0.05)
                continue
            self.answers[201] = self.answers.get(201, 0) + 1
            self.acknowledged.append(name)

    def wait_for_ack(self, timeout: float = 90.0) -> float:
        started, count = time.monotonic(), len(self.acknowledged)
        while len(self.acknowledged) == count:
            if time.monotonic() - started > timeout:
                raise AssertionError(f"no write acknowledged for {timeout}s: {self.answers} {self.messages}")
            time.sleep(0.05)
        return time.monotonic() - started

    def finish(self) -> None:
        self.running = False
        self.join(60)
        self.api.close()


def test_gateway_on_a_3_member_etcd_loses_a_member_then_the_leader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with testing.EtcdCluster.start(tmp_path / "etcd", size=3) as cluster:
        spec = {
            "storage": {**etcd_spec(cluster, unique_prefix()), "historyLimit": 100},
            "clusters": [{"name": "ci"}],
        }
        gateway = gateway_mod.GatewayProcess.start(tmp_path / "state", spec)
        try:
            gateway.wait_phase("ci", "Ready")
            tenant = gateway.tenant_kubeconfig("ci")
            # A client watching through the whole outage: the gateway's etcd watch resumes under it.
            watcher = subprocess.Popen(
                [
                    str(testing.tool_path("kubectl")),
                    f"--kubeconfig={tenant}",
                    "get",
                    "configmaps",
                    "--watch",
                    "-o",
                    "name",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=gateway.tool_env(),
            )
            watched = LineReader(watcher)
            writer = ConfigMapWriter(gateway, tenant)
            try:
                writer.start()
                writer.wait_for_ack()
                time.sleep(1.0)
                leader = cluster.leader_index()
                follower = next(i for i in range(3) if i != leader)
                cluster.kill(follower)
                after_follower = writer.wait_for_ack()
                time.sleep(1.0)
                cluster.kill(leader)  # one member of three left: no quorum
                refused = gateway.kubectl_with(tenant, "create", "configmap", "during-no-quorum", check=False)
                assert refused.returncode != 0
                assert (
                    "storage is unavailable" in refused.stderr or "may still be processing" in refused.stderr
                )
                time.sleep(2.0)
                cluster.restart(leader)
                cluster.restart(follower)
                back = time.monotonic()
                recovery = writer.wait_for_ack()
                time.sleep(1.0)
                writer.finish()

                names = set(gateway.kubectl_with(tenant, "get", "configmaps", "-o", "name").stdout.split())
                found = {n.removeprefix("configmap/") for n in names}
                lost = [name for name in writer.acknowledged if name not in found]
                assert not lost, f"acknowledged writes lost: {lost}"
                # Every acknowledged write reaches the watch, however long its resume took.
                deadline = time.monotonic() + 60
                while set(writer.acknowledged) - set(watched.names) and time.monotonic() < deadline:
                    time.sleep(0.1)
                caught_up = time.monotonic() - back
                watcher.terminate()
                watcher.wait(10)
                assert watcher.stderr is not None
                watch_errors = watcher.stderr.read()
                watched.join(10)
                watched_names = watched.names
                missed = [name for name in writer.acknowledged if name not in watched_names]
                assert not missed, f"the watch missed {missed[:5]}: {watch_errors}"
                assert len(watched_names) == len(set(watched_names)), "the watch repeated an event"
                assert gateway.returncode is None, "the gateway kept running through the outage"
                assert set(writer.answers) <= {201, 503, 504}, f"only clear answers: {writer.messages}"
                applied_unknown = [name for name in writer.unknown if name in found]
                with capsys.disabled():
                    answers = dict(sorted(writer.answers.items()))
                    print(
                        f"\ngateway on 3-member etcd: {len(writer.acknowledged)} creates acknowledged, all "
                        f"{len(writer.acknowledged) - len(lost)} found; answers {answers}; "
                        f"{len(writer.unknown)} of unknown outcome ({len(applied_unknown)} applied); writes "
                        f"resumed {after_follower:.2f}s after a follower died, {recovery:.2f}s after both "
                        f"members were restarted; a kubectl watch saw all {len(watched_names)} once, all of "
                        f"them {caught_up:.2f}s after the restart; "
                        f"503 said: {writer.messages.get(503, '')[:160]!r}"
                    )
            finally:
                writer.running = False
                if watcher.poll() is None:
                    watcher.kill()
                    watcher.wait(10)
                watched.join(10)
                for pipe in (watcher.stdout, watcher.stderr):
                    if pipe is not None:
                        pipe.close()
        finally:
            gateway.stop()
