"""`socialweb-computer install gateway`: install the gateway as a systemd user service.

Run as the service account (`socialweb`), usually by scripts/deploy.sh over ssh.  The work is
in hostops.install; this module is the flags, the account checks and the printing.
cli/upgrade.py shares `binary_arg` and `run_hostops`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from socialweb_computer import binary as binary_mod
from socialweb_computer.hostops import HostOpsError, systemd
from socialweb_computer.hostops import install as install_mod
from socialweb_computer.hostops import layout as layout_mod

DESCRIPTION = """\
Install the socialweb-computer gateway for the account running this command, as the systemd
user service socialweb-computer-gateway.service:

  ~/.local/lib/socialweb-computer/versions/<version>-<sha256[:12]>/   the binary
  ~/.local/bin/socialweb-computer                                    its stable path
  ~/.config/socialweb-computer/gateway.env (0600), gateway-spec.yaml the configuration
  ~/.config/systemd/user/socialweb-computer-gateway.service          the unit

then daemon-reload, enable and start it with `systemctl --user`, and wait until the new
process answers /api/config. It refuses when the gateway is installed already (use
`upgrade`) and when no systemd user manager answers (`loginctl enable-linger` fixes that).
See docs/host-operations.md."""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("install", help="install a component as a service of this account",
                       description="Install a socialweb-computer component for this account.")
    components = p.add_subparsers(dest="component", metavar="COMPONENT")
    components.required = True
    g = components.add_parser("gateway", help="install and start the gateway as a systemd user service",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_binary_args(g)
    g.add_argument("--env-file", type=Path, metavar="FILE",
                   help="environment file for the unit (NAME=value lines; secrets); copied to "
                        "~/.config/socialweb-computer/gateway.env at 0600 (default: an empty one)")
    g.add_argument("--spec-file", type=Path, metavar="FILE",
                   help="gateway spec (docs/gateway.md); copied to "
                        "~/.config/socialweb-computer/gateway-spec.yaml (default: the defaults)")
    g.set_defaults(run=run)


def add_binary_args(p: argparse.ArgumentParser) -> None:
    """The flags install and upgrade share."""
    p.add_argument("--binary", type=Path, metavar="PATH",
                   help="the socialweb-computer binary to install (default: this program, when it is the "
                        "single-file binary)")
    p.add_argument("--sha256", metavar="HEX", help="refuse the binary unless its SHA-256 is HEX")
    p.add_argument("--timeout", type=float, default=install_mod.DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="how long the gateway gets to answer /api/config (default: %(default)g)")


def binary_arg(args: argparse.Namespace) -> Path:
    from socialweb_computer.cli.main import CommandError

    if args.binary is not None:
        return Path(args.binary)
    if binary_mod.frozen():
        return Path(sys.executable)
    raise CommandError("--binary PATH is required when socialweb-computer runs from source: name the "
                       "single-file binary to install (scripts/build-binary.sh builds it)")


def run_hostops(action: Callable[[Callable[[str], None]], dict[str, Any]]) -> int:
    """Run an install or upgrade as this account, printing its progress; errors become CommandError."""
    from socialweb_computer.cli.main import CommandError

    if os.geteuid() == 0:
        raise CommandError("run this as the account the gateway runs as (e.g. `socialweb`), not as root: "
                           "it installs under that account's home and its systemd user manager")

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        action(say)
    except HostOpsError as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}") from None
    return 0


def run(args: argparse.Namespace) -> int:
    request = install_mod.Request(binary=binary_arg(args), sha256=args.sha256, env_file=args.env_file,
                                  spec_file=args.spec_file, timeout=args.timeout)
    layout = layout_mod.Layout.for_current_user()
    return run_hostops(lambda say: install_mod.install_gateway(request, layout, systemd.UserManager(), say))
