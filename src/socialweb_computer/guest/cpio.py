"""The initramfs archive: a gzip-compressed cpio "newc" archive, as the kernel unpacks it.

Written by hand because nothing in the standard library writes cpio and the format the
kernel reads is small (Documentation/driver-api/early-userspace/buffer-format.rst): per
entry a 110-byte ASCII header of thirteen 8-digit hex fields, the NUL-terminated name, the
data, each padded to 4 bytes, and a `TRAILER!!!` entry at the end. Entries are written in
sorted order with fixed owners and times, so the same tree gives the same bytes.
"""

from __future__ import annotations

import gzip
import os
import stat
from pathlib import Path

_MAGIC = b"070701"
TRAILER = "TRAILER!!!"


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _entry(ino: int, mode: int, name: str, data: bytes, nlink: int = 1) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
    header = _MAGIC + b"".join(b"%08X" % value for value in fields) + encoded
    return header + _pad(len(header)) + data + _pad(len(data))


def _device(ino: int, name: str, mode: int, major: int, minor: int) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (ino, mode, 0, 0, 1, 0, 0, 0, 0, major, minor, len(encoded), 0)
    header = _MAGIC + b"".join(b"%08X" % value for value in fields) + encoded
    return header + _pad(len(header))


def write(root: Path, out: Path, *, char_devices: tuple[tuple[str, int, int], ...] = ()) -> None:
    """Archives the tree under `root` (regular files, directories, symlinks) into `out`.

    `char_devices` adds device nodes (name, major, minor), such as `dev/console`, which the
    kernel opens for the init's output before any filesystem is mounted.
    """
    chunks: list[bytes] = []
    ino = 1
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(directory) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(path).encode()
            elif stat.S_ISREG(st.st_mode):
                data = path.read_bytes()
            elif stat.S_ISDIR(st.st_mode):
                data = b""
            else:
                raise ValueError(f"{path}: only files, directories and symlinks go into an initramfs")
            nlink = 2 if stat.S_ISDIR(st.st_mode) else 1
            chunks.append(_entry(ino, st.st_mode, str(path.relative_to(root)), data, nlink))
            ino += 1
    for name, major, minor in char_devices:
        chunks.append(_device(ino, name, stat.S_IFCHR | 0o600, major, minor))
        ino += 1
    chunks.append(_entry(0, 0, TRAILER, b""))
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as f:
        for chunk in chunks:
            f.write(chunk)
