"""Checks of the state directory: it exists, belongs to and is writable for the account,
lives on real disk with room for the node root filesystems, and TMPDIR does not put it in RAM.

Node disks are large files written during a boot: a directory that cannot hold them fails as
a full filesystem partway through, not as a configuration error. Hence the checks up front.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from typing import TYPE_CHECKING

from socialweb_computer.hostcheck import context, mounts

if TYPE_CHECKING:
    from socialweb_computer.gateway import spec as spec_mod

MIB = 1024 * 1024
# Room beyond the node root filesystems: the store, logs, certificates, images being built.
MARGIN_MIB = 1024


def _not_yet(ctx: context.Context) -> str:
    """A note for checks that judge a missing directory by the ancestor it would be created in."""
    path = ctx.state_path
    if os.path.isdir(path):
        return ""
    return f"; it does not exist yet, judged by {mounts.nearest_existing(path)}"


def exists(ctx: context.Context) -> context.Finding:
    path = ctx.state_path
    if os.path.isdir(path):
        return context.ok(f"{path} is a directory")
    if os.path.exists(path):
        return context.fail(f"{path} exists but is not a directory")
    return context.fail(f"{path} does not exist")


def owner(ctx: context.Context) -> context.Finding:
    path = ctx.state_path
    if not os.path.isdir(path):
        return context.ok(f"{path} does not exist yet: it belongs to whoever creates it")
    uid = os.stat(path).st_uid
    if uid == ctx.uid:
        return context.ok(f"{path} is owned by {ctx.user} (uid {uid})")
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "an unnamed account"
    return context.fail(f"{path} is owned by {name} (uid {uid}), not by {ctx.user} (uid {ctx.uid})")


def writable(ctx: context.Context) -> context.Finding:
    """Create and remove a file for real: permission bits do not tell about read-only mounts."""
    path = ctx.state_path
    target = path if os.path.isdir(path) else mounts.nearest_existing(path)
    try:
        fd, probe = tempfile.mkstemp(dir=target, prefix=".check-host-")
        try:
            os.write(fd, b"check-host\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        return context.fail(f"{ctx.user} cannot create a file in {target}: {e.strerror or e}")
    if target != path:
        return context.ok(f"{path} does not exist yet; {ctx.user} can create it in {target}")
    return context.ok(f"{ctx.user} created and removed a file in {path}")


def disk(ctx: context.Context) -> context.Finding:
    path = ctx.state_path
    mount = mounts.mount_of(path, ctx.proc)
    reason = mounts.ram_backed(mount, ctx.proc)
    if reason:
        return context.fail(f"{path} is on {mount.describe()}: {reason}{_not_yet(ctx)}")
    return context.ok(f"{path} is on {mount.describe()}{_not_yet(ctx)}")


def required_mib(spec: spec_mod.GatewaySpec) -> tuple[int, str]:
    """The free-space rule: one node root filesystem per running cluster (at least one) plus a margin."""
    default = spec.node_defaults.rootfs_mib
    sizes = [c.nodes.get("rootfsMiB", default) for c in spec.clusters if c.running]
    if not sizes:
        return default + MARGIN_MIB, f"one {default} MiB node root filesystem + {MARGIN_MIB} MiB margin"
    return (sum(sizes) + MARGIN_MIB,
            f"a node root filesystem for each of {len(sizes)} running clusters, {sum(sizes)} MiB, "
            f"+ {MARGIN_MIB} MiB margin")


def space(ctx: context.Context) -> context.Finding:
    path = ctx.state_path
    existing = mounts.nearest_existing(path)
    st = os.statvfs(existing)
    # f_bavail, not f_bfree: the blocks reserved for root are not the gateway account's to use.
    free = st.f_bavail * st.f_frsize // MIB
    need, why = required_mib(ctx.spec)
    mount = mounts.mount_of(existing, ctx.proc)
    found = f"{free} MiB free on {mount.point} ({mount.fstype}); needs {need} MiB: {why}"
    return context.ok(found) if free >= need else context.fail(found)


def tmpdir(ctx: context.Context) -> context.Finding:
    value = ctx.env.get("TMPDIR", "")
    # Without TMPDIR, mktemp, QEMU and Python's tempfile all fall back to /tmp.
    tmp = os.path.abspath(value) if value else "/tmp"
    label = f"TMPDIR={value}" if value else f"TMPDIR is unset, so {tmp}"
    if value and not os.path.isdir(tmp):
        return context.fail(f"TMPDIR={value} is not a directory")
    mount = mounts.mount_of(tmp, ctx.proc)
    reason = mounts.ram_backed(mount, ctx.proc)
    if not reason:
        return context.ok(f"{label} is on {mount.fstype}, not RAM-backed")
    state, real_tmp = os.path.realpath(ctx.state_path), os.path.realpath(tmp)
    if os.path.commonpath([state, real_tmp]) == real_tmp:
        return context.fail(f"{label} is on {mount.describe()}: {reason}, and the state directory "
                            f"{ctx.state_path} is under it")
    return context.ok(f"{label} is on {mount.fstype} ({reason}), but the state directory is not under it")


class StateDirRefused(ValueError):
    """The state directory cannot hold what is about to be written; the message names the fix."""


def require_room(state_dir: str, need_mib: int, what: str, *, proc: str = "/proc") -> None:
    """check-host's state-dir-disk and free-space checks, run before `what` writes anything.

    A node's disks on a RAM-backed filesystem fail as a full filesystem partway through a boot,
    not as a configuration error: refuse up front instead, and say how to fix it.
    """
    ctx = context.Context(role="node", state_dir=state_dir, proc=proc)
    found = disk(ctx)
    if not found.ok:
        raise StateDirRefused(
            f"{what}: the state directory {found.found}. Node disks and root filesystems are large "
            "files and must be on real disk: set TMPDIR=/var/tmp/kcp (with the state directory under "
            "it) or pass another state directory on real disk (--state-dir)"
        )
    existing = mounts.nearest_existing(ctx.state_path)
    st = os.statvfs(existing)
    free = st.f_bavail * st.f_frsize // MIB
    if free < need_mib:
        mount = mounts.mount_of(existing, proc)
        raise StateDirRefused(
            f"{what} needs {need_mib} MiB free for the state directory {ctx.state_path}, but "
            f"{mount.point} ({mount.fstype}) has {free} MiB: free space there, or use a state "
            "directory on a larger disk (--state-dir)"
        )
