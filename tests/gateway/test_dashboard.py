"""The dashboard at the HTTP API's `/`, in headless Chromium, against a real gateway.

Two clusters, a node (fake kubelet, labelled by a bidder), a running and a pending pod:
the page must show each, say honestly that no bidder rents nodes, show no
credential, and show a cluster created afterwards without a reload. Screenshots are kept
under the test's tmp dir (the path is printed). The same with a real sandbox node started
by its bidder: tests/node/test_operator_view.py.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from socialweb_computer.testing import browser as browser_mod
from socialweb_computer.testing import fakenodes

HUGE = '{"spec":{"containers":[{"name":"huge","image":"busybox","resources":{"requests":{"cpu":"999"}}}]}}'
TOKEN = f"glrt-{uuid.uuid4().hex}"  # a Secret's content: never on the page
CLUSTER = "apiVersion: socialweb.computer/v1alpha1\nkind: Cluster\nmetadata: {name: fresh}\n"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def table_text(browser, table_id: str) -> str:
    return browser.find_element("id", table_id).text


def test_dashboard_in_chromium(start_gateway, tmp_path: Path) -> None:
    gw = start_gateway({"clusters": [{"name": "ci"}, {"name": "dev"}]})
    gw.wait_phase("ci", "Ready")
    gw.wait_phase("dev", "Ready")
    tenant = gw.tenant_kubeconfig("ci")
    with fakenodes.ThreadedFakeNodes(tenant, 1):
        gw.kubectl_with(tenant, "label", "node", "fake-node-0", "socialweb.computer/bidder=sandbox")
        gw.kubectl_with(tenant, "run", "small", "--image=busybox")
        gw.kubectl_with(tenant, "run", "huge", "--image=busybox", "--overrides", HUGE)
        gw.kubectl_with(tenant, "create", "secret", "generic", "runner-token",
                        f"--from-literal=token={TOKEN}")
        with browser_mod.headless_chromium(tmp_path) as browser:
            browser.get(f"{gw.api_url}/")
            wait_for("the pending pod", lambda: "default/huge" in table_text(browser, "pending"))
            wait_for("the running pod on its node", lambda: "default/small" in table_text(browser, "nodes"))
            shot = tmp_path / "dashboard.png"
            browser.save_screenshot(str(shot))
            print(f"dashboard screenshot: {shot}")
            # Usable on a laptop screen (the window is 1366x900): nothing needs a sideways scroll.
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")

            clusters = table_text(browser, "clusters")
            for name in ("ci", "dev"):
                assert f"{name} Ready https://127.0.0.1:" in clusters
            assert "1 Pending, 1 Running" in clusters
            nodes = table_text(browser, "nodes")
            assert "fake-node-0" in nodes and "sandbox" in nodes and "True" in nodes
            assert "32 vCPU, 128 GiB memory" in nodes
            pending = table_text(browser, "pending")
            assert "Insufficient cpu" in pending  # the scheduler's message: why it waits
            capacity = browser.find_element("id", "capacity").text
            assert "bidder: none" in capacity and "no node is rented" in capacity and "vcpu: 0 of" in capacity
            events = table_text(browser, "events")
            assert "FailedScheduling" in events and "Scheduled" in events
            wait_for("the live stream", lambda: browser.find_element("id", "live").text == "live")

            page = browser.page_source
            assert "kubeconfig" not in page.lower() and "PRIVATE KEY" not in page
            for secret in browser_mod.secret_lines(gw.state_dir):
                assert secret not in page
            assert TOKEN not in page and base64.b64encode(TOKEN.encode()).decode() not in page

            # A change appears without a reload: the marker set on this page load survives.
            browser.execute_script("window.__sameLoad = 'yes';")
            gw.kubectl("apply", "-f", "-", input=CLUSTER)
            wait_for("the new cluster, live", lambda: "fresh Ready" in table_text(browser, "clusters"))
            assert browser.execute_script("return window.__sameLoad") == "yes"
            shot = tmp_path / "dashboard-after-create.png"
            browser.save_screenshot(str(shot))
            print(f"dashboard screenshot: {shot}")
            # Everything the page loaded came from the gateway itself.
            origins = browser.execute_script(
                "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
            assert set(origins) <= {gw.api_url}


def test_overview_and_status_agree(start_gateway, tmp_path: Path) -> None:
    import subprocess

    from socialweb_computer.testing import gateway as gateway_mod

    gw = start_gateway({"clusters": [{"name": "ci"}]})
    gw.wait_phase("ci", "Ready")
    with urllib.request.urlopen(f"{gw.api_url}/api/overview", timeout=10) as response:
        overview = json.loads(response.read())
    assert [c["name"] for c in overview["clusters"]] == ["ci"]
    assert overview["capacity"]["bidder"] == "none" and overview["capacity"]["nodes"] == []
    assert overview["store"]["backend"] == "sqlite"
    status = subprocess.run(
        [*gateway_mod.DEFAULT_COMMAND, "status", "--state-dir", str(gw.state_dir), "-o", "json"],
        capture_output=True, text=True, timeout=30, check=True)
    document = json.loads(status.stdout)
    assert [(c["name"], c["phase"], c["url"]) for c in document["clusters"]] == [
        (c["name"], c["phase"], c["url"]) for c in overview["clusters"]]
    text = subprocess.run([*gateway_mod.DEFAULT_COMMAND, "status", "--api", gw.api_url],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    assert "CLUSTERS" in text and "bidder: none (capacity.bidder in the gateway spec)" in text
    assert f"ci     Ready   {overview['clusters'][0]['url']}" in text
    refused = subprocess.run([*gateway_mod.DEFAULT_COMMAND, "status", "--state-dir", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "gateway.json" in refused.stderr and "Traceback" not in refused.stderr
