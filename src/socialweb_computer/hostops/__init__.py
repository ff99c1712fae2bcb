"""Host operations: installing the gateway as a systemd user service and upgrading it in place.

`socialweb-computer install gateway` and `socialweb-computer upgrade` (cli/install.py,
cli/upgrade.py) are thin wrappers around `install.install_gateway` and `upgrade.upgrade`;
scripts/deploy.sh runs them over ssh.  docs/host-operations.md describes the layout under
the service account's home and what each step does.

Every failure an operator can fix is raised as `HostOpsError` with a message that says what
is wrong and what to do; the CLI prints it as `error: ...` and exits 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

DEFAULT_TIMEOUT = 60.0

Say = Callable[[str], None]  # how a step reports progress (the CLI prints each line)


@dataclasses.dataclass(frozen=True)
class Request:
    """What install or upgrade is asked to put in place."""

    binary: Path
    sha256: str | None = None
    # None: install writes a comments-only environment file and the default spec;
    # upgrade keeps the installed ones.
    env_file: Path | None = None
    spec_file: Path | None = None
    timeout: float = DEFAULT_TIMEOUT


class HostOpsError(Exception):
    """An install or upgrade step failed; the message says why and what to do."""
