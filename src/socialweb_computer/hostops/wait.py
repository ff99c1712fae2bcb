"""Waits until the gateway the unit just started answers `GET /api/config`.

An answer counts only when it comes from the unit's current process: `/api/config`'s `pid` is
the unit's MainPID or a descendant of it (the single-file binary's bootloader is MainPID and
runs the program in a child).  So an old gateway still answering, or a stray one on the same
port, never passes for the new one.  A unit that fails or starts crash-looping ends the wait
at once rather than at the timeout.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostops import HostOpsError, systemd
from socialweb_computer.hostops import layout as layout_mod

POLL_SECONDS = 0.25
REQUEST_TIMEOUT = 2.0


def config_url(spec: spec_mod.GatewaySpec) -> str:
    """Where the gateway of `spec` serves /api/config."""
    host = app_mod.url_host(app_mod.loopback_ip(spec.address))
    return f"http://{host}:{spec.api_port}/api/config"


def _fetch(url: str) -> tuple[dict[str, Any] | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT) as response:
            return json.loads(response.read()), ""
    except urllib.error.HTTPError as e:
        return None, f"it answered {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return None, f"no answer ({getattr(reason, 'strerror', None) or reason})"
    except ValueError:
        return None, "it answered something that is not JSON"


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command name is in parentheses and may hold spaces; the parent pid follows it.
    return int(stat.rpartition(")")[2].split()[1])


def belongs_to(pid: int, main_pid: int, depth: int = 4) -> bool:
    """True when `pid` is `main_pid` or one of its descendants, up to `depth` generations."""
    for _ in range(depth + 1):
        if pid == main_pid:
            return True
        if pid <= 1:
            return False
        pid = _parent(pid)
    return False


def wait_for_gateway(
    manager: systemd.UserManager,
    url: str,
    timeout: float,
    *,
    unit: str = layout_mod.UNIT_NAME,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The /api/config document of the unit's process, once it answers; HostOpsError otherwise."""
    deadline = clock() + timeout
    journal = f"`journalctl --user -u {unit}` says why"
    while True:
        status = manager.status(unit)
        if status.down:
            raise HostOpsError(f"{unit} is not running, its state is {status.describe()}: {journal}")
        config, problem = _fetch(url)
        if config is not None:
            pid = int(config.get("pid") or 0)
            if status.main_pid and belongs_to(pid, status.main_pid):
                return config
            problem = (f"it is answered by pid {pid}, not by {unit} (MainPID {status.main_pid}): another "
                       "gateway holds the port")
        if clock() >= deadline:
            raise HostOpsError(f"the gateway did not answer {url} within {timeout:g}s: {problem}; the "
                               f"state of {unit} is {status.describe()}; {journal}")
        sleep(POLL_SECONDS)


def summary(config: dict[str, Any], url: str) -> str:
    """One line naming what answered: the line deploy.sh's operator reads last."""
    ready = "ready" if config.get("ready") else "not ready yet (see /readyz)"
    return (f"gateway {config.get('version', '?')} answers {url} (pid {config.get('pid')}, started "
            f"{config.get('startedAt', '?')}, {ready}); admin kubeconfig: "
            f"{config.get('adminKubeconfig', '?')}")
