"""`socialweb-computer version`: which release and which build is running.

An operator comparing a host with the release notes, or a bug report, needs more than the
release number: the binary's commit, tree state and build date (see `binary.current()`).
From a source checkout the build is `source`.  `-o json` gives the same fields to scripts,
named as in `kubectl version -o json`.
"""

from __future__ import annotations

import argparse
import json

from socialweb_computer import binary


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("version", help="print the version and build of this program",
                       description="Print the release version and the build (commit, tree state, build "
                                   "date) of this program; `build: source` when run from a checkout.")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text",
                   help="output format (default: %(default)s)")
    p.set_defaults(run=run)


def render(info: binary.BuildInfo, output: str) -> str:
    """The text `version` prints for `info` in the `output` format."""
    if output == "json":
        return json.dumps(info.as_json(), indent=2)
    lines = [f"socialweb-computer {info.version}", f"build: {_build_line(info)}",
             f"python: {info.python_version} {info.os_arch}"]
    return "\n".join(lines)


def _build_line(info: binary.BuildInfo) -> str:
    if info.build == binary.SOURCE:
        return binary.SOURCE
    details = [part for part in (info.git_tree_state, info.build_date, info.bundler) if part]
    return f"{info.build} ({', '.join(details)})" if details else info.build


def run(args: argparse.Namespace) -> int:
    print(render(binary.current(), args.output))
    return 0
