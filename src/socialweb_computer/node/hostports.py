"""Host ports a node may reach, at the same address inside the node: 127.0.0.1:<port>.

A node lives in its own network (a sandbox's network namespace, a guest's user-mode
network) and may not reach the host's loopback at large: the gateway's HTTP API, other
tenants' listeners and anything else bound there stay out of reach. It reaches exactly
the ports it is given — its cluster's apiserver and the registries the gateway spec names
— and, so that URLs and image references mean the same inside and outside, it reaches them
at the same `127.0.0.1:<port>`:

    sandbox:  127.0.0.1:6444 ──► (unix socket <dir>/6444.sock) ──► host: 127.0.0.1:6444
    microVM:  127.0.0.1:6444 ──► 10.0.2.2:6444 (QEMU's user network) ──► the node's namespace
              127.0.0.1:6444 ──► (the QEMU supervisor) ──► host: 127.0.0.1:6444

`serve_in_node()` runs inside the node (started by `node/boot.py`), over unix sockets (a
sandbox, which shares the host's filesystem) or over TCP to the address where the user
network puts the host (a guest); `serve_on_host()` runs in the host's network namespace
(the sandbox supervisor; the QEMU supervisor listens with `serve_sockets()`). Bytes are
copied as they are: TLS stays end to end between the agent and its apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

log = logging.getLogger(__name__)

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
_CHUNK = 256 << 10


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()  # back-pressure: never buffer more than the peer takes
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Connect) -> None:
    """Connects to the other side and copies both ways until both directions are done."""
    try:
        upstream_reader, upstream_writer = await connect()
    except OSError as exc:
        log.info("forwarding failed: %s", exc)
        writer.close()
        return
    try:
        await asyncio.gather(_copy(reader, upstream_writer), _copy(upstream_reader, writer))
    finally:
        for w in (writer, upstream_writer):
            w.close()
            with contextlib.suppress(OSError, ConnectionError):
                await w.wait_closed()


def socket_path(directory: Path, port: int) -> Path:
    return directory / f"{port}.sock"


def _unix(path: Path) -> Connect:
    return lambda: asyncio.open_unix_connection(str(path))


def _tcp(host: str, port: int) -> Connect:
    return lambda: asyncio.open_connection(host, port)


async def serve_in_node(
    ports: list[int], socket_dir: Path | None, *, host_address: str = ""
) -> list[asyncio.Server]:
    """Listens on the node's 127.0.0.1:<port> for each port, forwarding to the host's side.

    The host's side is a unix socket per port in `socket_dir` (a sandbox) or, with
    `host_address`, that address and the same port over TCP (a guest).
    """
    servers = []
    for port in ports:
        if host_address:
            connect = _tcp(host_address, port)
        else:
            assert socket_dir is not None
            connect = _unix(socket_path(socket_dir, port))

        async def handle(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Connect = connect
        ) -> None:
            await pipe(reader, writer, connect)

        servers.append(await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True))
    return servers


async def serve_sockets(
    listeners: dict[int, socket.socket], connect_for: Callable[[int], Connect]
) -> list[asyncio.Server]:
    """Serves listening sockets made elsewhere (in another network namespace), one per port."""
    servers = []
    for port, listener in listeners.items():
        connect = connect_for(port)

        async def handle(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Connect = connect
        ) -> None:
            await pipe(reader, writer, connect)

        servers.append(await asyncio.start_server(handle, sock=listener))
    return servers


async def serve_on_host(ports: list[int], socket_dir: Path) -> list[asyncio.Server]:
    """Listens on one unix socket per port (0600), forwarding to the host's 127.0.0.1:<port>."""
    socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    servers = []
    for port in ports:
        path = socket_path(socket_dir, port)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

        async def handle(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int = port
        ) -> None:
            await pipe(reader, writer, _tcp("127.0.0.1", port))

        servers.append(await asyncio.start_unix_server(handle, str(path)))
        path.chmod(0o600)
    return servers
