"""Fixtures for capacity's end-to-end tests: a real gateway whose capacity controller rents
real sandbox nodes, images from a registry on loopback, and a check that the host is left
as it was found (processes, mounts, links, netns, nft rules, cgroups).

Nodes are small (1 vCPU, 1024 MiB, a 1024 MiB disk) and holds short, so the tests exercise the
real boots and releases in seconds. The pure parts (intent, plan, share) need none of this.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.bidders import sandbox
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes

NODE_TOOLS = (
    "containerd",
    "runc",
    "slirp4netns",
    "tini",
    "unshare",
    "docker-registry",
    "skopeo",
    "mkfs.ext4",
)
PURE = ("test_intent.py", "test_plan.py", "test_share.py", "test_list_failures.py")  # need no node tools
SMALL_NODE = {"vcpu": 1, "memMiB": 1024, "rootfsMiB": 1024}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"node tools missing: {', '.join(missing)} (scripts/bootstrap.sh --test)")
    for item in items:
        if "tests/capacity/" in str(item.fspath) and item.fspath.basename not in PURE:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    with images.Registry.start(tmp_path_factory.mktemp("registry")) as reg:
        reg.push(images.busybox_image(), "test/busybox:1")
        yield reg


@pytest.fixture(scope="session")
def image(registry: images.Registry) -> str:
    return f"{registry.host}/test/busybox:1"


def stop_every_node(state_dir: Path) -> None:
    """What a test's gateway leaves running on purpose (nodes outlive the gateway) goes here."""
    asyncio.run(nodes.stop_sandbox_nodes(state_dir))


class Capacity:
    """One gateway with capacity on the sandbox bidder, and kubectl against it and its tenants."""

    def __init__(self, gateway: gateway_mod.GatewayProcess) -> None:
        self.gateway = gateway

    def admin(self, *args: str, check: bool = True, input: str | None = None) -> Any:
        return self.gateway.kubectl(*args, check=check, input=input)

    def kubectl(
        self, cluster: str, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> Any:
        return self.gateway.kubectl_with(
            self.gateway.tenant_kubeconfig(cluster), *args, check=check, input=input, timeout=timeout
        )

    def json(self, cluster: str, *args: str) -> Any:
        return json.loads(self.kubectl(cluster, *args, "-o", "json").stdout)

    def apply(self, cluster: str, *objects: dict[str, Any]) -> None:
        self.kubectl(cluster, "apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))

    def events(self, cluster: str, namespace: str = "default", **fields: str) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in fields.items())
        args = ["get", "events", "-n", namespace]
        if selector:
            args += ["--field-selector", selector]
        return sorted(
            self.json(cluster, *args)["items"],
            key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]),
        )

    def reasons(self, cluster: str, name: str, namespace: str = "default") -> list[tuple[str, str]]:
        return [
            (e["reason"], e["message"])
            for e in self.events(cluster, namespace, **{"involvedObject.name": name})
        ]

    def node_names(self, cluster: str) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.json(cluster, "get", "nodes")["items"])

    def cluster(self, name: str) -> dict[str, Any]:
        return json.loads(self.admin("get", "cluster", name, "-o", "json").stdout)

    def condition(self, name: str, kind: str = "Capacity") -> dict[str, Any]:
        return next(
            (c for c in self.cluster(name).get("status", {}).get("conditions", []) if c["type"] == kind), {}
        )

    def phase(self, cluster: str, pod: str, namespace: str = "default") -> str:
        result = self.kubectl(
            cluster, "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
        )
        return str(result.stdout) if result.returncode == 0 else ""


def wait(predicate: Callable[[], Any], what: str, timeout: float = 120.0, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # not there yet
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def pod(
    name: str,
    image: str,
    *,
    command: tuple[str, ...] = ("sleep", "3600"),
    cpu: str = "",
    memory: str = "",
    priority_class: str = "",
    labels: dict[str, str] | None = None,
    grace: int = 1,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "restartPolicy": "Never",
        "containers": [
            {"name": "main", "image": image, "command": list(command), "resources": {"requests": requests}}
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


@pytest.fixture
def start_capacity(tmp_path_factory: pytest.TempPathFactory, registry: images.Registry) -> Iterator[Any]:
    """Call with the spec's clusters (and capacity/nodeDefaults overrides); the host is checked after."""
    state = Path(tmp_path_factory.mktemp("capacity")) / "state"
    marker = str(state)
    before = nodes.HostSnapshot.take(marker)
    started: list[gateway_mod.GatewayProcess] = []

    def start(
        clusters: list[dict[str, Any]] | None = None,
        *,
        capacity: dict[str, Any] | None = None,
        node_defaults: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None,
    ) -> Capacity:
        if spec is None:
            spec = {
                "capacity": {
                    "bidder": "sandbox",
                    "hostBudget": {"vcpu": 4, "memMiB": 4096, "diskMiB": 8192},
                    **(capacity or {}),
                },
                "nodeDefaults": {**SMALL_NODE, "releaseAfterSeconds": 3, **(node_defaults or {})},
                "registries": [{"host": registry.host}],  # on loopback: its port is forwarded into nodes
                "clusters": clusters if clusters is not None else [{"name": "ci"}],
            }
        gateway = gateway_mod.GatewayProcess.start(
            state, spec, timeout=60, env={"SOCIALWEB_CAPACITY_DRAIN_TIMEOUT": "15", **(env or {})}
        )
        started.append(gateway)
        for wanted in spec.get("clusters", []):
            gateway.wait_phase(wanted["name"], "Ready", timeout=60)
        return Capacity(gateway)

    yield start
    for gateway in started:
        gateway.stop()
    stop_every_node(state)
    tracebacks = [t for gateway in started for t in testing.logged_tracebacks(gateway)]
    assert leaks(before, nodes.HostSnapshot.take(marker), _node_names(state)) == {}
    if tracebacks:
        pytest.fail(
            f"the gateway logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}", pytrace=False
        )


def _node_names(state: Path) -> set[str]:
    """Every node the test's gateways rented or adopted, from their logs."""
    text = "".join(p.read_text(errors="replace") for p in state.glob("*.log"))
    return set(re.findall(r"\bnode (sandbox-[a-z0-9]{5})\b", text))


def leaks(before: nodes.HostSnapshot, after: nodes.HostSnapshot, names: set[str]) -> dict[str, Any]:
    """What the test's nodes left: the snapshot's differences, with cgroups judged by our nodes' names.

    The `socialweb` parent cgroup is shared by every sandbox node on the host, other engineers'
    tests included, so whether it exists says nothing about this test; a cgroup of one of our
    nodes does."""
    found = {k: v for k, v in after.differences(before).items() if k != "cgroups"}
    ours = sorted(
        str(p) for name in names for p in Path("/sys/fs/cgroup").glob(f"*/{sandbox.CGROUP_PARENT}/{name}")
    )
    if ours:
        found["cgroups"] = ours
    return found


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
