"""Fixtures for the microVM tests: the agent binary, ONE guest image per run, registries, and
ONE microVM node per run with its gateway.

Everything is real: the single-file binary built by scripts/build-binary.sh once per run
(tests/conftest.py's `single_file_binary`; the agent inside the guest), an image built from
Debian's packages (from the package cache that scripts/bootstrap.sh fills, so a run needs no
network), QEMU under TCG (or KVM where it works), a docker-registry on the host's loopback.
Booting is slow, so the tests that boot are marked `slow`, and every gateway of a run shares the
one image: its state directory gets an `images` link to the session's image store.

Each boot under TCG costs a minute or more, so the tests that need a microVM node of a gateway
but no fresh one share `microvm_node`: a node the gateway's `ci` cluster rents as the gateway
does (the bidder records the gateway's pid as its owner), configured from a spec's registries (a
mirror, and a private registry with the node's own credentials). Tests that use it must leave it
as they found it (their own namespaces); test_microvm_restart.py, which kills the gateway and
with it the node, sorts after every other user.

`SOCIALWEB_TEST_AGENT_BINARY` may name an already built binary to skip the build (it must be
built from this checkout, since the guest runs it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.bidders import base
from socialweb_computer.clusterprovider import layout
from socialweb_computer.gateway import bidding
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import store as image_store
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes

VM_TOOLS = (
    "qemu-system-x86_64",
    "qemu-img",
    "slirp4netns",
    "mkfs.ext4",
    "depmod",
    "docker-registry",
    "skopeo",
)
# Small enough to boot fast under TCG, large enough for containerd and a test image.
TEST_SIZE = {"vcpu": 2, "mem_mib": 1024, "rootfs_mib": 1024}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [tool for tool in VM_TOOLS if shutil.which(tool) is None]
    if missing:
        skip = pytest.mark.skip(
            reason=f"microVM tools missing: {', '.join(missing)} (scripts/bootstrap.sh --test)"
        )
        for item in items:
            if "tests/guest/" in str(item.fspath) and item.get_closest_marker("slow"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def agent_binary(request: pytest.FixtureRequest) -> Path:
    given = os.environ.get("SOCIALWEB_TEST_AGENT_BINARY")
    if given:
        return Path(given)
    return request.getfixturevalue("single_file_binary").path  # built once per run (tests/conftest.py)


@pytest.fixture(scope="session")
def image_config_for_tests(agent_binary: Path) -> image_config.ImageConfig:
    return image_config.ImageConfig(agent=agent_binary).with_size(**TEST_SIZE)


@pytest.fixture(scope="session")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the run's images live; each test gateway links <state>/images here."""
    # Under /var/tmp, not a tmpfs /tmp: images are files of rootfsMiB.
    root = Path(os.environ.get("SOCIALWEB_TEST_IMAGE_DIR") or tmp_path_factory.mktemp("image-store"))
    (root / "state").mkdir(parents=True, exist_ok=True)
    return root / "state"


@pytest.fixture(scope="session")
def guest_image(image_root: Path, image_config_for_tests: image_config.ImageConfig) -> image_store.Image:
    image, _state = image_store.Store(image_root).ensure(
        image_config_for_tests, progress=image_store.Progress()
    )
    return image


def share_images(state_dir: Path, image_root: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    link = state_dir / image_store.IMAGES
    if not link.exists():
        link.symlink_to(image_root / image_store.IMAGES)


@pytest.fixture(scope="session")
def private_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    password = "s3cret-" + uuid.uuid4().hex[:8]
    directory = tmp_path_factory.mktemp("private-registry")
    with images.Registry.start(directory, username="puller", password=password) as reg:
        reg.push(images.busybox_image(), "private/busybox:1")
        yield reg


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[images.Registry]:
    with images.Registry.start(tmp_path_factory.mktemp("registry")) as reg:
        reg.push(images.busybox_image(), "test/busybox:1")
        reg.push(images.busybox_image(user="1000:1000"), "test/busybox-app:1")
        yield reg


MISSING_HOST = "registry.example.invalid"  # pulled through its mirror, the plain registry
AUTH_ENV = "SOCIALWEB_TEST_REGISTRY_AUTH"


@pytest.fixture(scope="session")
def microvm_state_dir(tmp_path_factory: pytest.TempPathFactory, image_root: Path) -> Path:
    state = Path(tmp_path_factory.mktemp("microvm")) / "state"
    share_images(state, image_root)
    return state


@pytest.fixture(scope="session")
def microvm_before(microvm_state_dir: Path) -> nodes.HostSnapshot:
    """The host before the shared gateway started."""
    return nodes.HostSnapshot.take(str(microvm_state_dir))


@pytest.fixture(scope="session")
def microvm_gateway(
    microvm_state_dir: Path, microvm_before: nodes.HostSnapshot
) -> Iterator[gateway_mod.GatewayProcess]:
    gw = gateway_mod.GatewayProcess.start(microvm_state_dir, {"clusters": [{"name": "ci"}]}, timeout=60)
    try:
        gw.wait_phase("ci", "Ready", timeout=60)
        yield gw
    finally:
        gw.stop()


@pytest.fixture(scope="session")
def microvm_node(
    microvm_gateway: gateway_mod.GatewayProcess,
    microvm_state_dir: Path,
    registry: images.Registry,
    private_registry: images.Registry,
    guest_image: image_store.Image,
    image_config_for_tests: image_config.ImageConfig,
) -> Iterator[base.NodeHandle]:
    """The run's shared microVM node (see above), Ready in the gateway's cluster `ci`."""
    record = layout.StateLayout(str(microvm_state_dir)).read_cluster("ci")
    assert record is not None
    spec = spec_mod.parse({
        "registries": [
            {"host": private_registry.host, "credentialsEnv": AUTH_ENV},
            {"host": MISSING_HOST, "mirrors": [f"http://{registry.host}"]},
        ]
    })
    env = {AUTH_ENV: f"{private_registry.username}:{private_registry.password}"}
    bidder = bidding.make_bidder(
        "qemu", microvm_state_dir, spec, image=image_config_for_tests, owner_pid=microvm_gateway.pid, env=env
    )
    size = node_config.Size(TEST_SIZE["vcpu"], TEST_SIZE["mem_mib"], TEST_SIZE["rootfs_mib"])
    handle = asyncio.run(bidder.start(base.NodeRequest(cluster="ci", server=record.url, size=size)))
    try:
        kubeconfig = microvm_gateway.tenant_kubeconfig("ci")
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        deadline = time.monotonic() + 300
        while microvm_gateway.kubectl_with(kubeconfig, "get", "node", handle.name, "-o", jsonpath,
                                           check=False).stdout != "True":
            assert time.monotonic() < deadline, f"node {handle.name} not Ready"
            time.sleep(1)
        yield handle
    finally:
        asyncio.run(bidder.stop(handle.name))


def wait(predicate: Any, what: str, timeout: float = 300.0) -> Any:
    """`predicate()` once it is truthy (an exception counts as not yet), polled each second."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
