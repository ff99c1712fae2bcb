"""Guest images without booting anything: the config, the fingerprint, the refusals, the store.

The refusals are the seed's: a staged file of 2 GiB or more is refused with `Ext2 file too
big` and the explanation, and a state directory on a tmpfs is refused, both before anything
is written. A fake "agent binary" (an ELF header and some bytes) stands in for the real one
where only its hash matters; the slow tests build and boot real images.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from socialweb_computer.cli import main as cli_main
from socialweb_computer.guest import build as build_mod
from socialweb_computer.guest import config as config_mod
from socialweb_computer.guest import cpio
from socialweb_computer.guest import store as store_mod
from socialweb_computer.hostcheck import mounts, statedir


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    path = tmp_path / "agent"
    path.write_bytes(b"\x7fELF" + os.urandom(256))
    path.chmod(0o755)
    return path


def _config(agent: Path, **fields: object) -> config_mod.ImageConfig:
    return config_mod.ImageConfig(agent=agent, **fields)  # type: ignore[arg-type]


def _fingerprint(config: config_mod.ImageConfig) -> str:
    return config_mod.fingerprint(config_mod.inputs(config, build_mod.recipe()))


def test_the_fingerprint_covers_every_input(agent: Path, tmp_path: Path) -> None:
    staged = tmp_path / "tool"
    staged.write_bytes(b"one")
    base = _config(agent, files=(config_mod.StagedFile(staged, "/opt/tool"),))
    first = _fingerprint(base)
    assert first.startswith("sha256-") and len(first) == 7 + 64
    assert _fingerprint(base) == first, "the same inputs give the same fingerprint"
    changed = {
        "memMiB": base.with_size(vcpu=2, mem_mib=4096, rootfs_mib=base.rootfs_mib),
        "vcpu": base.with_size(vcpu=4, mem_mib=base.mem_mib, rootfs_mib=base.rootfs_mib),
        "rootfsMiB": base.with_size(vcpu=2, mem_mib=base.mem_mib, rootfs_mib=20480),
        "packages": _config(agent, packages=("git",), files=base.files),
        "kernel": _config(agent, kernel="linux-image-cloud-amd64", files=base.files),
    }
    prints = {what: _fingerprint(config) for what, config in changed.items()}
    assert first not in prints.values()
    assert len(set(prints.values())) == len(prints)
    staged.write_bytes(b"two")
    assert _fingerprint(base) != first, "a staged file's content is an input"
    staged.write_bytes(b"one")
    agent.write_bytes(agent.read_bytes() + b"x")
    assert _fingerprint(base) != first, "the agent binary's hash is an input"


def test_image_configs_parse_with_their_defaults_and_refuse_unknown_fields(tmp_path: Path) -> None:
    path = tmp_path / "image.yaml"
    path.write_text(
        "vcpu: 4\nmemMiB: 8192\nrootfsMiB: 20480\npackages: [git]\n"
        "files:\n  - {source: tool, path: /opt/tool, mode: '0755'}\n"
    )
    config = config_mod.load(path)
    assert (config.vcpu, config.mem_mib, config.rootfs_mib) == (4, 8192, 20480)
    assert config.kernel == "linux-image-amd64" and config.suite == "bookworm"
    assert config.files[0].source == tmp_path / "tool" and config.files[0].mode == 0o755
    assert "containerd" in config.all_packages and "git" in config.all_packages
    path.write_text("memMib: 1024\n")
    with pytest.raises(config_mod.ImageConfigError, match=r"unknown field 'memMib'.*memMiB"):
        config_mod.load(path)
    path.write_text("memMiB: 64\n")
    with pytest.raises(config_mod.ImageConfigError, match="memMiB: expected an integer of at least 256"):
        config_mod.load(path)
    path.write_text("files: [{source: x, path: etc/x}]\n")
    with pytest.raises(config_mod.ImageConfigError, match="must be an absolute path"):
        config_mod.load(path)


def test_a_staged_file_of_2_gib_is_refused_before_anything_is_built(agent: Path, tmp_path: Path) -> None:
    big = tmp_path / "toolchain.tar"
    with open(big, "wb") as f:
        f.truncate(config_mod.STAGED_FILE_LIMIT)  # sparse: 2 GiB that take no disk
    config = _config(agent, files=(config_mod.StagedFile(big, "/opt/toolchain.tar"),))
    state = tmp_path / "state"
    state.mkdir()
    with pytest.raises(config_mod.ImageConfigError) as refused:
        store_mod.Store(state, cache_dir=tmp_path / "cache").ensure(config)
    message = str(refused.value)
    assert message.startswith("Ext2 file too big")
    assert "mkfs.ext4 -d refuses a file of about 2 GiB" in message
    assert "pulled by the guest at run time instead" in message
    assert "docs/03-jobs.md#what-the-guest-does-and-does-not-pull" in message
    assert list(state.iterdir()) == [], "nothing half-built is left behind"
    assert not (tmp_path / "cache").exists()


def test_the_cli_refuses_the_staged_file_with_the_message(agent: Path, tmp_path: Path, capsys) -> None:
    big = tmp_path / "big.img"
    with open(big, "wb") as f:
        f.truncate(config_mod.STAGED_FILE_LIMIT + (200 << 20))
    config = tmp_path / "image.yaml"
    config.write_text(f"agent: {agent}\nfiles: [{{source: big.img, path: /srv/big.img}}]\n")
    (tmp_path / "state").mkdir()
    code = cli_main.main(["image", "build", "-state-dir", str(tmp_path / "state"), "-config", str(config)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: Ext2 file too big: ") and "(2.2 GiB, staged as /srv/big.img)" in err
    assert list((tmp_path / "state").iterdir()) == []


def _tmpfs() -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or mounts.mount_of(str(shm)).fstype != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this host")
    return shm


def test_a_state_directory_on_a_tmpfs_is_refused_before_anything_is_built(
    agent: Path, tmp_path: Path
) -> None:
    state = _tmpfs() / f"socialweb-test-{os.getpid()}-{os.urandom(3).hex()}"
    state.mkdir()
    try:
        with pytest.raises(statedir.StateDirRefused) as refused:
            store_mod.Store(state, cache_dir=tmp_path / "cache").ensure(_config(agent))
        message = str(refused.value)
        assert message.startswith("building a guest image: the state directory")
        assert "tmpfs" in message and "TMPDIR=/var/tmp/kcp" in message and "--state-dir" in message
        assert list(state.iterdir()) == []
    finally:
        state.rmdir()


def test_a_state_directory_without_room_is_refused(tmp_path: Path) -> None:
    with pytest.raises(statedir.StateDirRefused, match=r"needs \d+ MiB free for the state directory"):
        statedir.require_room(str(tmp_path), 1 << 40, "booting the microVM node qemu-x")


def _stored(store: store_mod.Store, fingerprint: str, config: config_mod.ImageConfig) -> None:
    directory = store.root / fingerprint
    directory.mkdir(parents=True)
    for name in store_mod.FILES.values():
        (directory / name).write_bytes(b"")
    manifest = {"fingerprint": fingerprint, "vcpu": config.vcpu, "memMiB": config.mem_mib,
                "rootfsMiB": config.rootfs_mib}
    (directory / store_mod.MANIFEST).write_bytes(orjson.dumps(manifest))


def test_an_image_that_is_present_is_not_built_again(agent: Path, tmp_path: Path) -> None:
    store = store_mod.Store(tmp_path / "state", cache_dir=tmp_path / "cache")
    config = _config(agent, mem_mib=1024)
    fingerprint, _ = store.fingerprint(config)
    _stored(store, fingerprint, config)
    image, state = store.ensure(config)
    assert state == "present" and image.fingerprint == fingerprint and image.mem_mib == 1024
    assert image.as_json(state)["rootfs"] == str(store.root / fingerprint / "rootfs.ext4")
    assert not (tmp_path / "cache").exists(), "nothing was downloaded or built"


def test_prune_removes_unused_images_and_keeps_the_ones_in_use(agent: Path, tmp_path: Path) -> None:
    store = store_mod.Store(tmp_path / "state")
    config = _config(agent)
    for name in ("sha256-aaa", "sha256-bbb", "sha256-ccc"):
        _stored(store, name, config)
    (store.root / ".build-sha256-ddd-999999999").mkdir()  # a dead build's scratch
    removed = store.prune({"sha256-aaa"}, keep={"sha256-ccc"})
    assert [name for name, _ in removed] == ["sha256-bbb"]
    assert sorted(p.name for p in store.root.iterdir() if not p.name.endswith(".lock")) == [
        "sha256-aaa", "sha256-ccc"]


def test_the_initramfs_archive_is_what_busybox_cpio_reads(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "init").write_text("#!/bin/sh\necho hi\n")
    (tree / "init").chmod(0o755)
    (tree / "bin" / "sh").symlink_to("busybox")
    (tree / "odd").write_bytes(b"x" * 5)
    out = tmp_path / "initramfs.cpio.gz"
    cpio.write(tree, out, char_devices=(("dev/console", 5, 1),))
    raw = gzip.decompress(out.read_bytes())
    listing = subprocess.run(["busybox", "cpio", "-tv"], input=raw, capture_output=True, check=True).stdout
    lines = listing.decode().splitlines()
    assert any(line.startswith("-rwxr-xr-x") and line.endswith(" init") for line in lines)
    assert any(line.startswith("lrwxrwxrwx") and "bin/sh -> busybox" in line for line in lines)
    assert any(line.startswith("crw-------") and line.endswith(" dev/console") for line in lines)
    extract = tmp_path / "x"
    extract.mkdir()
    subprocess.run(["busybox", "cpio", "-id"], input=raw, cwd=extract, check=True, capture_output=True)
    assert (extract / "odd").read_bytes() == b"x" * 5
    assert cpio.write.__doc__ and raw.endswith(b"\0") and b"TRAILER!!!" in raw


def test_modules_load_in_dependency_order(tmp_path: Path) -> None:
    (tmp_path / "modules.dep").write_text(
        "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n"
        "kernel/lib/crc16.ko:\nkernel/fs/mbcache.ko:\nkernel/fs/jbd2/jbd2.ko:\n"
        "kernel/drivers/virtio/virtio_pci.ko: "
        "kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n"
        "kernel/drivers/virtio/virtio_ring.ko: kernel/drivers/virtio/virtio.ko\n"
        "kernel/drivers/virtio/virtio.ko:\n"
        "kernel/arch/x86/crypto/crc32c-intel.ko:\n"
    )
    order = build_mod.module_load_order(tmp_path, ("virtio_pci", "ext4", "crc32c-intel", "not_a_module"))
    names = [Path(m).name for m in order]
    assert names == ["virtio.ko", "virtio_ring.ko", "virtio_pci.ko", "jbd2.ko", "mbcache.ko", "crc16.ko",
                     "ext4.ko", "crc32c-intel.ko"]


def test_the_elf_kernel_is_found_inside_a_bzimage(tmp_path: Path) -> None:
    kernel = b"\x7fELF" + os.urandom(4096)
    bzimage = tmp_path / "vmlinuz"
    # A false xz magic first (as setup code may hold), then the real payload.
    bzimage.write_bytes(os.urandom(512) + b"\xfd7zXZ\x00garbage" + lzma.compress(kernel) + os.urandom(64))
    build_mod.extract_vmlinux(bzimage, tmp_path / "vmlinux")
    assert (tmp_path / "vmlinux").read_bytes() == kernel
    bzimage.write_bytes(os.urandom(1024))
    with pytest.raises(build_mod.BuildError, match="no compressed ELF kernel"):
        build_mod.extract_vmlinux(bzimage, tmp_path / "other")


def test_no_agent_binary_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(config_mod.ImageConfigError, match=r"scripts/build-binary\.sh"):
        config_mod.agent_binary(config_mod.ImageConfig(agent=tmp_path / "missing"))
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(config_mod.ImageConfigError, match="not an executable binary"):
        config_mod.agent_binary(config_mod.ImageConfig(agent=script))


def _until_someone_waits_on(lock: Path, timeout: float = 60.0) -> None:
    """Until a process or thread is blocked on `lock`'s flock: the kernel lists such a waiter in
    /proc/locks as a `->` line with the file's inode (a thread merely started may not be there yet)."""
    inode = f":{lock.stat().st_ino} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.split(":", 1)[-1].lstrip().startswith("->") and inode in line
               for line in Path("/proc/locks").read_text().splitlines()):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing waited on {lock} within {timeout} s")


def test_an_image_another_process_built_while_this_one_waited_is_reused(agent: Path, tmp_path: Path) -> None:
    """Two node starts of one new size: the second waits on the first's build lock, then uses it."""
    import threading

    store = store_mod.Store(tmp_path / "state", cache_dir=tmp_path / "cache")
    config = _config(agent)
    fingerprint, _ = store.fingerprint(config)
    results: list[tuple[store_mod.Image, str]] = []
    store.root.mkdir(parents=True)
    with store._lock(fingerprint):  # "another process" is building it
        waiter = threading.Thread(target=lambda: results.append(store.ensure(config)))
        waiter.start()
        _until_someone_waits_on(store.root / f".{fingerprint}.lock")  # ensure waits for the build
        _stored(store, fingerprint, config)
    waiter.join(timeout=30.0)
    assert [state for _, state in results] == ["reused"]
    assert not (tmp_path / "cache").exists(), "nothing was built a second time"


def test_a_microvm_node_on_a_tmpfs_state_directory_is_refused_before_anything_boots(agent: Path) -> None:
    import asyncio

    from socialweb_computer.bidders import base, qemu
    from socialweb_computer.node import config as node_config

    if shutil.which("qemu-system-x86_64") is None:
        pytest.skip("no QEMU here (scripts/bootstrap.sh installs it)")
    state = _tmpfs() / f"socialweb-test-{os.getpid()}-{os.urandom(3).hex()}"
    state.mkdir()
    try:
        bidder = qemu.QemuBidder(state, image=_config(agent))
        request = base.NodeRequest(cluster="ci", server="https://127.0.0.1:6444",
                                   size=node_config.Size(2, 2048, 8192))
        with pytest.raises(base.BidderError, match=r"TMPDIR=/var/tmp/kcp"):
            asyncio.run(bidder.start(request))
        assert list(state.iterdir()) == [], "no image, no node directory, no process"
    finally:
        state.rmdir()


def test_builds_are_counted_by_outcome_and_the_directory_is_listed(
    agent: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the host's /metrics reads: this process's builds by outcome, and what the image
    directory holds (stored images, builds in progress by any live process)."""
    import threading

    monkeypatch.setattr(store_mod, "BUILDS", store_mod.BuildCounts())
    store = store_mod.Store(tmp_path / "state", cache_dir=tmp_path / "cache")
    assert store.contents() == store_mod.Contents(images=0, building=0)

    def broken(*args: object, **kwargs: object) -> None:
        raise build_mod.BuildError("no kernel package")

    monkeypatch.setattr(build_mod, "build", broken)
    with pytest.raises(build_mod.BuildError):
        store.ensure(_config(agent, mem_mib=1024))
    config = _config(agent)
    fingerprint, _ = store.fingerprint(config)
    with store._lock(fingerprint):  # another process builds it while this one waits
        (store.root / f".build-{fingerprint}-{os.getpid()}").mkdir()
        assert store.contents() == store_mod.Contents(images=0, building=1)
        waiter = threading.Thread(target=store.ensure, args=(config,))
        waiter.start()
        _until_someone_waits_on(store.root / f".{fingerprint}.lock")
        _stored(store, fingerprint, config)
        (store.root / f".build-{fingerprint}-{os.getpid()}").rmdir()
    waiter.join(timeout=30.0)
    store.ensure(config)  # present: not a build
    counts = store_mod.BUILDS
    assert (counts.built, counts.reused, counts.failed) == (0, 1, 1)
    (store.root / ".build-sha256-dead-999999999").mkdir()  # a dead build's scratch is not a build
    assert store.contents() == store_mod.Contents(images=1, building=0)
