"""Tenants in worker processes: the gateway on more than one core.

With `workers: N` (N > 1) the gateway process keeps the store's ownership, the admin plane,
the Cluster controller and the HTTP API, and N worker processes serve the tenants:

    gateway (supervisor) ── admin plane, Cluster controller, HTTP API, compaction, checkpoints
      ├── worker 0 ──  listeners and control planes of the tenants whose name hashes to 0
      └── worker 1 ──  ... to 1

A tenant always goes to worker `hash(name) % N`, so nothing about placement is stored and a
gateway restarted with another N simply places them again. Every process opens the same store
(SQLite as one owner and N members of the file, storage/sqlite.py; or etcd, which has many
clients anyway), and each writes only its own tenants' keys, so a tenant's watches hear every
write to it. Ports, CAs, URLs and gateway.json are what they are with one process: the
controller allocates ports and writes each cluster's files as before, and a worker only binds
the listener and runs the control plane.

The controller talks to a worker through `RemoteTenant`, which answers what it asks of an
in-process `tenants.TenantPlane` (listen, load, stop, limits, node count, problems); the worker
pushes node counts, problems and the operator's view of its tenants (observer.py) back.

A worker that dies is started again (at once, then backing off while it keeps dying) and its
tenants come back on their ports (the controller brings each up again; `instance` + 1). A
worker ends with the gateway: on its control socket closing, on the parent-death signal, or,
where neither can tell (the single-file binary's bootloader sits between them), when a
once-a-second look finds the gateway gone.

Messages are length-prefixed pickles over a socketpair between the gateway and a child it
started itself; nothing else can write to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import hashlib
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from socialweb_computer import binary, logs
from socialweb_computer.apiserver import fairness
from socialweb_computer.bidders import base as bidders_base
from socialweb_computer.clusterprovider import layout
from socialweb_computer.gateway import observer, tenants
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.storage import base as storage
from socialweb_computer.storage import sqlite

log = logging.getLogger(__name__)

WORKER_COMMAND = ("internal", "gateway-worker")
START_TIMEOUT = 60.0  # a worker's interpreter and imports, on a busy machine
RESTART_BASE = 0.5  # seconds before starting again a worker that died soon after its start
RESTART_MAX = 30.0
STABLE_AFTER = 30.0  # a worker that ran this long is restarted at once when it dies
STOP_TIMEOUT = 10.0  # a worker still running this long after being told to exit is killed
VIEW_FLUSH = 0.25  # seconds a worker gathers view changes before it sends them
PARENT_CHECK = 1.0  # seconds between a worker's looks at whether the gateway still runs
_PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("!I")


def lane_of(name: str, count: int) -> int:
    """The worker that serves cluster `name`: fixed by the name, so placement is never stored.
    (Not CRC-32: it is linear, so names that differ in one character share its low bits.)"""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest()) % count


def resolve_count(wanted: int) -> int:
    """`workers: auto` (0) is one worker per core, and 1 (in-process) on a single core."""
    return wanted if wanted > 0 else max(1, os.cpu_count() or 1)


class WorkerLost(Exception):
    """The worker process serving a tenant is gone (it is being started again)."""


class WorkerError(Exception):
    """A worker could not do what it was asked; the message is its error."""


# ------------------------------------------------------------------ framing


def _frame(message: dict[str, Any]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


async def _read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None once the other side has gone."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        message: dict[str, Any] = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return message


def _log_settings() -> tuple[str, str]:
    root = logging.getLogger()
    fmt = "json" if any(isinstance(h.formatter, logs.JsonFormatter) for h in root.handlers) else "text"
    return logging.getLevelName(root.level), fmt


# ------------------------------------------------------------------ the gateway's side


class WorkerPool:
    """N worker processes; `lane(name)` is the one that serves a cluster."""

    def __init__(self, state: layout.StateLayout, spec: spec_mod.GatewaySpec, count: int) -> None:
        self.state = state
        self.spec = spec
        self.workers = [Worker(self, index) for index in range(count)]
        self.closing = False
        # Set by the Cluster controller: called with the names of a dead worker's tenants, and
        # with a worker's index once it serves again after a restart.
        self.on_lost: Callable[[list[str]], None] = lambda names: None
        self.on_restarted: Callable[[int], None] = lambda index: None

    def lane(self, name: str) -> Worker:
        return self.workers[lane_of(name, len(self.workers))]

    async def launch(self) -> None:
        """Start the processes: their interpreters load while the gateway opens its store."""
        try:
            await asyncio.gather(*(worker.launch() for worker in self.workers))
        except BaseException:
            await self.close()
            raise

    async def start(self) -> None:
        """Once the gateway owns the store: each worker opens it and is ready for tenants."""
        try:
            await asyncio.gather(*(worker.start() for worker in self.workers))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self.closing = True
        await asyncio.gather(*(worker.close() for worker in self.workers), return_exceptions=True)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers if w.process is not None and w.process.returncode is None]


class Worker:
    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.up = asyncio.Event()  # set while the process serves requests
        self.tenants: dict[str, RemoteTenant] = {}
        self.restarts = 0
        self._writer: asyncio.StreamWriter | None = None
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_call = 0
        self._reading: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._started_at = 0.0

    async def launch(self) -> None:
        await self._launch()

    async def start(self) -> None:
        await self._ready()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"gateway-worker-{self.index}")

    async def _spawn(self) -> None:
        await self._launch()
        await self._ready()

    async def _launch(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            argv = [*binary.self_argv(), *WORKER_COMMAND, "--fd", str(theirs.fileno()),
                    "--parent", str(os.getpid())]
            self.process = await asyncio.create_subprocess_exec(
                *argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=mine)
        self._reading = asyncio.get_running_loop().create_task(self._read_replies(reader))
        self._send({"op": "init", "index": self.index, "state": self.state_root, "spec": self.pool.spec,
                    "log": _log_settings()})

    async def _ready(self) -> None:
        assert self.process is not None
        try:
            await asyncio.wait_for(self._call("ready", {}), START_TIMEOUT)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
            raise
        self._started_at = asyncio.get_running_loop().time()
        self.up.set()
        log.info("gateway worker %d started (pid %d)", self.index, self.process.pid)

    @property
    def state_root(self) -> str:
        return self.pool.state.root

    async def _supervise(self) -> None:
        delay = RESTART_BASE
        while True:
            assert self.process is not None
            code = await self.process.wait()
            self.up.clear()
            if self._reading is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reading
            if self.pool.closing:
                return
            lost = list(self.tenants)
            self.tenants.clear()
            log.warning("gateway worker %d (pid %d) exited with status %s; starting it again, and its "
                        "%d clusters with it", self.index, self.process.pid, code, len(lost))
            self.pool.on_lost(lost)
            loop = asyncio.get_running_loop()
            if loop.time() - self._started_at >= STABLE_AFTER:
                delay = 0.0
            while not self.pool.closing:
                await asyncio.sleep(delay)
                delay = min(max(delay * 2, RESTART_BASE), RESTART_MAX)
                try:
                    await self._spawn()
                except Exception as e:
                    log.warning("gateway worker %d could not be started again (retry in %.1fs): %s",
                                self.index, delay, e)
                    continue
                self.restarts += 1
                self.pool.on_restarted(self.index)
                break

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while (message := await _read(reader)) is not None:
                if "id" in message:
                    future = self._calls.pop(message["id"], None)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif message["op"] == "tenant":
                    tenant = self.tenants.get(message["name"])
                    if tenant is not None:
                        tenant.changed(message["nodes"], message["problems"], message["auth"])
                elif message["op"] == "views":
                    self._apply_views(message)
        finally:
            if self._writer is not None:
                self._writer.close()
            for future in self._calls.values():
                if not future.done():
                    future.set_exception(WorkerLost(f"gateway worker {self.index} exited"))
            self._calls.clear()

    def _apply_views(self, message: dict[str, Any]) -> None:
        for name, (attached, nodes, pods) in message["views"].items():
            tenant = self.tenants.get(name)
            if tenant is not None:
                tenant.view.replace(attached, nodes, pods)
        for row, key in message["events"]:
            tenant = self.tenants.get(row.cluster)
            if tenant is not None:
                tenant.view.add_event(row, key)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.write(_frame(message))

    async def _call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self._next_call += 1
        call = self._next_call
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[call] = future
        self._send({"op": op, "id": call, **args})
        reply = await future
        if "error" in reply:
            kind, number, text = reply["error"]
            if kind == "OSError":
                raise OSError(number, text)
            raise WorkerError(text)
        return reply

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Ask the worker (WorkerLost while it is being started again: the pool says when it is back)."""
        if not self.up.is_set():
            raise WorkerLost(f"gateway worker {self.index} is not running")
        return await self._call(op, args)

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(Exception):
                self._send({"op": "exit"})
            try:
                await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                log.warning("gateway worker %d did not exit in %gs; killing it", self.index, STOP_TIMEOUT)
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading


class RemoteView(observer.TenantView):
    """A TenantView kept current by the worker that serves the tenant."""

    __slots__ = ()

    def replace(self, attached: bool, nodes: list[observer.NodeRow], pods: list[observer.PodRow]) -> None:
        rows = {row.name: row for row in nodes}
        if self._boots is not None:  # node boot times (observer.NodeBoots), to within a VIEW_FLUSH
            for gone in self.nodes.keys() - rows.keys():
                self._boots.gone(self.cluster, gone)
            for row in nodes:
                if row.ready == "True":
                    if self.attached:
                        self._boots.ready(self.cluster, row.name)
                    else:
                        self._boots.already_ready(self.cluster, row.name)
        self.nodes = rows
        self.pods = {(row.namespace, row.name): row for row in pods}
        self.attached = attached
        self._changes.bump()

    def add_event(self, row: observer.EventRow, key: tuple[str, ...]) -> None:
        self._events.add(row, key)


class RemoteTenant:
    """What the Cluster controller holds for a tenant a worker serves (tenants.TenantPlane's face)."""

    def __init__(self, record: layout.ClusterRecord, worker: Worker, view: RemoteView,
                 limits: fairness.Limits, on_changed: Callable[[str], None]) -> None:
        self.record = record
        self.worker = worker
        self.view = view
        self.node_count = 0
        self._problems: list[str] = []
        self._auth_problems: list[str] = []
        self._limits = limits
        self._loaded = False
        self._on_changed = on_changed

    @property
    def lane(self) -> int:
        return self.worker.index

    @property
    def loaded(self) -> bool:
        return self._loaded

    def problems(self) -> list[str]:
        return list(self._problems)

    def auth_problems(self) -> list[str]:
        return list(self._auth_problems)

    async def start(self) -> None:
        await self.listen()
        await self.load()

    async def listen(self) -> None:
        name = self.record.name
        self.worker.tenants[name] = self  # before the reply: the worker may report on it at once
        try:
            reply = await self.worker.call("listen", record=self.record, limits=self._limits)
        except BaseException:
            self._forget()
            raise
        self.node_count = reply["nodes"]

    async def load(self) -> None:
        reply = await self.worker.call("load", name=self.record.name)
        self._loaded = True
        self.changed(reply["nodes"], reply["problems"], reply["auth"], quiet=True)

    async def stop(self) -> None:
        was_mine = self._forget()
        if was_mine:
            with contextlib.suppress(WorkerLost, WorkerError):
                await self.worker.call("stop", name=self.record.name)

    async def set_limits(self, limits: fairness.Limits) -> None:
        if limits == self._limits:
            return
        self._limits = limits
        with contextlib.suppress(WorkerLost, WorkerError):
            await self.worker.call("limits", name=self.record.name, limits=limits)

    def changed(self, nodes: int, problems: list[str], auth: list[str], *, quiet: bool = False) -> None:
        moved = nodes != self.node_count or problems != self._problems
        self.node_count, self._problems, self._auth_problems = nodes, list(problems), list(auth)
        if moved and not quiet:
            self._on_changed(self.record.name)

    def _forget(self) -> bool:
        if self.worker.tenants.get(self.record.name) is self:
            del self.worker.tenants[self.record.name]
            return True
        return False


# ------------------------------------------------------------------ the worker's side


async def open_member_store(spec: spec_mod.GatewaySpec, state: layout.StateLayout) -> storage.Backend:
    """The store as a worker opens it: beside the gateway, which owns it and compacts it."""
    if spec.etcd is None:
        return await sqlite.SqliteBackend.open(state.database, history_limit=spec.history_limit,
                                               shared=True, owner=False)
    from socialweb_computer.storage import etcd

    settings = spec.etcd
    return await etcd.EtcdBackend.open(
        settings.endpoints, prefix=settings.key_prefix, ca_file=settings.ca_file,
        cert_file=settings.cert_file, key_file=settings.key_file,
        request_timeout=settings.request_timeout, history_limit=spec.history_limit, compact_interval=0,
    )


class _Marked(observer.Changes):
    """A tenant's view moved: tell the relay which one."""

    def __init__(self, relay: _ViewRelay, name: str) -> None:
        super().__init__()
        self._relay = relay
        self._name = name

    def bump(self) -> None:
        self._relay.mark(self._name)


class _Relayed(observer.EventLog):
    """A tenant's Events go to the gateway's EventLog, through the relay."""

    def __init__(self, relay: _ViewRelay, changes: _Marked) -> None:
        super().__init__(changes, size=1)
        self._relay = relay

    def add(self, row: observer.EventRow, key: tuple[str, ...] = ()) -> None:
        self._relay.events.append((row, key))
        self._changes.bump()


class _ViewRelay:
    """Gathers the worker's view changes and sends them to the gateway every VIEW_FLUSH."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self.views: dict[str, observer.TenantView] = {}
        self._dirty: set[str] = set()
        self.events: list[tuple[observer.EventRow, tuple[str, ...]]] = []
        self._flushing: asyncio.TimerHandle | None = None

    def view_for(self, name: str) -> observer.TenantView:
        changes = _Marked(self, name)
        view = observer.TenantView(name, changes, _Relayed(self, changes))
        self.views[name] = view
        return view

    def mark(self, name: str) -> None:
        self._dirty.add(name)
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().call_later(VIEW_FLUSH, self.flush)

    def flush(self) -> None:
        self._flushing = None
        views = {name: (view.attached, list(view.nodes.values()), list(view.pods.values()))
                 for name in self._dirty if (view := self.views.get(name)) is not None}
        events, self.events = self.events, []
        self._dirty.clear()
        self._send({"op": "views", "views": views, "events": events})


class WorkerHost:
    """The worker process: its tenants, by name, and the requests the gateway sends it."""

    def __init__(self, index: int, state: layout.StateLayout, spec: spec_mod.GatewaySpec,
                 writer: asyncio.StreamWriter) -> None:
        self.index = index
        self.state = state
        self.spec = spec
        self.tenants: dict[str, tenants.TenantPlane] = {}
        self._writer = writer
        self._backend: storage.Backend | None = None
        self._relay = _ViewRelay(self.send)

    def send(self, message: dict[str, Any]) -> None:
        if not self._writer.is_closing():
            self._writer.write(_frame(message))

    async def handle(self, message: dict[str, Any]) -> None:
        handler: Callable[..., Awaitable[dict[str, Any]]] = getattr(self, "_op_" + message.pop("op"))
        call = message.pop("id")
        try:
            reply = await handler(**message)
        except OSError as e:
            reply = {"error": ("OSError", e.errno or 0, e.strerror or str(e))}
        except Exception as e:
            log.exception("gateway worker %d: %s failed", self.index, handler.__name__)
            reply = {"error": ("Exception", 0, f"{type(e).__name__}: {e}")}
        self.send({"id": call, **reply})

    async def _op_ready(self) -> dict[str, Any]:
        if self._backend is None:
            self._backend = await open_member_store(self.spec, self.state)
        return {}

    async def _op_listen(self, record: layout.ClusterRecord, limits: fairness.Limits) -> dict[str, Any]:
        assert self._backend is not None
        name = record.name
        old = self.tenants.pop(name, None)
        if old is not None:  # the gateway lost track of it (a stop that did not arrive): start afresh
            await old.stop()
        forget = getattr(self._backend, "forget_counts", None)
        if forget is not None:  # another process may have written there since this one last did
            forget(f"/{name}/")
        tenant = tenants.TenantPlane(
            record, self.state.cluster_pki(name), self._backend, self.spec.address,
            lambda _: self._report(name), bidders_base.NodeDirectory(Path(self.state.root), name),
            self._relay.view_for(name), limits=limits, connections=self.spec.connections,
        )
        await tenant.listen()
        self.tenants[name] = tenant
        return {"nodes": tenant.node_count}

    async def _op_load(self, name: str) -> dict[str, Any]:
        tenant = self.tenants[name]
        await tenant.load()
        gc.freeze()  # as the gateway does after a start (controller.py)
        return {"nodes": tenant.node_count, "problems": tenant.problems(), "auth": tenant.auth_problems()}

    async def _op_stop(self, name: str) -> dict[str, Any]:
        tenant = self.tenants.pop(name, None)
        self._relay.views.pop(name, None)
        if tenant is not None:
            await tenant.stop()
        return {}

    async def _op_limits(self, name: str, limits: fairness.Limits) -> dict[str, Any]:
        tenant = self.tenants.get(name)
        if tenant is not None:
            await tenant.set_limits(limits)
        return {}

    def _report(self, name: str) -> None:
        tenant = self.tenants.get(name)
        if tenant is not None:
            self.send({"op": "tenant", "name": name, "nodes": tenant.node_count,
                       "problems": tenant.problems(), "auth": tenant.auth_problems()})

    async def close(self) -> None:
        await tenants.stop_all(list(self.tenants.values()))
        self.tenants.clear()
        if self._backend is not None:
            await self._backend.close()


def _die_with_parent() -> None:
    """SIGTERM when the process that started this one dies (Linux's parent-death signal)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie nobody reaped yet is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def serve(fd: int, parent: int) -> None:
    """A worker process's life: until the gateway says exit, goes away, or signals it."""
    _die_with_parent()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    init = await _read(reader)
    if init is None or init.get("op") != "init":
        return
    logs.configure(*init["log"])
    host = WorkerHost(init["index"], layout.StateLayout(init["state"]), init["spec"], writer)
    running: set[asyncio.Task[None]] = set()

    async def requests() -> None:
        while (message := await _read(reader)) is not None and message.get("op") != "exit":
            task = loop.create_task(host.handle(message))
            running.add(task)
            task.add_done_callback(running.discard)

    async def parent_gone() -> None:
        while _alive(parent):
            await asyncio.sleep(PARENT_CHECK)

    waiting = [loop.create_task(c) for c in (requests(), parent_gone(), stop.wait())]
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*waiting, *running):
            task.cancel()
        await asyncio.gather(*waiting, *running, return_exceptions=True)
        try:
            await asyncio.wait_for(host.close(), STOP_TIMEOUT)
        finally:
            writer.close()
