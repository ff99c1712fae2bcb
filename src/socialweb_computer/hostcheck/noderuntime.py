"""What sandbox nodes need of the host beyond programs: CNI plugins, cgroups, devices, and the
capability that decides containerd's `restrict_oom_score_adj`.

Each function is one row of `checks.CHECKS`; for role gateway a problem here only means
the host gets no sandbox nodes (the line says so), for role node it fails.
"""

from __future__ import annotations

import os
from pathlib import Path

from socialweb_computer.hostcheck import context

CNI_DIR = "/usr/lib/cni"
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
CNI_CACHE = "/var/lib/cni"
CGROUP_ROOT = "/sys/fs/cgroup"
CAP_SYS_RESOURCE = 24


def _optional(ctx: context.Context, problem: str) -> context.Finding:
    if ctx.role == "node":
        return context.fail(problem)
    return context.ok(f"{problem}: no sandbox nodes on this host (optional for role {ctx.role})")


def cni_plugins(ctx: context.Context) -> context.Finding:
    missing = [p for p in CNI_PLUGINS if not os.access(Path(CNI_DIR) / p, os.X_OK)]
    if missing:
        return _optional(ctx, f"missing CNI plugins in {CNI_DIR}: {', '.join(missing)}")
    if not Path(CNI_CACHE).is_dir():
        return _optional(ctx, f"{CNI_CACHE} does not exist (the mount point of each node's CNI cache)")
    return context.ok(f"{', '.join(CNI_PLUGINS)} in {CNI_DIR}; {CNI_CACHE} present")


def cgroups(ctx: context.Context) -> context.Finding:
    root = Path(CGROUP_ROOT)
    if (root / "cgroup.controllers").exists():
        controllers = (root / "cgroup.controllers").read_text().split()
        layout = "v2 (unified)"
        writable = os.access(root, os.W_OK)
    else:
        controllers = (
            [p.name for p in root.iterdir() if (p / "cgroup.procs").exists()] if root.is_dir() else []
        )
        layout = "v1" + (" hybrid" if (root / "unified").is_dir() else "")
        writable = all(os.access(root / c, os.W_OK) for c in ("memory", "cpu") if (root / c).is_dir())
    missing = [c for c in ("memory", "cpu", "pids") if c not in controllers]
    if missing:
        return _optional(ctx, f"cgroup {layout} lacks the {', '.join(missing)} controller(s)")
    if not writable:
        return _optional(ctx, f"cgroup {layout} at {CGROUP_ROOT} is not writable by {ctx.user}")
    return context.ok(f"cgroup {layout}, cgroupfs driver (memory, cpu, pids writable)")


def oom_score_adj(ctx: context.Context) -> context.Finding:
    """A finding: with CAP_SYS_RESOURCE containerd may lower sandboxes' OOM scores, else it is restricted."""
    try:
        with open(os.path.join(ctx.proc, "self", "status")) as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError) as e:
        return context.fail(f"cannot read the capabilities: {e}")
    if effective >> CAP_SYS_RESOURCE & 1:
        return context.ok("CAP_SYS_RESOURCE held: containerd sets the OOM scores a kubelet asks for")
    return context.ok(
        "CAP_SYS_RESOURCE missing: nodes run containerd with restrict_oom_score_adj = true "
        "(scores below containerd's own are clamped to it)"
    )


def devices(ctx: context.Context) -> context.Finding:
    # Every node's network goes through slirp4netns (a tap device); only sandbox nodes loop-mount a disk.
    if not os.path.exists("/dev/net/tun"):
        return context.fail("missing /dev/net/tun (slirp4netns' network, for every node)")
    if not os.path.exists("/dev/loop-control"):
        return _optional(ctx, "missing /dev/loop-control (sandbox node disks, loop-mounted ext4)")
    return context.ok("/dev/net/tun and /dev/loop-control present")
