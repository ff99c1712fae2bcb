"""A Cluster's life through the admin plane, with kubectl: create, park, delete, restart, failure."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from socialweb_computer import clusterprovider

CLUSTER = """\
apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata:
  name: {name}
"""


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def refuses(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def create_cluster(gateway, name: str) -> dict:
    gateway.kubectl("apply", "-f", "-", input=CLUSTER.format(name=name))
    return gateway.wait_phase(name, "Ready")


def condition(cluster: dict) -> dict:
    return cluster["status"]["conditions"][0]


def test_create_and_delete_cluster(start_gateway) -> None:
    gateway = start_gateway()
    cluster = create_cluster(gateway, "doomed")
    url = cluster["status"]["url"]
    assert cluster["status"]["instance"] == 1 and cluster["status"]["nodes"] == 0
    assert condition(cluster) | {"lastTransitionTime": ""} == {
        "type": "Ready",
        "status": "True",
        "reason": "Serving",
        "message": f"the control plane answers at {url}",
        "observedGeneration": 1,
        "lastTransitionTime": "",
    }
    assert cluster["metadata"]["finalizers"] == ["socialweb.computer/teardown"]
    tenant = gateway.tenant_kubeconfig("doomed")
    gateway.kubectl_with(tenant, "create", "configmap", "keep", "--from-literal=a=b")
    assert (
        gateway.state_dir / "clusters" / "doomed" / "pki" / "client-ca.key"
    ).stat().st_mode & 0o777 == 0o600

    gateway.kubectl("delete", "cluster", "doomed", "--timeout=20s")
    assert refuses(port_of(url))
    assert not (gateway.state_dir / "clusters" / "doomed").exists()
    assert gateway.kubectl("get", "clusters", "-o", "name").stdout == ""

    # A new cluster of the same name starts empty.
    create_cluster(gateway, "doomed")
    listed = gateway.kubectl_with(tenant, "get", "configmaps", "-o", "name").stdout
    assert "configmap/keep" not in listed


def test_status_is_written_only_by_the_gateway(start_gateway) -> None:
    gateway = start_gateway()
    body = CLUSTER.format(name="x") + "status:\n  phase: Ready\n  url: https://127.0.0.1:1\n"
    dry = json.loads(
        gateway.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=body).stdout
    )
    assert "status" not in dry
    gateway.kubectl("create", "-f", "-", input=body)
    cluster = gateway.wait_phase("x", "Ready")
    assert cluster["status"]["url"] != "https://127.0.0.1:1"
    patched = gateway.kubectl(
        "patch", "cluster", "x", "--type=merge", "-p", '{"status":{"phase":"Draining"}}', check=False
    )
    assert patched.returncode == 0  # accepted on the main resource, where status is ignored
    assert gateway.wait_phase("x", "Ready")["status"]["phase"] == "Ready"


def test_nodes_column_counts_tenant_nodes(start_gateway) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}]})
    gateway.wait_phase("ci", "Ready")
    tenant = gateway.tenant_kubeconfig("ci")
    gateway.kubectl_with(
        tenant, "apply", "-f", "-", input="apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n"
    )
    deadline = time.monotonic() + 10
    while gateway.kubectl("get", "cluster", "ci", "-o", "jsonpath={.status.nodes}").stdout != "1":
        assert time.monotonic() < deadline, "status.nodes did not follow the tenant's nodes"
        time.sleep(0.1)
    assert gateway.kubectl("get", "clusters", "--no-headers").stdout.split()[3] == "1"


def test_running_false_parks_and_keeps_data(start_gateway) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}]})
    url = gateway.wait_phase("ci", "Ready")["status"]["url"]
    tenant = gateway.tenant_kubeconfig("ci")
    gateway.kubectl_with(tenant, "create", "namespace", "kept")
    gateway.kubectl("patch", "cluster", "ci", "--type=merge", "-p", '{"spec":{"running":false}}')
    parked = gateway.wait_phase("ci", "Unavailable")
    assert condition(parked)["reason"] == "Parked" and condition(parked)["observedGeneration"] == 2
    assert parked["status"]["url"] == url and refuses(port_of(url))
    gateway.kubectl("patch", "cluster", "ci", "--type=merge", "-p", '{"spec":{"running":true}}')
    back = gateway.wait_phase("ci", "Ready")
    assert back["status"]["url"] == url and back["status"]["instance"] == 2
    assert gateway.kubectl_with(tenant, "get", "namespace", "kept", "-o", "name").stdout == "namespace/kept\n"


def test_kill_9_and_restart_bring_every_cluster_back(start_gateway, tmp_path: Path) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}, {"name": "other"}]})
    before = {name: gateway.wait_phase(name, "Ready")["status"]["url"] for name in ("ci", "other")}
    for name in before:
        gateway.kubectl_with(gateway.tenant_kubeconfig(name), "create", "configmap", f"of-{name}")
    credential = clusterprovider.mint_tenant_credential_for_cluster_as(
        state_dir=str(gateway.state_dir),
        cluster="ci",
        server=before["ci"],
        common_name="system:admin",
        organizations=["admins"],
        out_dir=str(tmp_path / "cred"),
    )
    gateway.kill()
    gateway.wait(10)

    again = start_gateway(None)
    for name, url in before.items():
        cluster = again.wait_phase(name, "Ready")
        assert cluster["status"]["url"] == url and cluster["status"]["instance"] == 2
        names = again.kubectl_with(again.tenant_kubeconfig(name), "get", "configmaps", "-o", "name").stdout
        assert f"configmap/of-{name}" in names
    # The same CAs: a credential minted before the crash still verifies the server and is accepted.
    context = ssl.create_default_context(cafile=credential.ca_crt)
    context.load_cert_chain(credential.tls_crt, credential.tls_key)
    with urllib.request.urlopen(f"{before['ci']}/version", context=context, timeout=5) as response:
        assert response.status == 200


def test_restart_reopens_ports_first_and_loads_control_planes_behind(start_gateway) -> None:
    """After a restart every serving Cluster is Ready again (a new instance) as soon as the
    gateway is ready; the control planes behind the ports load in the background
    or for the first request, and then run their controllers; a parked one stays closed."""
    clusters = [{"name": "a"}, {"name": "b"}, {"name": "parked", "running": False}]
    gateway = start_gateway({"clusters": clusters})
    urls = {name: gateway.wait_phase(name, "Ready")["status"]["url"] for name in ("a", "b")}
    gateway.wait_phase("parked", "Unavailable")
    gateway.stop()
    log_start = gateway.stderr_path.stat().st_size

    again = start_gateway(None)
    for name, url in urls.items():
        status = json.loads(again.kubectl("get", "cluster", name, "-o", "json").stdout)["status"]
        assert (status["phase"], status["url"], status["instance"]) == ("Ready", url, 2)
    assert json.loads(again.kubectl("get", "cluster", "parked", "-o", "json").stdout)["status"]["phase"] == (
        "Unavailable")
    tenant = again.tenant_kubeconfig("a")
    again.kubectl_with(tenant, "create", "deployment", "web", "--image=registry.invalid/web:1")
    deadline = time.monotonic() + 30
    while "replicaset" not in again.kubectl_with(tenant, "get", "replicasets", "-o", "name").stdout:
        assert time.monotonic() < deadline, "the reloaded control plane runs no Deployment controller"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while "control planes loaded" not in again.stderr_path.read_text()[log_start:]:
        assert time.monotonic() < deadline, again.logs()
        time.sleep(0.2)
    assert "Traceback" not in again.stderr_path.read_text()[log_start:]


def test_credential_is_refused_by_another_cluster(start_gateway, tmp_path: Path) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}, {"name": "other"}]})
    urls = {name: gateway.wait_phase(name, "Ready")["status"]["url"] for name in ("ci", "other")}
    credential = clusterprovider.mint_tenant_credential_for_cluster_as(
        state_dir=str(gateway.state_dir),
        cluster="ci",
        server=urls["ci"],
        common_name="gitlab-runner",
        organizations=["gitlab-runner"],
        out_dir=str(tmp_path / "cred"),
    )
    other_ca = gateway.state_dir / "clusters" / "other" / "pki" / "serving-ca.crt"
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "--cacert",
            str(other_ca),
            "--cert",
            credential.tls_crt,
            "--key",
            credential.tls_key,
            f"{urls['other']}/api/v1/namespaces",
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    status = json.loads(result.stdout)
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 401, "Unauthorized")
    # Against its own cluster the same files work (403 only for lack of RBAC, not 401).
    own = subprocess.run(
        [
            "curl",
            "-sS",
            "--cacert",
            credential.ca_crt,
            "--cert",
            credential.tls_crt,
            "--key",
            credential.tls_key,
            f"{urls['ci']}/api/v1/namespaces",
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert json.loads(own.stdout)["code"] == 403


def test_port_taken_makes_only_that_cluster_unavailable(start_gateway) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}, {"name": "other"}]})
    port = port_of(gateway.wait_phase("ci", "Ready")["status"]["url"])
    gateway.wait_phase("other", "Ready")
    gateway.stop()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        again = start_gateway(None)
        down = again.wait_phase("ci", "Unavailable")
        assert condition(down)["reason"] == "PortInUse"
        assert f"127.0.0.1:{port} is held by another process" in condition(down)["message"]
        again.wait_phase("other", "Ready")
        again.kubectl_with(again.tenant_kubeconfig("other"), "get", "namespaces")
    finally:
        squatter.close()
    assert again.wait_phase("ci", "Ready", timeout=90)["status"]["url"].endswith(f":{port}")


@pytest.fixture
def full_clusters_dir(tmp_path: Path):
    """state/clusters on a 1 MiB tmpfs, so a new cluster's files can hit ENOSPC for real."""
    clusters = tmp_path / "state" / "clusters"
    clusters.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(clusters)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield clusters
    finally:
        subprocess.run(["umount", "-l", str(clusters)], check=False)


def test_disk_full_makes_only_the_new_cluster_unavailable(start_gateway, full_clusters_dir: Path) -> None:
    gateway = start_gateway({"clusters": [{"name": "ci"}]})
    gateway.wait_phase("ci", "Ready")
    filler = full_clusters_dir / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    gateway.kubectl("apply", "-f", "-", input=CLUSTER.format(name="late"))
    down = gateway.wait_phase("late", "Unavailable")
    assert condition(down)["reason"] == "StateWriteFailed"
    assert "No space left on device" in condition(down)["message"]
    assert not [p for p in full_clusters_dir.iterdir() if p.name.startswith(".preparing")]
    gateway.kubectl_with(gateway.tenant_kubeconfig("ci"), "get", "namespaces")
    assert gateway.wait_phase("ci", "Ready")
    filler.unlink()
    assert gateway.wait_phase("late", "Ready", timeout=90)
