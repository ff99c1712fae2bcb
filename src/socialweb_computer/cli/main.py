"""Entry point of `socialweb-computer`: builds the parser from the command modules."""

from __future__ import annotations

import argparse
import importlib
import sys

from socialweb_computer import __version__

# Command → its module in socialweb_computer.cli. A command's module is imported only when that
# command runs (all of them for the top-level --help): the API server's modules take seconds to
# import on a busy host, and `image ensure`, `version` or `check-host` need none of them.
# (scripts/build-binary.sh collects every module of this package into the single-file binary.)
COMMANDS = {
    "apiserver": "apiserver",
    "version": "version",
    "gateway": "gateway",
    "status": "status",
    "node": "node",
    "image": "image",
    "internal": "internal",
    "credential": "credential",
    "check-host": "checkhost",
    "install": "install",
    "upgrade": "upgrade",
}


class CommandError(Exception):
    """A failure the user can fix: printed as `error: <message>`, exit status 1."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command `only` alone ("": none, for --version)."""
    parser = argparse.ArgumentParser(
        prog="socialweb-computer",
        description="A compute gateway that turns one host into a provider of Kubernetes clusters for CI.")
    parser.add_argument("--version", action="version", version=f"socialweb-computer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command, module in COMMANDS.items():
        if only is None or command == only:
            importlib.import_module(f"socialweb_computer.cli.{module}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    only = None
    if argv and (argv[0] in COMMANDS or argv[0] == "--version"):
        only = "" if argv[0] == "--version" else argv[0]
    parser = build_parser(only)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
