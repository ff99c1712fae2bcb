"""`socialweb-computer upgrade`: replace the installed gateway's binary, restart, roll back on failure.

Run as the service account, usually by scripts/deploy.sh over ssh after the first install.
The work is in hostops.upgrade; the flags it shares with install come from cli/install.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from socialweb_computer.cli import install as install_cli
from socialweb_computer.hostops import layout as layout_mod
from socialweb_computer.hostops import systemd
from socialweb_computer.hostops import upgrade as upgrade_mod

DESCRIPTION = """\
Upgrade the gateway installed by `install gateway` for this account: verify the new binary
(--sha256, then run it), copy it to its own version directory, switch
~/.local/lib/socialweb-computer/current to it with one atomic rename, replace the
configuration files when --env-file/--spec-file are given, restart
socialweb-computer-gateway.service and wait until the new process answers /api/config.
If it does not, the previous binary and configuration are put back and restarted, and the
command exits 1. The state directory is never touched. See docs/host-operations.md."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("upgrade", help="replace the installed gateway's binary; roll back if it fails",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    install_cli.add_binary_args(p)
    p.add_argument("--env-file", type=Path, metavar="FILE",
                   help="replace the unit's environment file with FILE (default: keep it)")
    p.add_argument("--spec-file", type=Path, metavar="FILE",
                   help="replace the gateway spec with FILE (default: keep it)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    request = upgrade_mod.Request(binary=install_cli.binary_arg(args), sha256=args.sha256,
                                  env_file=args.env_file, spec_file=args.spec_file, timeout=args.timeout)
    layout = layout_mod.Layout.for_current_user()
    manager = systemd.UserManager()
    return install_cli.run_hostops(lambda say: upgrade_mod.upgrade(request, layout, manager, say))
