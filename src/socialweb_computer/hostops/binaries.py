"""The versioned binaries under ~/.local/lib/socialweb-computer: verify, stage, switch, prune.

A candidate is verified before anything changes: its SHA-256 against the one the operator
gave, then it is run (`version -o json`) to prove it executes on this host and to learn its
version.  It is then copied into `versions/<version>-<sha256[:12]>/`, whose name is never
reused for other bytes, and `current` is switched to it with one rename(2).  install and
upgrade call these; the stable path ~/.local/bin/socialweb-computer goes through `current`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from socialweb_computer import binary as binary_mod
from socialweb_computer.hostops import HostOpsError, files
from socialweb_computer.hostops import layout as layout_mod

_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
PROBE_TIMEOUT = 60  # the single-file binary unpacks itself before it answers


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A verified binary: where it is, its digest and the version it reports."""

    path: Path
    sha256: str
    version: str

    @property
    def dirname(self) -> str:
        return f"{self.version}-{self.sha256[:12]}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def normalize_sha256(value: str) -> str:
    text = value.strip().lower()
    if not _SHA256.fullmatch(text):
        raise HostOpsError(f"--sha256 must be 64 hex digits (the first field of the .sha256 file), "
                           f"got {value!r}")
    return text


def verify(path: Path, expected_sha256: str | None) -> Candidate:
    """Check `path` before it is installed; the SHA-256 first, so nothing unverified runs."""
    if not path.is_file():
        raise HostOpsError(f"--binary {path}: no such file")
    actual = sha256_of(path)
    if expected_sha256 is not None and actual != normalize_sha256(expected_sha256):
        raise HostOpsError(f"--binary {path} has SHA-256 {actual}, not {expected_sha256}: refusing it "
                           "(a corrupt upload or the wrong file); nothing was changed")
    if not os.access(path, os.X_OK):
        raise HostOpsError(f"--binary {path} is not executable (chmod 0755 it)")
    return Candidate(path=path.resolve(), sha256=actual, version=_probe_version(path))


def _probe_version(path: Path) -> str:
    try:
        result = subprocess.run([str(path), "version", "-o", "json"], capture_output=True, text=True,
                                env=binary_mod.child_env(), stdin=subprocess.DEVNULL,
                                timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostOpsError(f"--binary {path} does not run on this host: {e}") from None
    try:
        version = str(json.loads(result.stdout)["version"])
    except (ValueError, KeyError, TypeError):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise HostOpsError(f"--binary {path} is not a working socialweb-computer: `version -o json` exited "
                           f"{result.returncode} ({tail})") from None
    if not _VERSION.fullmatch(version):
        raise HostOpsError(f"--binary {path} reports the version {version!r}, which cannot name a directory")
    return version


def stage(layout: layout_mod.Layout, candidate: Candidate) -> Path:
    """Copy `candidate` to its version directory (kept as is when the same bytes are there already)."""
    target = layout.version_dir(candidate.dirname)
    installed = target / layout_mod.NAME
    if installed.is_file():
        if sha256_of(installed) == candidate.sha256:
            return target
        raise HostOpsError(f"{installed} exists with other bytes than its name says: remove {target} "
                           "and run the command again")
    layout.versions_dir.mkdir(parents=True, exist_ok=True)
    scratch = layout.versions_dir / f".{candidate.dirname}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o755)
    copy = scratch / layout_mod.NAME
    shutil.copyfile(candidate.path, copy)
    os.chmod(copy, 0o755)
    if sha256_of(copy) != candidate.sha256:
        shutil.rmtree(scratch, ignore_errors=True)
        raise HostOpsError(f"the copy of {candidate.path} in {layout.versions_dir} differs from it (a full "
                           "disk?); nothing was switched")
    os.replace(scratch, target)  # the version directory appears whole or not at all
    return target


def version_link(layout: layout_mod.Layout, version_dir: Path) -> str:
    """How `current` and `previous` name a version directory: relative, e.g. versions/0.1.0-abc."""
    return os.path.relpath(version_dir, layout.lib_dir)


def switch(layout: layout_mod.Layout, version_dir: Path) -> None:
    """Point `current` (and so the stable path) at `version_dir`, atomically."""
    files.link_atomic(layout.current, version_link(layout, version_dir))
    if files.link_target(layout.stable_binary) != layout.stable_target:
        files.link_atomic(layout.stable_binary, layout.stable_target)


def prune(layout: layout_mod.Layout) -> list[str]:
    """Remove every version directory but `current`'s and `previous`'s; returns the names removed."""
    keep = {os.path.basename(files.link_target(link) or "") for link in (layout.current, layout.previous)}
    removed = []
    for entry in sorted(layout.versions_dir.iterdir()):
        if entry.name not in keep and not entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


@contextmanager
def locked(layout: layout_mod.Layout) -> Iterator[None]:
    """One install or upgrade at a time per account; a second one refuses rather than waits."""
    layout.lib_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(layout.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HostOpsError(f"another install or upgrade is running ({layout.lock_file} is locked); "
                               "wait for it to finish") from None
        yield
    finally:
        os.close(fd)
