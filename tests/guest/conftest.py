"""Fixtures for the microVM tests: the agent binary, ONE guest image per run, a registry.

Everything is real: the single-file binary built by scripts/build-binary.sh (the agent inside
the guest), an image built from Debian's packages (from the package cache that
scripts/bootstrap.sh fills, so a run needs no network), QEMU under TCG (or KVM where it
works), a docker-registry on the host's loopback. Booting is slow, so the tests that boot are
marked `slow`, and every gateway of a run shares the one image: its state directory gets an
`images` link to the session's image store.

`SOCIALWEB_TEST_AGENT_BINARY` may name an already built binary to skip the build (it must be
built from this checkout, since the guest runs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer.guest import config as image_config
from socialweb_computer.guest import store as image_store
from socialweb_computer.testing import images

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-binary.sh"
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
def agent_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SOCIALWEB_TEST_AGENT_BINARY")
    if given:
        return Path(given)
    root = tmp_path_factory.mktemp("agent-binary")
    env = {**os.environ, "PYINSTALLER_CONFIG_DIR": str(root / "pyinstaller")}
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dist", str(root / "dist"), "--work", str(root / "work")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        pytest.fail(f"build-binary.sh failed:\n{result.stderr[-6000:]}", pytrace=False)
    shutil.rmtree(root / "work", ignore_errors=True)
    return root / "dist" / "socialweb-computer"


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
