"""The capacity controller's plug-in point (gateway/capacityview.py), with a provider registered.

The gateway registers its own capacity controller at start (tests/capacity/ drive it with
real nodes); here `testing.capacity.FakeCapacity` takes its place with fixed values, so
every field of the view can be checked. The gateway runs in this process so the provider
can be registered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from socialweb_computer.gateway import runtime
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.testing import browser as browser_mod
from socialweb_computer.testing import capacity as fake
from socialweb_computer.testing import gateway as gateway_mod

SNAPSHOT = fake.Snapshot(
    budget=(fake.Budget("vcpu", "vCPU", 6, 8), fake.Budget("memory", "MiB", 6144, 16384)),
    nodes=(fake.RentedNode("ci-node-1", "ci", "qemu", "Ready", 2, 2048, "guest-4f2a", "2026-01-01T00:00:00Z",
                           "pod default/build-1 was pending"),
           fake.RentedNode("warm-1", "", "qemu", "Warm", 2, 2048, "guest-4f2a", "2026-01-01T00:00:00Z", "")),
    warm_pool_target=2,
    decisions=(fake.Decision("2026-01-01T00:00:00Z", "ci", "rented", "pod default/build-1 needs a node"),),
)


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def test_a_registered_provider_shows_everywhere(tmp_path: Path) -> None:
    spec = spec_mod.parse(gateway_mod.with_free_ports({"clusters": [{"name": "ci"}]}))
    gateway = runtime.Gateway(str(tmp_path / "state"), spec)
    await gateway.start()
    try:
        before = await gateway.overview()
        assert before["capacity"]["nodes"] == [] and before["capacity"]["decisions"] == []  # its own, idle
        version = gateway.changes.version
        provider = fake.FakeCapacity(SNAPSHOT)
        provider.rentals["rented"] = 3
        gateway.register_capacity(provider)
        assert gateway.changes.version > version  # the live dashboard hears of it

        overview = await gateway.overview()
        capacity = overview["capacity"]
        assert capacity["warmPool"] == {"size": 1, "target": 2}
        assert capacity["budget"][0] == {"resource": "vcpu", "unit": "vCPU", "used": 6, "total": 8, "free": 2}
        assert [n["name"] for n in capacity["nodes"]] == ["ci-node-1", "warm-1"]
        assert capacity["decisions"][0]["outcome"] == "rented"

        text = await _get(f"{gateway.api_url}/metrics")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("socialweb_capacity_controller_registered", ())] == 1
        assert samples[("socialweb_warm_pool_nodes", ())] == 1
        assert samples[("socialweb_rented_nodes", (("bidder", "qemu"), ("state", "Ready")))] == 1
        assert samples[("socialweb_host_budget_free", (("resource", "vcpu"), ("unit", "vCPU")))] == 2
        assert samples[("socialweb_host_budget_used", (("resource", "memory"), ("unit", "MiB")))] == 6144
        assert samples[("socialweb_rental_decisions_total", (("outcome", "rented"),))] == 3

        def look() -> str:
            with browser_mod.headless_chromium(tmp_path) as browser:
                browser.get(f"{gateway.api_url}/")
                for _ in range(100):
                    panel = browser.find_element("id", "capacity").text
                    if "warm pool" in panel:
                        break
                    time.sleep(0.1)
                shot = tmp_path / "dashboard-capacity.png"
                browser.save_screenshot(str(shot))
                print(f"dashboard screenshot: {shot}")
                return browser.find_element("id", "capacity").text

        panel = await asyncio.to_thread(look)
        assert "vcpu: 6 of 8 vCPU used, 2 free" in panel
        assert "warm pool: 1 of 2" in panel
        assert "ci-node-1" in panel and "(warm)" in panel and "pod default/build-1 was pending" in panel

        gateway.register_capacity(None)
        assert (await gateway.overview())["capacity"] is None
    finally:
        await gateway.close()
