"""Checks the operator's environment file before it becomes the unit's EnvironmentFile.

The file carries secrets (a node bidder's token, ...), so this module reads it only to check
its shape and never repeats a value: a message names the line number and, at most, the
variable's name.  The grammar is the part of systemd's EnvironmentFile= syntax a person
writes: `NAME=value` lines, blank lines, and comments starting with `#` or `;`.
"""

from __future__ import annotations

import re

from socialweb_computer.hostops import HostOpsError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables the unit sets itself; the file may not override them (why, in the message).
RESERVED = {
    "SOCIALWEB_GATEWAY_SPEC": "the unit points it at the installed spec file; pass the spec with "
    "--spec-file (deploy.sh: GATEWAY_SPEC_FILE) instead",
}


def names(text: str, source: str) -> list[str]:
    """The variable names `text` sets, in order; refuses a line systemd would not read as meant."""
    found: list[str] = []
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        name, eq, _ = stripped.partition("=")
        name = name.strip()
        if name.startswith("export "):
            raise HostOpsError(f"{source}, line {number}: systemd does not understand `export`; "
                               "write NAME=value")
        if not eq or not _NAME.fullmatch(name):
            raise HostOpsError(f"{source}, line {number}: not a NAME=value line (NAME is letters, "
                               "digits and _, not starting with a digit)")
        if name in RESERVED:
            raise HostOpsError(f"{source}, line {number}: {name} may not be set here: {RESERVED[name]}")
        found.append(name)
    return found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    # A trailing backslash continues the value on the next line, as systemd reads it.
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        pending = (pending[0], pending[1] + raw) if pending is not None else (number, raw)
        if raw.endswith("\\") and not raw.lstrip().startswith(("#", ";")):
            pending = (pending[0], pending[1][:-1])
            continue
        lines.append(pending)
        pending = None
    if pending is not None:
        lines.append(pending)
    return lines
