"""The operator's view of a host with a real node: dashboard (headless Chromium), `status`, `/metrics`.

A gateway with two clusters; a sandbox node started for `ci` through its bidder by hand (what
the capacity controller calls; the gateway's own runs with no bidder here, and says so);
in `ci` a pod running on the node, a pod no node can take (it waits for the scheduler)
and a pod whose image does not exist (it waits on the node). Each of the three readers
must show the node (bidder, size, image, what runs there), both waiting pods with why they
wait, and the node's boot time; the page follows changes without a reload. Screenshots
are kept under the test's tmp dir (the paths are printed). Nothing of the node is left on
the host afterwards, and the gateway logged no traceback.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.bidders import sandbox
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import browser as browser_mod
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes
from socialweb_computer.testing.metrics import Samples, parse, value

from .conftest import Tenant

SIZE = node_config.Size(vcpu=2, mem_mib=2048, rootfs_mib=4096)
SIZE_TEXT = "2 vCPU, 2 GiB memory, 4 GiB disk"
CLUSTER = "apiVersion: socialweb.computer/v1alpha1\nkind: Cluster\nmetadata: {name: fresh}\n"


@pytest.fixture
def operator_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    # A short state directory: a node's unix sockets live under it (AF_UNIX paths are short).
    state = tmp_path_factory.mktemp("view") / "state"
    with gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "ci"}, {"name": "dev"}]},
                                          timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        gw.wait_phase("dev", "Ready", timeout=60)
        yield gw
    tracebacks = testing.logged_tracebacks(gw)
    assert not tracebacks, f"the gateway logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the thing waited for may not exist yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def scrape_host(gw: gateway_mod.GatewayProcess) -> Samples:
    with urllib.request.urlopen(f"{gw.api_url}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def status(gw: gateway_mod.GatewayProcess, *args: str) -> str:
    return subprocess.run([*gateway_mod.DEFAULT_COMMAND, "status", "--state-dir", str(gw.state_dir), *args],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def text_of(browser: Any, element_id: str) -> str:
    return browser.find_element("id", element_id).text


def test_the_operator_sees_a_real_node_its_pods_and_what_waits(
    operator_gateway: gateway_mod.GatewayProcess, registry: images.Registry, image: str, tmp_path: Path
) -> None:
    gw = operator_gateway
    tenant = Tenant(gw, "ci")
    marker = str(gw.state_dir)
    before = nodes.HostSnapshot.take(marker)
    name = ""
    try:
        with nodes.sandbox_node(gw.state_dir, "ci", host_ports=[registry.port], size=SIZE) as node:
            name = node.name
            _with_a_node(gw, tenant, node.name, registry, image, tmp_path)
    finally:
        assert nodes.HostSnapshot.take(marker).left_by_node(before, name) == {}


def _with_a_node(gw: gateway_mod.GatewayProcess, tenant: Tenant, node: str, registry: images.Registry,
                 image: str, tmp_path: Path) -> None:
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    wait_for(f"node {node} Ready", lambda: tenant.kubectl("get", "node", node, "-o", ready).stdout == "True")
    # The image the bidder labels its node with (a sandbox node: the host's), else the OS the node reports.
    os_image = (tenant.kubectl("get", "node", node, "-o",
                               r"jsonpath={.metadata.labels.socialweb\.computer/image}").stdout
                or tenant.kubectl("get", "node", node, "-o", "jsonpath={.status.nodeInfo.osImage}").stdout)
    ns = tenant.namespace()
    requests = {"requests": {"cpu": "999"}}
    huge = json.dumps({"spec": {"containers": [{"name": "huge", "image": image, "resources": requests}]}})
    tenant.kubectl("run", "web", "-n", ns, f"--image={image}", "--restart=Never", "--", "sleep", "3600")
    tenant.kubectl("run", "huge", "-n", ns, f"--image={image}", "--restart=Never", "--overrides", huge)
    tenant.kubectl("run", "missing", "-n", ns, f"--image={registry.host}/test/no-such-image:1",
                   "--restart=Never")
    tenant.wait_phase("web", ns, ("Running",))

    # /metrics: the node by its bidder, the pods, both waiting, and the node's boot timed.
    def counted() -> Samples | None:
        s = scrape_host(gw)
        seen = (value(s, "socialweb_nodes", bidder="sandbox", state="Ready"),
                value(s, "socialweb_pending_pods"), value(s, "socialweb_pods", phase="Running"))
        return s if seen == (1, 2, 1) else None

    samples = wait_for("the node and both waiting pods in /metrics", counted)
    boot = "socialweb_node_boot_duration_seconds"
    assert value(samples, f"{boot}_count", bidder="sandbox") == 1
    assert 0 < value(samples, f"{boot}_sum", bidder="sandbox") < sandbox.START_TIMEOUT
    assert value(samples, f"{boot}_bucket", bidder="sandbox", le="+Inf") == 1
    assert value(samples, "socialweb_pending_pod_oldest_age_seconds") >= 0
    assert value(samples, "socialweb_clusters", phase="Ready") == 2

    # status -o json and the text tables.
    def pull_failed() -> dict[str, Any] | None:
        d = json.loads(status(gw, "-o", "json"))
        return d if any("ImagePull" in p["reason"] for p in d["pending"]) else None

    document = wait_for("the missing image's reason in status", pull_failed)
    (row,) = document["nodes"]
    assert (row["cluster"], row["name"], row["ready"], row["bidder"]) == ("ci", node, "True", "sandbox")
    assert row["size"] == SIZE_TEXT and row["sizeLabel"] == "2cpu-2048mi-4096mi"
    assert row["image"] == os_image and os_image
    assert sorted(row["pods"]) == [f"{ns}/missing", f"{ns}/web"]
    waiting = {p["name"]: p for p in document["pending"]}
    assert set(waiting) == {"huge", "missing"}
    assert "Insufficient cpu" in waiting["huge"]["reason"] and waiting["huge"]["node"] == ""
    assert waiting["missing"]["node"] == node
    assert f"(container missing on {node})" in waiting["missing"]["reason"]
    clusters = {c["name"]: c for c in document["clusters"]}
    assert clusters["ci"]["nodes"] == 1 and clusters["ci"]["pods"] == {"Pending": 2, "Running": 1}
    assert clusters["dev"]["nodes"] == 0 and clusters["dev"]["pods"] == {}
    text = status(gw)
    node_line = next(line for line in text.splitlines() if line.startswith("ci") and node in line)
    assert "sandbox" in node_line and SIZE_TEXT in node_line and os_image in node_line
    assert "Insufficient cpu" in text and f"{ns}/missing" in text

    # The dashboard, in Chromium.
    with browser_mod.headless_chromium(tmp_path) as browser:
        browser.get(f"{gw.api_url}/")
        wait_for("the node on the page", lambda: node in text_of(browser, "nodes"), 20)
        wait_for("both waiting pods on the page", lambda: f"{ns}/huge" in text_of(browser, "pending")
                 and f"{ns}/missing" in text_of(browser, "pending"), 20)
        wait_for("the live stream", lambda: text_of(browser, "live") == "live", 20)
        shot = tmp_path / "dashboard-with-a-node.png"
        browser.save_screenshot(str(shot))
        print(f"dashboard screenshot: {shot}")
        nodes_text = text_of(browser, "nodes")
        for shown in ("sandbox", SIZE_TEXT, os_image, f"{ns}/web", f"{ns}/missing"):
            assert shown in nodes_text, (shown, nodes_text)
        pending = text_of(browser, "pending")
        assert "Insufficient cpu" in pending and f"container missing on {node}" in pending
        clusters_text = text_of(browser, "clusters")
        assert "2 Pending, 1 Running" in clusters_text and "dev Ready" in clusters_text
        assert "1/1" in text_of(browser, "summary")
        # The gateway's own capacity controller runs with no bidder: it rents nothing, and says so.
        assert "bidder: none" in text_of(browser, "capacity")
        page = browser.page_source
        assert "PRIVATE KEY" not in page and "kubeconfig" not in page.lower()
        for secret in browser_mod.secret_lines(gw.state_dir):
            assert secret not in page

        # Changes appear without a reload: a pod gone from the node, a cluster created.
        browser.execute_script("window.__sameLoad = 'yes';")
        tenant.kubectl("delete", "pod", "web", "-n", ns, "--grace-period=1")
        wait_for("the deleted pod gone from its node",
                 lambda: f"{ns}/web" not in text_of(browser, "nodes"), 30)
        gw.kubectl("apply", "-f", "-", input=CLUSTER)
        wait_for("the new cluster, live", lambda: "fresh Ready" in text_of(browser, "clusters"), 30)
        assert browser.execute_script("return window.__sameLoad") == "yes"
        shot = tmp_path / "dashboard-after-changes.png"
        browser.save_screenshot(str(shot))
        print(f"dashboard screenshot: {shot}")
    tenant.kubectl("delete", "namespace", ns, "--wait=false")
