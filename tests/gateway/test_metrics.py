"""A tenant's `/metrics`: kube-apiserver's metrics (upstream names) under that tenant's RBAC.

Scraped as Prometheus would, with kubectl and a credential, after a real kubectl workload,
and parsed with prometheus_client's parser.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing.metrics import Samples, label_values, parse, value


def scrape_tenant(gw: gateway_mod.GatewayProcess, kubeconfig: Path) -> Samples:
    return parse(gw.kubectl_with(kubeconfig, "get", "--raw", "/metrics").stdout)


def mint(gw: gateway_mod.GatewayProcess, tmp_path: Path, user: str, groups: Iterable[str]) -> Path:
    out = tmp_path / user
    subprocess.run(
        [*gateway_mod.DEFAULT_COMMAND, "credential", "mint", "--state-dir", str(gw.state_dir),
         "--cluster", "ci", "--user", user, *[a for g in groups for a in ("--group", g)],
         "--out-dir", str(out), "--kubeconfig", str(out / "kubeconfig")],
        check=True, capture_output=True, text=True, timeout=60)
    return out / "kubeconfig"


def test_tenant_metrics_count_a_kubectl_workload(start_gateway, tmp_path: Path) -> None:
    gw = start_gateway({"clusters": [{"name": "ci"}, {"name": "other"}]})
    gw.wait_phase("ci", "Ready")
    admin = gw.tenant_kubeconfig("ci")
    before = scrape_tenant(gw, admin)

    gw.kubectl_with(admin, "create", "namespace", "metrics")
    for name in ("a", "b", "c"):
        gw.kubectl_with(admin, "create", "configmap", name, "-n", "metrics", "--from-literal=k=v")
    gw.kubectl_with(admin, "create", "configmap", "dry", "-n", "metrics", "--dry-run=server")
    gw.kubectl_with(admin, "get", "configmaps", "-n", "metrics")
    gw.kubectl_with(admin, "get", "configmap", "a", "-n", "metrics")
    gw.kubectl_with(admin, "delete", "configmap", "b", "-n", "metrics", "--wait=false")
    gw.kubectl_with(admin, "apply", "--server-side", "-n", "metrics", "-f", "-",
                    input="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {k: v}\n")
    missing = gw.kubectl_with(admin, "get", "configmap", "nope", "-n", "metrics", check=False)
    assert missing.returncode != 0
    watcher = subprocess.Popen(
        [str(gw.tool_env()["PATH"].split(":")[0]) + "/kubectl", f"--kubeconfig={admin}", "get", "configmaps",
         "-n", "metrics", "-w"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            during = scrape_tenant(gw, admin)
            if value(during, "apiserver_longrunning_requests", verb="WATCH", resource="configmaps") == 1:
                break
            assert time.monotonic() < deadline, "the open watch never showed as long-running"
            time.sleep(0.2)
    finally:
        watcher.terminate()
        watcher.wait(10)
    after = scrape_tenant(gw, admin)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    cm = {"resource": "configmaps", "group": "", "version": "v1", "component": "apiserver"}
    assert moved("apiserver_request_total", verb="POST", code="201", dry_run="", scope="resource", **cm) == 3
    assert moved("apiserver_request_total", verb="POST", dry_run="All", code="201", **cm) == 1
    assert moved("apiserver_request_total", verb="LIST", scope="namespace", code="200", **cm) >= 1
    assert moved("apiserver_request_total", verb="GET", scope="resource", code="200", **cm) >= 1
    assert moved("apiserver_request_total", verb="GET", code="404", **cm) >= 1
    assert moved("apiserver_request_total", verb="DELETE", code="200", **cm) == 1
    assert moved("apiserver_request_total", verb="APPLY", **cm) == 1
    assert moved("apiserver_request_total", verb="POST", resource="namespaces", code="201") == 1
    assert moved("apiserver_request_duration_seconds_count", verb="POST", dry_run="", **cm) == 3
    posts = value(after, "apiserver_request_duration_seconds_count", verb="POST", dry_run="", **cm)
    assert value(after, "apiserver_request_duration_seconds_bucket", verb="POST", dry_run="", le="+Inf",
                 **cm) == posts
    stored = gw.kubectl_with(admin, "get", "configmaps", "-A", "-o", "name").stdout.split()
    assert value(after, "apiserver_storage_objects", resource="configmaps") == len(stored)
    assert {"configmap/a", "configmap/c", "configmap/applied"} <= set(stored)
    assert value(after, "apiserver_storage_objects", resource="namespaces") >= 5
    assert value(after, "apiserver_current_inflight_requests", request_kind="readOnly") >= 1  # the scrape
    assert value(after, "apiserver_current_inflight_requests", request_kind="mutating") == 0
    # Bounded labels: a path the cluster does not serve is not a label value.
    gw.kubectl_with(admin, "get", "--raw", "/api/v1/made-up-resource-4711", check=False)
    final = scrape_tenant(gw, admin)
    assert not any("made-up" in v for v in label_values(final, "apiserver_request_total", "resource"))
    # The other tenant's requests are its own.
    other = scrape_tenant(gw, gw.tenant_kubeconfig("other"))
    assert value(other, "apiserver_request_total", resource="configmaps") == 0


def test_tenant_metrics_are_under_rbac(start_gateway, tmp_path: Path) -> None:
    gw = start_gateway({"clusters": [{"name": "ci"}]})
    gw.wait_phase("ci", "Ready")
    runner = mint(gw, tmp_path, "gitlab-runner", ["gitlab-runner"])
    refused = gw.kubectl_with(runner, "get", "--raw", "/metrics", check=False)
    assert refused.returncode != 0
    assert 'User "gitlab-runner" cannot get path "/metrics"' in refused.stderr
    monitoring = mint(gw, tmp_path, "prometheus", ["system:monitoring"])
    samples = parse(gw.kubectl_with(monitoring, "get", "--raw", "/metrics").stdout)
    assert value(samples, "apiserver_request_total", code="403") >= 1  # the refused scrape, counted
