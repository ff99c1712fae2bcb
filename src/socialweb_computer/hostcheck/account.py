"""Checks of the account that runs the gateway: systemd lingering and open-file limits.

The gateway is a systemd user unit of its own account. Without lingering, systemd starts
that account's user manager only at login and stops it at logout, taking the gateway with
it. logind records lingering as a file named after the user in its linger directory; the
file is read directly so the check also works where no system bus answers.
"""

from __future__ import annotations

import os
import resource

from socialweb_computer.hostcheck import context

# The gateway holds a listener per tenant cluster plus every client connection and watch
# (a CI job holds several); a node host runs QEMU or runc per node with their own files.
MIN_OPEN_FILES = {"gateway": 4096, "node": 1024}


def linger(ctx: context.Context) -> context.Finding:
    record = os.path.join(ctx.linger_dir, ctx.user)
    if os.path.exists(record):
        return context.ok(f"lingering is enabled for {ctx.user} ({record} exists)")
    found = (f"lingering is not enabled for {ctx.user} (no {record}): the gateway's user unit stops at "
             "logout and does not start at boot")
    if not os.path.isdir(ctx.systemd_dir):
        found += "; systemd is not running on this host"
    return context.fail(found)


def open_files(ctx: context.Context) -> context.Finding:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = MIN_OPEN_FILES[ctx.role]

    def text(limit: int) -> str:
        return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)

    found = f"open files: soft limit {text(soft)}, hard limit {text(hard)}; role {ctx.role} needs {need}"
    # The gateway raises its soft limit to the hard one at start, so for it the hard limit counts;
    # node tools (QEMU, runc) live with the soft limit they are given.
    limit = hard if ctx.role == "gateway" else soft
    if limit != resource.RLIM_INFINITY and limit < need:
        return context.fail(found)
    return context.ok(found)
