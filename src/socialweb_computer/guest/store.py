"""Guest images in the state directory, content-addressed by their fingerprint.

    <state>/images/sha256-<hex>/        one image (read-only files)
        manifest.json                   fingerprint, vcpu, memMiB, rootfsMiB, kernel, packages, inputs
        vmlinux  initramfs.cpio.gz  rootfs.ext4
    <state>/images/.build-<fp>-<pid>/   a build in progress (renamed into place when whole)
    <state>/images/.<fp>.lock           held while that fingerprint is being built

`ensure()` answers with one of three states: `present` (the image was already there: nothing
was done, which takes well under a second), `built` (this call built it) or `reused` (another
process was building the same image; this call waited for it and uses its result). An image is
whole or absent: a build writes a scratch directory and renames it into place, and a failed or
killed build leaves nothing that `ensure` would take for an image (scratch directories of dead
builds are removed by the next build of that fingerprint, or by `prune`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import orjson

from socialweb_computer.guest import build as build_mod
from socialweb_computer.guest import config as config_mod
from socialweb_computer.hostcheck import statedir

IMAGES = "images"
MANIFEST = "manifest.json"
FILES = {"kernel": "vmlinux", "initramfs": "initramfs.cpio.gz", "rootfs": "rootfs.ext4"}
_SCRATCH = ".build-"
# Room an image build needs beyond the image itself: the unpacked trees, the package cache.
BUILD_MARGIN_MIB = 1024


@dataclasses.dataclass
class BuildCounts:
    """Image builds this process ran (`built`, `failed`) or waited for another process's
    (`reused`); an image already there is not a build. One per process, `BUILDS`: the
    host's /metrics reads it (a qemu bidder builds inside the gateway)."""

    built: int = 0
    reused: int = 0
    failed: int = 0


BUILDS = BuildCounts()


@dataclasses.dataclass(frozen=True)
class Contents:
    """What the image directory holds now, whichever process wrote it: a listing, no reads."""

    images: int
    building: int  # builds in progress (a scratch directory whose process runs)


@dataclasses.dataclass(frozen=True)
class Image:
    directory: Path
    manifest: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    @property
    def kernel(self) -> Path:
        return self.directory / FILES["kernel"]

    @property
    def initramfs(self) -> Path:
        return self.directory / FILES["initramfs"]

    @property
    def rootfs(self) -> Path:
        return self.directory / FILES["rootfs"]

    @property
    def vcpu(self) -> int:
        return int(self.manifest["vcpu"])

    @property
    def mem_mib(self) -> int:
        return int(self.manifest["memMiB"])

    @property
    def rootfs_mib(self) -> int:
        return int(self.manifest["rootfsMiB"])

    def as_json(self, state: str) -> dict[str, Any]:
        return {
            "state": state,
            "fingerprint": self.fingerprint,
            "dir": str(self.directory),
            "kernel": str(self.kernel),
            "initramfs": str(self.initramfs),
            "rootfs": str(self.rootfs),
            "rootfsMiB": self.rootfs_mib,
            "vcpu": self.vcpu,
            "memMiB": self.mem_mib,
        }


class Progress:
    """Build progress on stderr: a bar on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty()
        self._last = ""

    def __call__(self, step: str, detail: str) -> None:
        if self.quiet:
            return
        number = build_mod.STEPS.index(step) + 1 if step in build_mod.STEPS else 0
        total = len(build_mod.STEPS)
        if self.tty:
            width = 24
            filled = width * (number - 1) // total
            bar = "#" * filled + "-" * (width - filled)
            line = f"[{bar}] {number}/{total} {step}: {detail}"
            columns = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r\x1b[K" + line[: columns - 1])
        else:
            self.stream.write(f"image: [{number}/{total}] {step}: {detail}\n")
        self.stream.flush()
        self._last = step

    def done(self, message: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[K")
        self.stream.write(f"image: {message}\n")
        self.stream.flush()


def _quiet(step: str, detail: str) -> None:
    pass


class Store:
    def __init__(self, state_dir: Path, *, cache_dir: Path | None = None) -> None:
        from socialweb_computer.node import build as node_build

        self.state_dir = Path(state_dir).resolve()
        self.root = self.state_dir / IMAGES
        self.cache_dir = cache_dir or node_build.default_cache_dir()

    # ---------------------------------------------------------------- reading

    def get(self, fingerprint: str) -> Image | None:
        directory = self.root / fingerprint
        try:
            manifest = orjson.loads((directory / MANIFEST).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if manifest.get("fingerprint") != fingerprint or not all(
            (directory / name).is_file() for name in FILES.values()
        ):
            return None
        return Image(directory, manifest)

    def images(self) -> list[Image]:
        if not self.root.is_dir():
            return []
        names = sorted(e.name for e in self.root.iterdir() if e.name.startswith("sha256-"))
        return [image for image in map(self.get, names) if image is not None]

    def contents(self) -> Contents:
        try:
            names = [entry.name for entry in os.scandir(self.root)]
        except OSError:
            return Contents(0, 0)
        return Contents(
            images=sum(1 for name in names if name.startswith("sha256-")),
            building=sum(1 for name in names if name.startswith(_SCRATCH) and _building(name)),
        )

    def fingerprint(self, config: config_mod.ImageConfig) -> tuple[str, dict[str, Any]]:
        document = config_mod.inputs(config, build_mod.recipe())
        return config_mod.fingerprint(document), document

    # ---------------------------------------------------------------- building

    def ensure(
        self,
        config: config_mod.ImageConfig,
        *,
        progress: Callable[[str, str], None] = _quiet,
        force: bool = False,
        refresh: bool = False,
    ) -> tuple[Image, str]:
        """The image of `config`, built when it is not stored yet; (image, state)."""
        config_mod.check_staged_files(config)
        fingerprint, inputs = self.fingerprint(config)
        if not force:
            image = self.get(fingerprint)
            if image is not None:
                return image, "present"
        statedir.require_room(
            str(self.state_dir), config.rootfs_mib + BUILD_MARGIN_MIB, "building a guest image"
        )
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        with self._lock(fingerprint) as waited:
            if not force:
                image = self.get(fingerprint)
                if image is not None:
                    if waited:
                        BUILDS.reused += 1
                    return image, "reused" if waited else "present"
            self._remove_scratch(fingerprint)
            try:
                image = self._build(config, fingerprint, inputs, progress, refresh)
            except Exception:
                BUILDS.failed += 1
                raise
            BUILDS.built += 1
            return image, "built"

    @contextlib.contextmanager
    def _lock(self, fingerprint: str) -> Iterator[bool]:
        path = self.root / f".{fingerprint}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            waited = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield waited
        finally:
            os.close(fd)

    def _remove_scratch(self, fingerprint: str) -> None:
        for entry in self.root.glob(f"{_SCRATCH}{fingerprint}-*"):
            shutil.rmtree(entry, ignore_errors=True)

    def _build(
        self,
        config: config_mod.ImageConfig,
        fingerprint: str,
        inputs: dict[str, Any],
        progress: Callable[[str, str], None],
        refresh: bool,
    ) -> Image:
        scratch = self.root / f"{_SCRATCH}{fingerprint}-{os.getpid()}"
        scratch.mkdir(mode=0o755)
        started = time.monotonic()
        manifest: dict[str, Any] = {
            "fingerprint": fingerprint,
            "vcpu": config.vcpu,
            "memMiB": config.mem_mib,
            "rootfsMiB": config.rootfs_mib,
            "inputs": inputs,
        }
        try:
            parts = build_mod.build(
                config, manifest, scratch, self.cache_dir, progress=progress, refresh=refresh
            )
            manifest.update(
                kernelVersion=parts.kernel_version,
                packages=parts.packages,
                contentMiB=parts.content_mib,
                builtAt=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                buildSeconds=round(time.monotonic() - started, 1),
            )
            (scratch / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
            for name in (*FILES.values(), MANIFEST):
                (scratch / name).chmod(0o444)
                with open(scratch / name, "rb") as f:
                    os.fsync(f.fileno())
            target = self.root / fingerprint
            if target.exists():  # --force over an existing image: running nodes keep the old files open
                trash = self.root / f"{_SCRATCH}{fingerprint}-old-{os.getpid()}"
                target.replace(trash)
                shutil.rmtree(trash, ignore_errors=True)
            scratch.replace(target)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        image = self.get(fingerprint)
        assert image is not None
        return image

    # ---------------------------------------------------------------- pruning

    def prune(self, in_use: set[str], *, keep: set[str] | None = None) -> list[tuple[str, int]]:
        """Removes images no running node uses (and not in `keep`); [(fingerprint, bytes freed)]."""
        removed = []
        keep = keep or set()
        if not self.root.is_dir():
            return removed
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if name.startswith("sha256-") and name not in in_use and name not in keep:
                with self._lock(name):
                    size = _allocated(entry)
                    shutil.rmtree(entry, ignore_errors=True)
                    (self.root / f".{name}.lock").unlink(missing_ok=True)
                removed.append((name, size))
            elif name.startswith(_SCRATCH) and not _building(name):
                shutil.rmtree(entry, ignore_errors=True)
        return removed


def _allocated(directory: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def _building(scratch_name: str) -> bool:
    """Whether the process that owns a scratch directory (its pid is the name's end) still runs."""
    pid = scratch_name.rsplit("-", 1)[-1]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()
