"""The gateway with `workers: 2`: tenants served by worker processes, with kubectl.

Clients cannot tell (same ports, CAs, URLs, gateway.json, watches); a worker killed with
SIGKILL is started again and its tenants come back with their objects; the gateway killed with
SIGKILL leaves no worker behind; a restart with another number of workers serves the same
clusters. The seed's own commands with 2 workers are test_seed_steps.py (workers=2).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from socialweb_computer.gateway import workers
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import server as server_mod

pytestmark = pytest.mark.both_storages

# One cluster on each worker, whatever the hash: found once, checked below.
NAMES = ("ci", "t2")


def lanes_differ() -> None:
    assert {workers.lane_of(name, 2) for name in NAMES} == {0, 1}


def worker_pids(parent: int) -> list[int]:
    """Processes whose parent is `parent` and that run a gateway worker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"gateway-worker" in cmdline:
            found.append(int(entry))
    return sorted(found)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s")
        time.sleep(0.2)


def overview(gateway) -> str:
    with urllib.request.urlopen(f"{gateway.api_url}/api/overview", timeout=5) as response:
        return response.read().decode()


def instance(gateway, name: str) -> int:
    return int(gateway.kubectl("get", "cluster", name, "-o", "jsonpath={.status.instance}").stdout)


def two_workers(start_gateway):
    lanes_differ()
    gateway = start_gateway({"workers": 2, "clusters": [{"name": name} for name in NAMES]})
    for name in NAMES:
        gateway.wait_phase(name, "Ready")
    return gateway


def test_two_workers_serve_tenants_as_one_process_does(start_gateway) -> None:
    gateway = two_workers(start_gateway)
    pids = worker_pids(gateway.pid)
    assert len(pids) == 2
    config = gateway.config()
    assert config["pid"] == gateway.pid and config["ready"] is True
    low, high = map(int, config["listen"]["clusterPorts"].split("-"))
    for name in NAMES:
        kubeconfig = gateway.tenant_kubeconfig(name)
        url = gateway.cluster_url(name)
        assert low <= int(url.rsplit(":", 1)[1]) <= high
        # A watch from kubectl hears a write made through another connection.
        watch = subprocess.Popen(
            [str(server_mod.TOOLS_BIN / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "configmaps", "-w",
             "-o", "name", "--request-timeout=60s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gateway.tool_env())
        try:
            assert watch.stdout is not None
            assert watch.stdout.readline().strip() == "configmap/kube-root-ca.crt"
            gateway.kubectl_with(kubeconfig, "create", "configmap", f"from-{name}", "--from-literal=a=b")
            assert watch.stdout.readline().strip() == f"configmap/from-{name}"
        finally:
            watch.kill()
            watch.communicate()
        assert gateway.kubectl_with(kubeconfig, "get", "configmap", f"from-{name}", "-o",
                                    "jsonpath={.data.a}").stdout == "b"
    # Each tenant sees only its own objects, though both processes write one store.
    other = gateway.kubectl_with(gateway.tenant_kubeconfig(NAMES[0]), "get", "configmap", f"from-{NAMES[1]}",
                                 check=False)
    assert other.returncode != 0 and "NotFound" in other.stderr
    # The operator's view reaches across: a tenant's pending pod is seen from the gateway's HTTP API.
    gateway.kubectl_with(gateway.tenant_kubeconfig(NAMES[1]), "run", "waiting-pod", "--image=busybox",
                         "--restart=Never")
    wait_for("the pending pod in /api/overview", lambda: "waiting-pod" in overview(gateway))


def test_a_killed_worker_comes_back_with_its_tenants(start_gateway) -> None:
    gateway = two_workers(start_gateway)
    name = NAMES[0]
    kubeconfig = gateway.tenant_kubeconfig(name)
    gateway.kubectl_with(kubeconfig, "create", "configmap", "kept", "--from-literal=a=b")
    before = instance(gateway, name)
    pids = worker_pids(gateway.pid)
    # Kill both in turn: whichever served `name`, it comes back; the other tenant too.
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for("both workers started again",
             lambda: len(worker_pids(gateway.pid)) == 2 and not set(worker_pids(gateway.pid)) & set(pids))
    wait_for("the cluster's instance moved", lambda: instance(gateway, name) > before)
    for cluster in NAMES:
        gateway.wait_phase(cluster, "Ready", timeout=60)
    assert gateway.kubectl_with(kubeconfig, "get", "configmap", "kept", "-o",
                                "jsonpath={.data.a}").stdout == "b"
    assert "exited with status -9; starting it again" in gateway.logs()


def test_killing_the_gateway_leaves_no_worker(start_gateway) -> None:
    gateway = two_workers(start_gateway)
    pids = worker_pids(gateway.pid)
    assert len(pids) == 2
    gateway.kill(signal.SIGKILL)
    wait_for("every worker gone", lambda: not any(running(pid) for pid in pids), timeout=30)


def test_a_stopped_gateway_stops_its_workers_and_restarts_with_another_count(start_gateway) -> None:
    gateway = two_workers(start_gateway)
    for name in NAMES:
        gateway.kubectl_with(gateway.tenant_kubeconfig(name), "create", "configmap", "kept")
    pids = worker_pids(gateway.pid)
    urls = {name: gateway.cluster_url(name) for name in NAMES}
    assert gateway.stop() == 0
    assert not any(running(pid) for pid in pids)
    # The same state directory with one process: every cluster is where it was, with its objects.
    spec = yaml.safe_load(gateway.spec_path.read_text())
    spec["workers"] = 1
    again = start_gateway(spec, timeout=120)
    assert worker_pids(again.pid) == []
    for name in NAMES:
        again.wait_phase(name, "Ready")
        assert again.cluster_url(name) == urls[name]
        assert again.kubectl_with(again.tenant_kubeconfig(name), "get", "configmap", "kept", "-o",
                                  "name").stdout == "configmap/kept\n"


def test_workers_in_the_spec_are_checked(tmp_path: Path) -> None:
    from socialweb_computer.gateway import spec as spec_mod

    assert spec_mod.parse({"workers": "auto"}).workers == 0
    assert spec_mod.parse({"workers": 3}).workers == 3
    assert spec_mod.parse({}).workers == spec_mod.DEFAULT_WORKERS
    for bad in ("two", -1, 1.5, True, 65):
        with pytest.raises(spec_mod.SpecError, match="workers: expected auto"):
            spec_mod.parse({"workers": bad})
    assert workers.resolve_count(0) == max(1, os.cpu_count() or 1)
    assert workers.resolve_count(3) == 3
    # The flag says what was wrong, exits 1 and starts nothing.
    for bad, said in (("many", "expected auto or a number, got 'many'"), ("65", "from 1 to 64, got 65")):
        result = subprocess.run([*gateway_mod.DEFAULT_COMMAND, "gateway", "--state-dir", str(tmp_path / "s"),
                                 "--workers", bad], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and said in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / "s").exists()
