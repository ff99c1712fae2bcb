"""Building a guest image: a PVH kernel, an initramfs and an ext4 root filesystem.

    python -m socialweb_computer.guest.build --download-only   # fill the package cache (bootstrap)

`build()` writes an image's three files into a scratch directory that `store.py` renames into
place; nothing is left behind when it fails. The steps (`STEPS`), all from Debian's archive
through `debian.py` (no apt state of the host is touched) and kept in a package cache so a
rebuild needs no network:

1. packages: the kernel package, and the root filesystem's packages with every dependency;
2. kernel: Debian's bzImage decompressed to the `vmlinux` inside it, which QEMU boots through
   its PVH entry point (`-M pc -kernel vmlinux`), and the kernel's modules;
3. root filesystem: every package unpacked (no maintainer scripts run: nothing in a node needs
   them), busybox's applets, iptables' nft variant as `iptables`, a CA bundle, the modules a
   node loads on demand (with their `depmod` index), the node agent (the project's single-file
   binary), the init (`scripts/node-init`), the staged files and the manifest;
4. initramfs: busybox and the modules that mount the root filesystem, in dependency order;
5. mkfs: `mkfs.ext4 -d` into a sparse file of `rootfsMiB`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import lzma
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from socialweb_computer import binary, debian
from socialweb_computer.guest import config as config_mod
from socialweb_computer.guest import cpio

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# Bump when the steps below change what an image holds: the fingerprint covers it.
RECIPE_VERSION = "1"
STEPS = ("packages", "kernel", "root filesystem", "initramfs", "mkfs.ext4")
AGENT_PATH = "usr/local/bin/socialweb-computer"
MANIFEST_IN_ROOTFS = "etc/socialweb-computer/image.json"
# Modules that mount the root filesystem (in the initramfs).
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4", "crc32c_generic", "crc32c-intel")
# Module directories a node may load from on demand: networking (bridge, veth, netfilter),
# filesystems (overlay), and the libraries and crypto they use; plus the virtio drivers.
ROOTFS_MODULE_DIRS = (
    "kernel/net",
    "kernel/fs",
    "kernel/lib",
    "kernel/crypto",
    "kernel/arch",
    "kernel/block",
    "kernel/drivers/virtio",
    "kernel/drivers/block",
    "kernel/drivers/char",
    "kernel/drivers/net",
)
# Room a root filesystem must keep beyond the node's own files (containerd's first layers).
ROOTFS_HEADROOM_MIB = 64
_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_MAGIC = b"\x1f\x8b\x08"

Progress = Callable[[str, str], None]  # (step, detail)


class BuildError(RuntimeError):
    """The image could not be built; the message says which step and why."""


@dataclasses.dataclass(frozen=True)
class Parts:
    kernel_version: str
    packages: dict[str, str]  # name -> version, of everything in the root filesystem
    content_mib: int


def recipe() -> str:
    """The build recipe as the fingerprint covers it: this version and the init scripts' content."""
    digest = hashlib.sha256(RECIPE_VERSION.encode())
    for script in sorted(SCRIPTS.iterdir()):
        digest.update(script.name.encode() + b"\0" + script.read_bytes())
    return f"{RECIPE_VERSION}-{digest.hexdigest()[:16]}"


def _run(command: list[str], what: str, **kwargs: Any) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=binary.child_env(), **kwargs)
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise BuildError(f"{what}: {' '.join(command[:2])} failed: {output}")
    return result.stdout


# ---------------------------------------------------------------- packages


def _deb_field(deb: Path, field: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), field], f"reading {deb.name}").strip()


def kernel_deb(
    config: config_mod.ImageConfig, cache: Path, *, refresh: bool, log: Callable[[str], None]
) -> Path:
    """The kernel image package; a metapackage (linux-image-amd64) is followed to its image."""
    name = config.kernel
    for _depth in range(3):
        (deb,) = debian.obtain([name], config.suite, cache, refresh=refresh, log=log)
        if _deb_lists(deb, "./boot/vmlinuz-"):
            return deb
        depends = [d.split()[0] for d in _deb_field(deb, "Depends").split(",") if d.strip()]
        images = [d for d in depends if d.startswith("linux-image-")]
        if not images:
            break
        name = images[0]
    raise BuildError(
        f"{config.kernel} in Debian {config.suite} is not a kernel image package (no /boot/vmlinuz)"
    )


def _deb_lists(deb: Path, prefix: str) -> bool:
    listing = _run(["dpkg-deb", "-c", str(deb)], f"listing {deb.name}")
    return any(line.split()[-1].startswith(prefix) for line in listing.splitlines() if line.split())


# ---------------------------------------------------------------- kernel


def extract_vmlinux(bzimage: Path, out: Path) -> None:
    """Decompresses the ELF kernel inside a bzImage (what scripts/extract-vmlinux does)."""
    data = bzimage.read_bytes()
    for magic, decompress in ((_XZ_MAGIC, _unxz), (_ZSTD_MAGIC, _unzstd), (_GZIP_MAGIC, _gunzip)):
        start = data.find(magic)
        while start >= 0:
            try:
                kernel = decompress(data[start:])
            except Exception:  # a false match of the magic: try the next one
                kernel = b""
            if kernel[:4] == b"\x7fELF":
                out.write_bytes(kernel)
                return
            start = data.find(magic, start + 1)
    raise BuildError(f"{bzimage.name}: no compressed ELF kernel found inside (xz, zstd or gzip)")


def _unxz(data: bytes) -> bytes:
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)


def _gunzip(data: bytes) -> bytes:
    import zlib

    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)


def _unzstd(data: bytes) -> bytes:
    result = subprocess.run(["zstd", "-dc"], input=data, capture_output=True)
    return result.stdout if result.returncode == 0 else b""


def _modules_dep(modules: Path) -> dict[str, list[str]]:
    deps: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        module, _, rest = line.partition(":")
        deps[module] = rest.split()
    return deps


def _module_key(path: str) -> str:
    return Path(path).name.removesuffix(".ko").replace("-", "_")


def module_load_order(modules: Path, wanted: tuple[str, ...]) -> list[str]:
    """Module files (relative to `modules`) for `wanted` and their dependencies, dependencies first."""
    deps = _modules_dep(modules)
    by_name = {_module_key(m): m for m in deps}
    order: list[str] = []

    def visit(module: str) -> None:
        if module in order:
            return
        for dependency in reversed(deps.get(module, [])):
            visit(dependency)
        order.append(module)

    for name in wanted:
        module = by_name.get(name.replace("-", "_"))
        if module is not None:  # built into this kernel, or not on this architecture
            visit(module)
    return order


def depmod(root: Path, version: str) -> None:
    _run(["depmod", "-b", str(root), version], "indexing the kernel's modules (depmod, from kmod)")


# ---------------------------------------------------------------- root filesystem


def _busybox_links(root: Path) -> None:
    """/bin/sh and every busybox applet that no package provides."""
    busybox = root / "bin" / "busybox"
    applets = _run([str(busybox), "--list-full"], "listing busybox's applets").split()
    for applet in applets:
        target = root / applet
        if target.exists() or target.is_symlink():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.path.relpath(busybox, target.parent))
    sh = root / "bin" / "sh"
    if not (sh.exists() or sh.is_symlink()):
        sh.symlink_to("busybox")


def _alternatives(root: Path) -> None:
    """What update-alternatives would have linked: iptables as its nft variant."""
    sbin = root / "usr" / "sbin"
    for name in (
        "iptables",
        "iptables-save",
        "iptables-restore",
        "ip6tables",
        "ip6tables-save",
        "ip6tables-restore",
    ):
        link = sbin / name
        if not (link.exists() or link.is_symlink()) and (sbin / "xtables-nft-multi").exists():
            link.symlink_to("xtables-nft-multi")


def _ca_bundle(root: Path) -> None:
    """/etc/ssl/certs/ca-certificates.crt from the ca-certificates package (its postinst would make it)."""
    certs = sorted((root / "usr" / "share" / "ca-certificates").rglob("*.crt"))
    bundle = root / "etc" / "ssl" / "certs" / "ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_bytes(b"".join(c.read_bytes().rstrip(b"\n") + b"\n" for c in certs))


_ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
    "etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    "etc/hostname": "localhost\n",
    "etc/resolv.conf": "nameserver 10.0.2.3\n",
    "etc/fstab": "",
}


def _node_files(root: Path, agent: Path, manifest: bytes) -> None:
    for relative, text in _ETC.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.write_text(text)
    for directory in ("proc", "sys", "dev", "run", "tmp", "mnt", "root", "var/lib/socialweb-node", "var/tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var" / "tmp").chmod(0o1777)
    (root / "root").chmod(0o700)
    target = root / AGENT_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(agent, target)
    target.chmod(0o755)
    init = root / "sbin" / "socialweb-init"
    init.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SCRIPTS / "node-init", init)
    init.chmod(0o755)
    inside = root / MANIFEST_IN_ROOTFS
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_bytes(manifest)


def _stage(root: Path, files: tuple[config_mod.StagedFile, ...]) -> None:
    for staged in files:
        target = root / staged.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.is_dir():
            raise BuildError(f"staged file {staged.path}: a package already has a directory or link there")
        shutil.copyfile(staged.source, target)
        target.chmod(staged.mode)


def _copy_modules(kernel_root: Path, root: Path, version: str) -> None:
    source = kernel_root / "lib" / "modules" / version
    depmod(kernel_root, version)
    deps = _modules_dep(source)
    wanted = [
        m
        for m in deps
        if m.startswith(ROOTFS_MODULE_DIRS) and (not m.startswith("kernel/drivers/net/") or m.count("/") == 3)
    ]
    chosen: set[str] = set()
    for module in wanted:
        chosen.add(module)
        chosen.update(deps[module])
    target = root / "lib" / "modules" / version
    for module in sorted(chosen):
        (target / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / module, target / module)
    for index in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (source / index).exists():
            shutil.copy2(source / index, target / index)
    depmod(root, version)


def _disk_usage_mib(root: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            total += st.st_blocks * 512 if not stat.S_ISLNK(st.st_mode) else 4096
        total += 4096 * (len(_dirs) + 1)
    return (total >> 20) + 1


def _initramfs(root: Path, kernel_root: Path, version: str, out: Path) -> None:
    tree = out.parent / "initramfs.tree"
    (tree / "bin").mkdir(parents=True)
    for directory in ("proc", "sys", "dev", "newroot", "modules"):
        (tree / directory).mkdir()
    shutil.copy2(root / "bin" / "busybox", tree / "bin" / "busybox")
    shutil.copyfile(SCRIPTS / "initramfs-init", tree / "init")
    (tree / "init").chmod(0o755)
    modules = kernel_root / "lib" / "modules" / version
    order = module_load_order(modules, INITRAMFS_MODULES)
    for module in order:
        shutil.copy2(modules / module, tree / "modules" / Path(module).name)
    (tree / "modules.order").write_text("".join(Path(m).name + "\n" for m in order))
    cpio.write(tree, out, char_devices=(("dev/console", 5, 1), ("dev/null", 1, 3)))
    shutil.rmtree(tree)


def mkfs(root: Path, out: Path, size_mib: int, label: str = "socialweb-root") -> None:
    with open(out, "wb") as f:
        f.truncate(size_mib << 20)
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            label,
            "-m",
            "0",
            "-b",
            "4096",
            "-E",
            "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1",
            "-d",
            str(root),
            str(out),
        ],
        "making the root filesystem",
    )


def build(
    config: config_mod.ImageConfig,
    manifest: dict[str, Any],
    out: Path,
    cache: Path,
    *,
    progress: Progress,
    refresh: bool = False,
) -> Parts:
    """Writes vmlinux, initramfs.cpio.gz and rootfs.ext4 into `out` (an empty scratch directory)."""
    import orjson

    config_mod.check_staged_files(config)
    agent = config_mod.agent_binary(config)

    def log(message: str) -> None:
        progress("packages", message)

    progress(
        "packages",
        f"kernel {config.kernel} and {len(config.all_packages)} packages from Debian {config.suite}",
    )
    try:
        kdeb = kernel_deb(config, cache, refresh=refresh, log=log)
        debs = debian.closure(config.all_packages, config.suite, cache, refresh=refresh, log=log)
    except debian.ArchiveError as exc:
        raise BuildError(f"packages: {exc}") from None

    progress("kernel", kdeb.name)
    kernel_root = out / "kernel.tree"
    kernel_root.mkdir()
    debian.extract(kdeb, kernel_root)
    vmlinuz = sorted((kernel_root / "boot").glob("vmlinuz-*"))
    if not vmlinuz:
        raise BuildError(f"{kdeb.name} holds no /boot/vmlinuz")
    version = vmlinuz[0].name.removeprefix("vmlinuz-")
    extract_vmlinux(vmlinuz[0], out / "vmlinux")

    root = out / "rootfs.tree"
    root.mkdir()
    packages: dict[str, str] = {}
    for index, deb in enumerate(debs, 1):
        progress("root filesystem", f"unpacking {deb.name} ({index}/{len(debs)})")
        debian.extract(deb, root)
        name, _, rest = deb.name.partition("_")
        packages[name] = rest.rsplit("_", 1)[0].replace("%3a", ":")
    progress("root filesystem", f"modules of Linux {version}, the node agent, the init")
    _busybox_links(root)
    _alternatives(root)
    _ca_bundle(root)
    _copy_modules(kernel_root, root, version)
    inside = {**manifest, "kernelVersion": version, "packages": packages}
    _node_files(root, agent, orjson.dumps(inside, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    _stage(root, config.files)

    progress("initramfs", f"busybox and {', '.join(INITRAMFS_MODULES)}")
    _initramfs(root, kernel_root, version, out / "initramfs.cpio.gz")
    shutil.rmtree(kernel_root)

    content = _disk_usage_mib(root)
    needed = content + ROOTFS_HEADROOM_MIB
    if config.rootfs_mib < needed:
        raise BuildError(
            f"rootfsMiB {config.rootfs_mib} cannot hold the node's own files ({content} MiB) and the "
            f"{ROOTFS_HEADROOM_MIB} MiB a node needs before its first image: make rootfsMiB at least "
            f"{needed}, and size it for the jobs' images and build output on top (docs/node.md)"
        )
    progress("mkfs.ext4", f"{config.rootfs_mib} MiB, {content} MiB of files")
    mkfs(root, out / "rootfs.ext4", config.rootfs_mib)
    shutil.rmtree(root)
    return Parts(kernel_version=version, packages=packages, content_mib=content)


def prefetch(config: config_mod.ImageConfig, cache: Path, log: Callable[[str], None]) -> None:
    """Downloads what a build of `config` needs into the cache (no image is built)."""
    kernel_deb(config, cache, refresh=False, log=log)
    debian.closure(config.all_packages, config.suite, cache, log=log)


def main(argv: list[str] | None = None) -> int:
    from socialweb_computer.node import build as node_build

    parser = argparse.ArgumentParser(
        prog="python -m socialweb_computer.guest.build",
        description="Fill the package cache a guest image build reads (scripts/bootstrap.sh runs this).",
    )
    parser.add_argument("--download-only", action="store_true", required=True)
    parser.add_argument("--config", default=None, help="an image config (default: the built-in one)")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    cache = args.cache_dir or node_build.default_cache_dir()

    def log(message: str) -> None:
        print(f"guest-build: {message}", file=sys.stderr)

    try:
        prefetch(config_mod.load(args.config), cache, log)
    except (BuildError, debian.ArchiveError, config_mod.ImageConfigError, OSError) as exc:
        log(f"error: {exc}")
        return 1
    log(f"the guest image's packages are in {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
