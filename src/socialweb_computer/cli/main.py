"""Entry point of `socialweb-computer`: builds the parser from the command modules."""

from __future__ import annotations

import argparse
import sys

from socialweb_computer import __version__
from socialweb_computer.cli import (
    apiserver,
    checkhost,
    credential,
    gateway,
    image,
    install,
    internal,
    node,
    status,
    upgrade,
    version,
)

COMMANDS = (
    apiserver, version, gateway, status, node, image, internal, credential, checkhost, install, upgrade,
)


class CommandError(Exception):
    """A failure the user can fix: printed as `error: <message>`, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="socialweb-computer",
        description="A compute gateway that turns one host into a provider of Kubernetes clusters for CI.")
    parser.add_argument("--version", action="version", version=f"socialweb-computer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
