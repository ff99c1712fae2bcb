"""The table of host checks: what each one is called, why it exists, how to fix a failure.

`run(ctx)` evaluates the rows that apply to the context's role, in table order, and never
stops early: the operator gets every problem in one pass. docs/host-contract.md has a
section per row with the same name, roles, why and fix (tests/hostcheck keeps them equal).
A fix may name `{user}` (the running account) and `{state_dir}`; they are filled in on output.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import re
from typing import Any

from socialweb_computer.hostcheck import account, context, kvm, noderuntime, ports, statedir, tools

BOTH = frozenset(context.ROLES)
GATEWAY = frozenset({"gateway"})


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    why: str
    fix: str
    run: collections.abc.Callable[[context.Context], context.Finding]
    roles: frozenset[str] = BOTH


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    found: str
    fix: str | None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHECKS: tuple[Check, ...] = (
    Check("state-dir-exists",
          "The gateway keeps its store, certificates, kubeconfigs and node disks in the state directory.",
          "create it as {user}, the account that runs the gateway: mkdir -p -m 700 {state_dir}",
          statedir.exists),
    Check("state-dir-owner",
          "The gateway runs as its own account and must own its state; a directory left owned by another "
          "account (often root, after a first run with sudo) holds files the gateway cannot replace.",
          "chown -R {user}: {state_dir} (as root), or run check-host as the account that runs the gateway",
          statedir.owner),
    Check("state-dir-writable",
          "Every start writes the store and certificates, every node boot writes a disk image; a read-only "
          "mount or a missing permission stops both. The check creates and removes a file for real.",
          "make {state_dir} writable for {user}: chmod u+rwx {state_dir}, or remount its filesystem "
          "read-write",
          statedir.writable),
    Check("state-dir-disk",
          "Node disks and root filesystems are large files: on a tmpfs or another RAM-backed filesystem they "
          "take the host's memory, and a boot fails as a full filesystem partway through.",
          "put the state directory on real disk, e.g. under TMPDIR=/var/tmp/kcp rather than a tmpfs /tmp",
          statedir.disk),
    Check("state-dir-space",
          "A node's root filesystem can grow to its full rootfsMiB while it runs. The rule: room for one "
          "node root filesystem per running cluster in the gateway spec (at least one node), plus "
          f"{statedir.MARGIN_MIB} MiB for the store, logs and images being built.",
          "free space on the filesystem holding {state_dir}, move the state directory to a larger disk, or "
          "lower rootfsMiB in the gateway spec",
          statedir.space),
    Check("tmpdir-disk",
          "The state directory often lives under TMPDIR (the usual advice is TMPDIR=/var/tmp/kcp); when "
          "TMPDIR is RAM-backed, so is the state under it. A RAM-backed TMPDIR with the state elsewhere "
          "is fine.",
          "set TMPDIR to a directory on real disk in the gateway's environment, e.g. TMPDIR=/var/tmp/kcp, "
          "with the state directory under it",
          statedir.tmpdir),
    *(Check(tool.check, tool.why, tool.fix, functools.partial(tools.run, tool)) for tool in tools.TOOLS),
    Check("cni-plugins",
          "A sandbox node wires its pods with the CNI bridge, host-local and portmap plugins (containerd "
          "runs loopback itself), and mounts a tmpfs of its own on /var/lib/cni, where containerd keeps "
          "libcni's cache. Required for role node; for role gateway it is optional.",
          "install the CNI plugins (Debian: apt-get install containernetworking-plugins) and create the "
          "mount point: mkdir -p /var/lib/cni (as root; scripts/bootstrap.sh does both)",
          noderuntime.cni_plugins),
    Check("cgroups",
          "A sandbox node's memory and CPU are cgroup limits on /socialweb/<node>, and its pods' limits "
          "cgroups below it (cgroupfs driver: PID 1 need not be systemd). Required for role node; for role "
          "gateway it is optional.",
          "mount the memory, cpu and pids controllers (cgroup v1 or v2) writable for {user}",
          noderuntime.cgroups),
    Check("oom-score-adj",
          "containerd's CRI plugin gives pod sandboxes an OOM score of -998, which needs CAP_SYS_RESOURCE; "
          "without it nodes set restrict_oom_score_adj. A finding, never a failure.",
          "none needed",
          noderuntime.oom_score_adj),
    Check("node-devices",
          "Every node's user-mode network (slirp4netns) needs /dev/net/tun; a sandbox node also needs loop "
          "devices for its disk (required for role node, optional for role gateway).",
          "load the tun and loop modules (modprobe tun loop) or give the account access to the devices",
          noderuntime.devices),
    Check("kvm",
          "Nodes boot under KVM when /dev/kvm really works and under TCG (emulation, several times slower) "
          "otherwise. A finding, never a failure: the line says which acceleration nodes get.",
          "none needed, nodes boot under TCG; for KVM give {user} read-write access to /dev/kvm (the kvm "
          "group) on a host with hardware virtualisation",
          kvm.check),
    Check("gateway-ports",
          "The gateway binds its HTTP API, its admin apiserver and one port per tenant cluster on loopback; "
          "a port held by another process keeps the gateway or a cluster from starting.",
          "stop the process that holds the port, or choose other ports in the gateway spec (listen.apiPort, "
          "listen.adminPort, listen.clusterPorts)",
          ports.check, GATEWAY),
    Check("linger",
          "The gateway is a systemd user unit of its own account: without lingering it stops at logout and "
          "does not start at boot.",
          "loginctl enable-linger {user} (as root, on a host running systemd)",
          account.linger, GATEWAY),
    Check("open-files",
          "The gateway holds a listening socket per tenant cluster plus every client connection and watch; "
          "a node host runs QEMU or runc per node. The gateway raises its soft limit to the hard limit at "
          f"start, so the hard limit must be at least {account.MIN_OPEN_FILES['gateway']} for role gateway; "
          f"the soft limit at least {account.MIN_OPEN_FILES['node']} for role node.",
          "raise the limit: LimitNOFILE=65536 in the service's systemd unit, or ulimit -n 65536 in the "
          "shell that starts it",
          account.open_files),
)


def for_role(role: str) -> tuple[Check, ...]:
    return tuple(check for check in CHECKS if role in check.roles)


def evaluate(check: Check, ctx: context.Context) -> Result:
    try:
        finding = check.run(ctx)
    except Exception as e:  # One broken probe must not hide the other checks' lines.
        finding = context.fail(f"could not check: {e}")
    fix = None if finding.ok else check.fix.format(user=ctx.user, state_dir=ctx.state_path)
    # One line per check, whatever a probe quoted (a tool's output, a path).
    return Result(check.name, finding.ok, re.sub(r"\s*\n\s*", " ", finding.found.strip()), fix)


def run(ctx: context.Context) -> list[Result]:
    return [evaluate(check, ctx) for check in for_role(ctx.role)]
