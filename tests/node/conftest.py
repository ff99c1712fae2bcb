"""Fixtures for node tests: a gateway with tenant `ci`, registries on loopback, one sandbox node.

Everything is real: the gateway process, docker-registry, containerd with runc, CNI, the
agent. The node is shared by a module's tests (starting one takes seconds); each test
uses its own namespace so tests do not see each other's pods.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from socialweb_computer import testing
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if missing:
        skip = pytest.mark.skip(
            reason=f"node tools missing: {', '.join(missing)} (scripts/bootstrap.sh --test)"
        )
        for item in items:
            if "tests/node/" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    with images.Registry.start(tmp_path_factory.mktemp("registry")) as reg:
        reg.push(images.busybox_image(), "test/busybox:1")
        reg.push(images.busybox_image(user="1000:1000"), "test/busybox-app:1")
        yield reg


@pytest.fixture(scope="session")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    with images.Registry.start(
        tmp_path_factory.mktemp("private-registry"),
        username="puller",
        password="s3cret-" + uuid.uuid4().hex[:8],
    ) as reg:
        reg.push(images.busybox_image(), "private/busybox:1")
        yield reg


class Tenant:
    """kubectl against the tenant as its admin, with waits on what the node does."""

    def __init__(self, gateway: gateway_mod.GatewayProcess, cluster: str) -> None:
        self.gateway = gateway
        self.kubeconfig = gateway.tenant_kubeconfig(cluster)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0) -> Any:
        return self.gateway.kubectl_with(
            self.kubeconfig,
            *args,
            input=input,
            check=check,
            timeout=timeout,
            env={"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "true"},
        )

    def apply(self, manifest: str, namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)

    def wait(self, predicate: Any, what: str, timeout: float = 90.0, interval: float = 0.3) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except Exception as exc:  # the object may not exist yet
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")

    def pod(self, name: str, namespace: str) -> dict[str, Any]:
        return self.get("pod", name, namespace)

    def wait_phase(
        self, name: str, namespace: str, phases: tuple[str, ...], timeout: float = 90.0
    ) -> dict[str, Any]:
        return self.wait(
            lambda: (p := self.pod(name, namespace))["status"].get("phase") in phases and p,
            f"pod {namespace}/{name} in {phases}",
            timeout,
        )

    def events(self, name: str, namespace: str) -> list[dict[str, Any]]:
        listed = json.loads(
            self.kubectl(
                "get",
                "events",
                "-n",
                namespace,
                "-o",
                "json",
                "--field-selector",
                f"involvedObject.name={name}",
            ).stdout
        )
        return sorted(listed["items"], key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))

    def namespace(self) -> str:
        name = "t-" + uuid.uuid4().hex[:8]
        self.kubectl("create", "namespace", name)
        return name


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    state = tmp_path_factory.mktemp("gateway") / "state"
    with gateway_mod.GatewayProcess.start(state, {"clusters": [{"name": "ci"}]}, timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        yield gw
    # Streams, logs and node traffic end in many ways; none of them is a traceback in the log.
    tracebacks = testing.logged_tracebacks(gw)
    assert not tracebacks, f"the gateway logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}"


@pytest.fixture(scope="module")
def tenant(gateway: gateway_mod.GatewayProcess) -> Tenant:
    return Tenant(gateway, "ci")


@pytest.fixture(scope="module")
def node(
    gateway: gateway_mod.GatewayProcess,
    tenant: Tenant,
    registry: images.Registry,
    private_registry: images.Registry,
) -> Iterator[Any]:
    with nodes.sandbox_node(
        gateway.state_dir, "ci", host_ports=[registry.port, private_registry.port]
    ) as handle:
        tenant.wait(
            lambda: (
                tenant.kubectl(
                    "get",
                    "node",
                    handle.name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                ).stdout
                == "True"
            ),
            f"node {handle.name} Ready",
        )
        yield handle


@pytest.fixture
def ns(tenant: Tenant, node: Any) -> str:
    return tenant.namespace()


@pytest.fixture(scope="session")
def image(registry: images.Registry) -> str:
    return f"{registry.host}/test/busybox:1"
