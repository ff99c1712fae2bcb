"""A gateway killed with microVMs running: they run on until its restart, which stops them.

It kills the gateway of the run's shared microVM node (tests/guest/conftest.py), and so ends that
node: the module's name sorts after every other module that uses it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import nodes

from .conftest import wait
from .test_microvm import qemu_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # the first boot may happen here


def test_a_gateway_killed_with_vms_running_leaves_no_qemu_after_its_restart(
    microvm_gateway: gateway_mod.GatewayProcess,
    microvm_node: base.NodeHandle,
    microvm_state_dir: Path,
    microvm_before: nodes.HostSnapshot,
) -> None:
    gateway, rented, state_dir, before = microvm_gateway, microvm_node, microvm_state_dir, microvm_before
    assert qemu_processes(str(rented.directory)), "the rented node runs"
    gateway.kill(signal.SIGKILL)
    gateway.wait(timeout=30)
    time.sleep(2)
    assert qemu_processes(str(rented.directory)), "a killed gateway's VMs run on until its next start"
    restarted = gateway.restart(timeout=120)
    try:
        wait(lambda: not qemu_processes(str(rented.directory)), "the restarted gateway to stop the VM", 120)
        assert not rented.directory.exists()
    finally:
        restarted.stop()
    # What a microVM node has on the host is its processes (QEMU, its supervisor, slirp4netns) and
    # its directory: its network and mount namespaces have no name and die with QEMU, and it makes
    # no host link, mount or cgroup (host-wide, those belong to whatever else runs on the machine).
    assert nodes.HostSnapshot.take(str(state_dir)).processes == before.processes
    assert sorted(p.name for p in base.nodes_dir(state_dir).iterdir()) == []
