"""Capacity on the QEMU bidder: a zero-node cluster rents a microVM node for a GitLab Runner
job (the executor's sequence of calls, `testing/gitlab_runner.py`, a test double of GitLab
Runner 18.x: the binary cannot be obtained here), the node runs it, and after the hold it is
released; repeated, nothing is left on the host.

Everything is real: the gateway process with `capacity.bidder: qemu`, the run's guest image (the
session's, shared through `images`), QEMU under TCG, kubectl. Slow: each boot under TCG takes a
minute or more. `SOCIALWEB_CAPACITY_QEMU_CYCLES` (default 1) runs more rent/release cycles,
such as the issue's ten.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.guest import store as image_store
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import gitlab_runner as gr
from socialweb_computer.testing import images, nodes

from .conftest import TEST_SIZE, share_images, wait

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # the agent binary and image may be built here


def test_a_gitlab_runner_job_rents_a_microvm_node_and_the_hold_releases_it(
    tmp_path_factory: pytest.TempPathFactory,
    image_root: Path,
    guest_image: image_store.Image,
    agent_binary: Path,
    registry: images.Registry,
) -> None:
    state = Path(tmp_path_factory.mktemp("capacity-microvm")) / "state"
    share_images(state, image_root)
    before = nodes.HostSnapshot.take(str(state))
    spec = {
        "capacity": {"bidder": "qemu", "hostBudget": {"vcpu": 4, "memMiB": 4096, "diskMiB": 16384}},
        "nodeDefaults": {
            "vcpu": TEST_SIZE["vcpu"],
            "memMiB": TEST_SIZE["mem_mib"],
            "rootfsMiB": TEST_SIZE["rootfs_mib"],
            "releaseAfterSeconds": 30,  # long enough to see the node after the job, short for the suite
        },
        "registries": [{"host": registry.host}],
        "clusters": [{"name": "ci"}],
    }
    cycles = int(os.environ.get("SOCIALWEB_CAPACITY_QEMU_CYCLES", "1"))
    image = f"{registry.host}/test/busybox:1"
    with gateway_mod.GatewayProcess.start(
        state, spec, timeout=60, env={"SOCIALWEB_NODE_AGENT_BINARY": str(agent_binary)}
    ) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        tenant = gw.tenant_kubeconfig("ci")

        def kubectl(*args: str, check: bool = True) -> str:
            return gw.kubectl_with(tenant, *args, check=check, timeout=120).stdout

        helper = registry.push(gr.helper_image(), "test/gitlab-runner-helper:1")
        # GitLab Runner's 180 s poll_timeout is for a boot at KVM's speed; under TCG a microVM
        # takes minutes to join, so this runner waits longer (02 says to raise it on such hosts).
        runner = gr.for_cluster(gw, "ci", image, helper, state.parent / "runner", poll_timeout=900)
        try:
            for i in range(cycles):
                result = runner.run(gr.Job(image=image, script=f"echo job {i} in $(uname -r)", job_id=i))
                assert result.status == "success", (result.message, result.log)
                assert f"job {i} in {guest_image.manifest['kernelVersion']}" in result.log
                _check_rented_and_released(kubectl, state, guest_image, result.pod)
        finally:
            runner.close()
        assert gw.kubectl("get", "cluster", "ci", "-o", "jsonpath={.status.nodes}").stdout == "0"
    assert not base.read_records(state, "qemu")
    assert [p for p in nodes.HostSnapshot.take(str(state)).processes if "qemu-system" in p] == []
    left = nodes.HostSnapshot.take(str(state)).differences(before)
    assert "processes" not in left and "mounts" not in left, left


def _check_rented_and_released(
    kubectl: Callable[..., str], state: Path, guest_image: image_store.Image, pod: str
) -> None:
    """The job's node was a microVM capacity rented for its pod; after the hold it is gone."""
    [node] = kubectl("get", "nodes", "-o", "name").split()
    labels = kubectl("get", node, "-o", "jsonpath={.metadata.labels}")
    assert '"socialweb.computer/bidder":"qemu"' in labels
    assert f'"socialweb.computer/image":"{guest_image.fingerprint[:39]}"' in labels
    assert '"socialweb.computer/managed-by":"capacity"' in labels
    events = kubectl("get", "events", "-n", "gitlab-runner", "--field-selector", f"involvedObject.name={pod}")
    assert "TriggeredScaleUp" in events and "qemu-2cpu-1024mi-1024mi 0->1" in events
    wait(
        lambda: kubectl("get", "nodes", "-o", "name") == "" and not base.read_records(state, "qemu"),
        "the microVM node released",
        300,
    )
