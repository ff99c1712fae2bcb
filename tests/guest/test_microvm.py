"""MicroVM nodes end to end: real QEMU guests booted from a real image, against a real gateway.

One image per run (the session's `guest_image`), two nodes here:
- the run's shared node (`microvm_node`, tests/guest/conftest.py), rented "by the gateway" (the
  bidder records the gateway's pid as its owner, as the capacity controller will), configured
  from a gateway spec's registries: it registers Ready with its size, runs pods from registries
  on the host's loopback (one through a mirror, one with the node's own credentials), serves
  their logs and an exec through the tenant apiserver (test_microvm_restart.py ends it);
- a node started with `node start --bidder qemu` from an image with a different memMiB and a
  deliberately tiny root filesystem: a new fingerprint, built; a pod whose image does not fit
  never starts, with `no space left on device`; `kill -9` of its QEMU makes it NotReady (after
  the node monitor's grace period, 40 s).

Nodes are held to the Node authorizer and NodeRestriction, with no extra RBAC.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import store as image_store
from socialweb_computer.hostcheck import context as check_context
from socialweb_computer.hostcheck import kvm
from socialweb_computer.node import oci
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes

from .conftest import MISSING_HOST, wait

# The first test's setup builds the agent binary and the run's image, and each boot under TCG on
# a busy 2-core machine takes minutes: far beyond the suite's default per-test timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def kubectl(gw: gateway_mod.GatewayProcess, *args: str, check: bool = True, timeout: float = 60) -> str:
    return gw.kubectl_with(gw.tenant_kubeconfig("ci"), *args, check=check, timeout=timeout).stdout


def ready(gw: gateway_mod.GatewayProcess, node: str) -> str:
    return kubectl(
        gw, "get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
    )


def qemu_processes(marker: str) -> list[str]:
    return [p for p in nodes.HostSnapshot.take(marker).processes if "qemu-system" in p]


def phase(gw: gateway_mod.GatewayProcess, name: str, ns: str) -> str:
    return json.loads(kubectl(gw, "get", "pod", name, "-n", ns, "-o", "json"))["status"].get("phase", "")


def test_a_microvm_node_registers_ready_with_its_size_and_runs_pods_from_loopback_registries(
    microvm_gateway: gateway_mod.GatewayProcess,
    microvm_node: base.NodeHandle,
    private_registry: images.Registry,
    guest_image: image_store.Image,
) -> None:
    gateway, rented = microvm_gateway, microvm_node  # the run's shared ones (conftest.py)
    wait(lambda: ready(gateway, rented.name) == "True", f"node {rented.name} Ready", timeout=60)
    wide = kubectl(
        gateway,
        "get",
        "node",
        rented.name,
        "-o",
        "wide",
        "-L",
        "socialweb.computer/size,socialweb.computer/accel",
    )
    header, row = wide.splitlines()[:2]
    assert header.split()[-2:] == ["SIZE", "ACCEL"]
    accel, _ = kvm.acceleration(check_context.Context(role="node", state_dir=str(rented.directory)))
    assert row.split()[1] == "Ready" and "10.0.2.15" in row and "containerd://" in row
    assert row.split()[-2:] == ["2cpu-1024mi-1024mi", accel]
    node = json.loads(kubectl(gateway, "get", "node", rented.name, "-o", "json"))
    assert node["status"]["capacity"]["cpu"] == "2"
    assert node["metadata"]["labels"]["socialweb.computer/image"] == guest_image.fingerprint[:39]
    assert node["status"]["nodeInfo"]["kernelVersion"] == guest_image.manifest["kernelVersion"]

    # The spec's registries, applied inside the guest: a host that does not exist is pulled
    # through its mirror (the plain registry on the host's loopback), and the password-protected
    # registry with the node's own credentials (no imagePullSecrets).
    ns = "t-" + uuid.uuid4().hex[:8]
    kubectl(gateway, "create", "namespace", ns)
    kernel = guest_image.manifest["kernelVersion"]
    for name, image, then in (("hello", f"{MISSING_HOST}/test/busybox-app:1", "true"),
                              ("private", f"{private_registry.host}/private/busybox:1", "exec sleep 3600")):
        kubectl(gateway, "run", name, "-n", ns, f"--image={image}", "--restart=Never", "--", "sh", "-c",
                f"echo {name} from $(uname -r) in a microVM; {then}")
    for name, wanted in (("hello", "Succeeded"), ("private", "Running")):
        wait(lambda name=name, wanted=wanted: phase(gateway, name, ns) in (wanted, "Failed"),
             f"pod {name} {wanted}", 300)
        assert phase(gateway, name, ns) == wanted
        assert f"{name} from {kernel} in a microVM" in kubectl(gateway, "logs", name, "-n", ns)

    # exec into the guest's pod through the tenant apiserver: WebSocket (kubectl's default) and
    # SPDY, with stdin.
    assert kubectl(gateway, "exec", "private", "-n", ns, "--", "uname", "-r", timeout=120).strip() == kernel
    piped = gateway.kubectl_with(
        gateway.tenant_kubeconfig("ci"), "exec", "-i", "private", "-n", ns, "--", "sh", "-c", "tr a-z A-Z",
        input="through spdy\n", env={"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}, timeout=120,
    )
    assert piped.stdout == "THROUGH SPDY\n"

    # What the streaming subresources dial (exec, attach, port-forward upgrade a raw connection):
    # the agent's port forwarded to the host's loopback, TLS both ways, for this cluster only.
    endpoint = base.NodeDirectory(rented.directory.parents[1], "ci").endpoint(rented.name)
    assert endpoint is not None and endpoint.host == "127.0.0.1" and endpoint.ca_file

    async def healthz() -> bytes:
        reader, writer = await endpoint.open_connection()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
        return answer

    answer = asyncio.run(healthz())
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer
    assert base.NodeDirectory(rented.directory.parents[1], "other").endpoint(rented.name) is None

    # Secrets stay off the console, the kernel command line and anything readable by others.
    directory = rented.directory
    console = (directory / "logs" / "console.log").read_text(errors="replace")
    assert "PRIVATE KEY" not in console and "BEGIN CERTIFICATE" not in console
    assert private_registry.password not in console
    assert private_registry.password not in (directory / "node.json").read_text()
    assert (directory / "config.img").stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700
    qemu_cmdline = next(p for p in qemu_processes(str(directory)))
    assert "-append" in qemu_cmdline and "PRIVATE" not in qemu_cmdline and "credential" not in qemu_cmdline


def big_image(megabytes: int) -> oci.Image:
    image = images.busybox_image()
    image.add_file("data/blob", os.urandom(megabytes << 20))  # random: the layer does not compress
    return image


def test_a_new_memmib_is_a_new_image_and_a_tiny_rootfs_gives_a_pod_that_never_starts(
    microvm_gateway: gateway_mod.GatewayProcess,
    microvm_state_dir: Path,
    registry: images.Registry,
    guest_image: image_store.Image,
    image_config_for_tests: image_config.ImageConfig,
) -> None:
    gateway, state_dir = microvm_gateway, microvm_state_dir  # the run's shared ones (conftest.py)
    store = image_store.Store(state_dir)
    unchanged, state = store.ensure(image_config_for_tests)
    assert state == "present" and unchanged.fingerprint == guest_image.fingerprint
    content = int(guest_image.manifest["contentMiB"])
    tiny = image_config_for_tests.with_size(vcpu=2, mem_mib=768, rootfs_mib=content + 120)
    command = [
        sys.executable,
        "-m",
        "socialweb_computer",
        "image",
        "build",
        "-state-dir",
        str(state_dir),
        "-agent",
        str(image_config_for_tests.agent),
        "-vcpu",
        "2",
        "-mem-mib",
        "768",
        "-rootfs-mib",
        str(tiny.rootfs_mib),
        "-json",
    ]
    built = subprocess.run(command, capture_output=True, text=True, timeout=900, check=True)
    result = json.loads(built.stdout.splitlines()[-1])
    assert result["state"] == "built" and result["fingerprint"] != guest_image.fingerprint
    assert "image: [5/5] mkfs.ext4" in built.stderr, "progress, as plain lines off a terminal"
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(again.stdout.splitlines()[-1])["state"] == "present"

    registry.push(big_image(200), "test/big:1")
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "socialweb_computer",
            "node",
            "start",
            "--state-dir",
            str(state_dir),
            "--cluster",
            "ci",
            "--bidder",
            "qemu",
            "--vcpu",
            "2",
            "--mem-mib",
            "768",
            "--rootfs-mib",
            str(tiny.rootfs_mib),
            "--host-port",
            str(registry.port),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, image_config.AGENT_ENV: str(image_config_for_tests.agent)},
    )
    assert started.returncode == 0, started.stderr[-3000:]
    handle = base.NodeHandle.from_json(json.loads(started.stdout))
    try:
        ns = "t-" + uuid.uuid4().hex[:8]
        kubectl(gateway, "create", "namespace", ns)
        kubectl(
            gateway,
            "run",
            "big",
            "-n",
            ns,
            f"--image={registry.host}/test/big:1",
            "--restart=Never",
            f"--overrides={json.dumps({'spec': {'nodeName': handle.name}})}",
            "--",
            "true",
        )

        def no_space() -> str:
            pod = json.loads(kubectl(gateway, "get", "pod", "big", "-n", ns, "-o", "json"))
            waiting = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("waiting")
            return (
                waiting["message"]
                if waiting and "no space left on device" in waiting.get("message", "")
                else ""
            )

        message = wait(no_space, "the pull to fail for lack of space", timeout=600)
        assert (
            message.startswith("failed to pull and unpack image")
            or "failed to pull and unpack image" in message
        )
        pod = json.loads(kubectl(gateway, "get", "pod", "big", "-n", ns, "-o", "json"))
        assert pod["status"]["phase"] == "Pending"
        events = kubectl(gateway, "get", "events", "-n", ns, "--field-selector", "involvedObject.name=big")
        assert "no space left on device" in events and "Failed" in events

        # kill -9 of the node's QEMU: the Node goes NotReady after the monitor grace period.
        record = json.loads((handle.directory / base.RECORD).read_text())
        os.kill(record["pids"]["qemu"], signal.SIGKILL)
        wait(lambda: ready(gateway, handle.name) == "Unknown", f"node {handle.name} NotReady", timeout=180)
    finally:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "socialweb_computer",
                "node",
                "stop",
                "--state-dir",
                str(state_dir),
                handle.name,
            ],
            capture_output=True,
            timeout=120,
        )
    assert not handle.directory.exists()
    assert qemu_processes(str(handle.directory)) == []
