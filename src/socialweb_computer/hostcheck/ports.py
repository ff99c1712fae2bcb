"""The gateway's loopback ports: each must be free, or held by this state directory's running gateway.

Ports come from the gateway spec (listen.apiPort, listen.adminPort) and from the tenant
clusters recorded in the state directory (`clusters/<name>/cluster.json`, whose port a
restarted gateway binds again). A port is tried with a real bind, as the gateway binds it
(SO_REUSEADDR); when that fails, the listening socket's inode (from /proc/net/tcp and tcp6)
is looked up among the file descriptors of the pid in `gateway.json`: a match means "held by
this gateway". Otherwise the holder is named when this account can see it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.clusterprovider import layout
from socialweb_computer.hostcheck import context

TCP_LISTEN = "0A"


@dataclasses.dataclass(frozen=True)
class Port:
    label: str
    number: int
    ok: bool
    state: str


def planned(ctx: context.Context) -> list[tuple[str, int]]:
    ports = [("api", ctx.spec.api_port), ("admin", ctx.spec.admin_port)]
    state = layout.StateLayout(ctx.state_path)
    for name in state.cluster_names():
        # Read leniently (not layout.read_cluster): any record with a port says it is taken.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(os.path.join(state.cluster_dir(name), layout.CLUSTER_JSON), encoding="utf-8") as f:
                record = json.load(f)
            if isinstance(record.get("port"), int):
                ports.append((f"cluster {record.get('name') or name}", record["port"]))
    return ports


def listening_inodes(proc: str, port: int) -> set[int]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(os.path.join(proc, "net", table), encoding="ascii") as f:
            next(f, None)
            for line in f:
                fields = line.split()  # sl, local address:port (hex), remote, state, ..., inode
                local_port = int(fields[1].rsplit(":", 1)[1], 16) if len(fields) > 9 else -1
                if local_port == port and fields[3] == TCP_LISTEN:
                    inodes.add(int(fields[9]))
    return inodes


def socket_inodes(proc: str, pid: int) -> set[int]:
    fd_dir = os.path.join(proc, str(pid), "fd")
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def holders(proc: str, inodes: set[int]) -> list[int]:
    """Every process this account can see that has one of the sockets open."""
    pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    return [pid for pid in pids if inodes & socket_inodes(proc, pid)]


def gateway_pid(ctx: context.Context) -> int | None:
    """The pid in this state directory's gateway.json, when that process is alive."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(layout.StateLayout(ctx.state_path).gateway_json, encoding="utf-8") as f:
            pid = json.load(f).get("pid")
        if isinstance(pid, int) and pid > 0 and os.path.exists(os.path.join(ctx.proc, str(pid))):
            return pid
    return None


def _command(proc: str, pid: int) -> str:
    try:
        with open(os.path.join(proc, str(pid), "comm"), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"


def judge(ctx: context.Context, label: str, number: int) -> Port:
    if number == 0:
        return Port(label, number, True, "is 0: the gateway picks a free port at start")
    error = app_mod.bind_error(ctx.spec.address, number)
    if error is None:
        return Port(label, number, True, "free")
    if error.errno != errno.EADDRINUSE:
        return Port(label, number, False, f"cannot be bound: {error.strerror or error}")
    inodes = listening_inodes(ctx.proc, number)
    pid = gateway_pid(ctx)
    if pid is not None and inodes & socket_inodes(ctx.proc, pid):
        return Port(label, number, True, f"held by this gateway (pid {pid})")
    found = holders(ctx.proc, inodes) if inodes else []
    if found:
        who = ", ".join(f"pid {p} ({_command(ctx.proc, p)})" for p in found[:3])
        return Port(label, number, False, f"is taken by {who}")
    return Port(label, number, False, f"is taken by a process {ctx.user} cannot see")


def check(ctx: context.Context) -> context.Finding:
    address = ctx.spec.address
    host = app_mod.url_host(address)
    ports = [judge(ctx, label, number) for label, number in planned(ctx)]
    # Tenant clusters can be many: name them only when something is wrong with their port.
    shown = [p for p in ports if not p.ok or not p.label.startswith("cluster ")]
    quiet = len(ports) - len(shown)
    parts = [f"{p.label} {host}:{p.number} {p.state}" for p in shown]
    if quiet:
        parts.append(f"{quiet} cluster port{'s' if quiet > 1 else ''} free or held by this gateway")
    return context.Finding(all(p.ok for p in ports), "; ".join(parts))
