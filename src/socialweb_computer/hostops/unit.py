"""The systemd user unit that runs the gateway, rendered from the layout.

install writes it and upgrade rewrites it (a new release may change it), always through
`render`, so the unit on a host is a function of the layout alone.  Paths are absolute (the
account's home spelled out) so an operator reads what runs without expanding specifiers.
Secrets stay out: the unit names the environment file and systemd reads it at start, so
they appear neither here nor on the command line (`ps`).
"""

from __future__ import annotations

import re

from socialweb_computer.hostops import HostOpsError
from socialweb_computer.hostops import layout as layout_mod

STATE_DIR_ENV = "SOCIALWEB_GATEWAY_STATE_DIR"
SPEC_ENV = "SOCIALWEB_GATEWAY_SPEC"
# Each gateway holds a listener (and its connections) per tenant cluster, plus the SQLite
# files: far past the user manager's default soft limit of 1024.
LIMIT_NOFILE = 65536
# Characters a unit line cannot carry without quoting: whitespace, quotes, backslash, controls.
_UNSAFE = re.compile(r"[\s\"'\\\x00-\x1f\x7f]")

TEMPLATE = """\
# Written by `socialweb-computer install gateway` and rewritten by `upgrade`: edits here are
# lost at the next upgrade.  Settings and secrets go in the EnvironmentFile below.
# See docs/host-operations.md.
[Unit]
Description=socialweb-computer gateway (admin plane, tenant clusters, HTTP API on loopback)

[Service]
Type=exec
# Defaults; a line in the EnvironmentFile overrides them (except the spec, which install owns).
Environment={state_env}={state_dir}
Environment={spec_env}={spec_file}
EnvironmentFile={env_file}
ExecStart={binary} gateway
Restart=on-failure
RestartSec=2
TimeoutStopSec=30
LimitNOFILE={nofile}

[Install]
WantedBy=default.target
"""


def _path(value: object) -> str:
    text = str(value)
    if _UNSAFE.search(text):
        raise HostOpsError(f"the path {text!r} has whitespace, quotes or backslashes, which a systemd "
                           "unit cannot hold unquoted; use an account whose home directory has none")
    return text.replace("%", "%%")  # a bare % starts a systemd specifier


def render(layout: layout_mod.Layout) -> str:
    """The unit file's text for `layout`."""
    return TEMPLATE.format(
        state_env=STATE_DIR_ENV,
        state_dir=_path(layout.default_state_dir),
        spec_env=SPEC_ENV,
        spec_file=_path(layout.spec_file),
        env_file=_path(layout.env_file),
        binary=_path(layout.stable_binary),
        nofile=LIMIT_NOFILE,
    )
