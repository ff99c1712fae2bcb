"""Writes that a crash or a concurrent reader never sees half done, for install and upgrade.

Every file and link is written under a temporary name in the same directory and renamed over
the final name: rename(2) replaces atomically, so the user manager, the gateway or an operator
reads either the old version or the new one, never a mix.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def _scratch(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Put `data` at `path` with `mode`; the mode is set before any byte is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = _scratch(path)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(scratch, path)
    except OSError:
        scratch.unlink(missing_ok=True)
        raise


def link_atomic(link: Path, target: str | Path) -> None:
    """Make `link` a symlink to `target`, replacing what was there in one rename."""
    link.parent.mkdir(parents=True, exist_ok=True)
    scratch = _scratch(link)
    os.symlink(target, scratch)
    try:
        os.replace(scratch, link)
    except OSError:
        scratch.unlink(missing_ok=True)
        raise


def read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def link_target(link: Path) -> str | None:
    try:
        return os.readlink(link)
    except (FileNotFoundError, OSError):
        return None


def restore(path: Path, data: bytes | None, mode: int) -> None:
    """Put back what `read_or_none` returned: the old bytes, or no file at all."""
    if data is None:
        path.unlink(missing_ok=True)
    else:
        write_atomic(path, data, mode)
