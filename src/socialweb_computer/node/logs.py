"""Container logs as a kubelet serves them: CRI log files read, followed and rotated.

containerd writes each container's output to `<pod log dir>/<container>/<attempt>.log`,
one record per line: `<RFC3339Nano> <stdout|stderr> <F|P> <text>` (P: a partial line,
split at 16 KiB or cut at exit). `read()` turns records back into the container's output
with the options of `kubectl logs` (timestamps, tailLines, sinceTime/sinceSeconds,
limitBytes, follow). containerd does not rotate: `Rotator` renames a file that passes the
size limit and asks containerd to reopen it (CRI ReopenContainerLog), keeping a bounded
number of rotated files, as a kubelet's `containerLogMaxSize`/`containerLogMaxFiles` do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

DEFAULT_MAX_SIZE = 10 << 20
DEFAULT_MAX_FILES = 5
_FOLLOW_POLL = 0.1


@dataclasses.dataclass(frozen=True)
class Record:
    timestamp: str  # as written (RFC3339Nano)
    stream: str
    partial: bool
    text: bytes

    @property
    def time(self) -> datetime.datetime:
        return parse_time(self.timestamp)


def parse_time(value: str) -> datetime.datetime:
    """RFC3339 with up to nanoseconds (Python keeps microseconds)."""
    value = value.rstrip("Z")
    if "." in value:
        head, fraction = value.split(".", 1)
        value = f"{head}.{fraction[:6].ljust(6, '0')}"
    return datetime.datetime.fromisoformat(value).replace(tzinfo=datetime.UTC)


def parse(line: bytes) -> Record | None:
    parts = line.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return None
    text = parts[3] if len(parts) == 4 else b""
    return Record(
        parts[0].decode(errors="replace"), parts[1].decode(errors="replace"), parts[2] == b"P", text
    )


@dataclasses.dataclass(frozen=True)
class Options:
    follow: bool = False
    timestamps: bool = False
    tail_lines: int | None = None
    since: datetime.datetime | None = None
    limit_bytes: int | None = None
    stream: str = ""  # "" = both


def _render(record: Record, options: Options, joined: bytes) -> bytes:
    text = joined + record.text + (b"" if record.partial else b"\n")
    if options.timestamps:
        return record.timestamp.encode() + b" " + text
    return text


def _records(data: bytes) -> list[Record]:
    out = []
    for line in data.splitlines():
        record = parse(line)
        if record is not None:
            out.append(record)
    return out


def _lines(records: list[Record], options: Options) -> list[tuple[Record, bytes]]:
    """Whole lines: a run of partial records joined to the full record that ends it."""
    lines: list[tuple[Record, bytes]] = []
    pending: dict[str, bytes] = {}
    for record in records:
        if options.stream and record.stream != options.stream:
            continue
        if options.since is not None and record.time < options.since:
            continue
        if record.partial:
            pending[record.stream] = pending.get(record.stream, b"") + record.text
            continue
        lines.append((record, pending.pop(record.stream, b"")))
    return lines


async def read(path: Path, options: Options, *, running: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The container's output from its log file; with `follow`, until it has stopped running."""
    remaining = options.limit_bytes
    try:
        handle = open(path, "rb")  # noqa: SIM115 - kept open while following
    except FileNotFoundError:
        return
    with handle:
        data = handle.read()
        complete, _, leftover = data.rpartition(b"\n")
        lines = _lines(_records(complete), options)
        if options.tail_lines is not None:
            lines = lines[-options.tail_lines :] if options.tail_lines > 0 else []
        for record, joined in lines:
            chunk = _render(record, options, joined)
            if remaining is not None:
                chunk = chunk[:remaining]
                remaining -= len(chunk)
            if chunk:
                yield chunk
            if remaining is not None and remaining <= 0:
                return
        if not options.follow:
            return
        pending = leftover
        inode = os.fstat(handle.fileno()).st_ino
        idle_after_exit = 0
        while True:
            more = handle.read()
            if more:
                idle_after_exit = 0
                pending += more
                complete, _, pending = pending.rpartition(b"\n")
                for record, joined in _lines(_records(complete), dataclasses.replace(options, since=None)):
                    chunk = _render(record, options, joined)
                    if remaining is not None:
                        chunk = chunk[:remaining]
                        remaining -= len(chunk)
                    if chunk:
                        yield chunk
                    if remaining is not None and remaining <= 0:
                        return
                continue
            if not running():
                idle_after_exit += 1
                if idle_after_exit > 3:  # containerd copies the last bytes just after the exit
                    return
            try:
                rotated = os.stat(path).st_ino != inode
            except FileNotFoundError:
                rotated = False
            if rotated:
                handle.close()
                handle = open(path, "rb")  # noqa: SIM115
                inode = os.fstat(handle.fileno()).st_ino
                continue
            await asyncio.sleep(_FOLLOW_POLL)


class Rotator:
    """Rotates container logs over `max_size`, keeping `max_files` files per container."""

    def __init__(
        self,
        reopen: Callable[[str], object],
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        self.reopen = reopen
        self.max_size = max_size
        self.max_files = max_files

    async def rotate(self, container_id: str, path: Path) -> bool:
        try:
            if path.stat().st_size < self.max_size:
                return False
        except FileNotFoundError:
            return False
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S.%f")
        path.rename(path.with_name(f"{path.name}.{stamp}"))
        await self.reopen(container_id)  # type: ignore[misc]
        rotated = sorted(path.parent.glob(f"{path.name}.*"))
        for old in rotated[: max(0, len(rotated) - (self.max_files - 1))]:
            old.unlink(missing_ok=True)
        return True
