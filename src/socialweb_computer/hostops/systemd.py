"""The account's systemd user manager, reached through `systemctl --user`.

install and upgrade call this for daemon-reload, enable, start, restart and the unit's state
(MainPID, ActiveState) that the wait loop reads.  `require()` runs first, before anything is
written, so a host without a user manager gets a plain message and an untouched home.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import subprocess
from pathlib import Path

from socialweb_computer import binary
from socialweb_computer.hostops import HostOpsError

SYSTEMCTL = "systemctl"
TIMEOUT = 120  # seconds for one systemctl call (a restart waits for the old process to stop)
_PROPERTIES = ("MainPID", "ActiveState", "SubState", "Result")


@dataclasses.dataclass(frozen=True)
class UnitStatus:
    main_pid: int
    active_state: str
    sub_state: str
    result: str

    @property
    def down(self) -> bool:
        """The service is not running and will not be by itself soon (or is crash-looping)."""
        return self.active_state in ("failed", "inactive") or self.sub_state == "auto-restart"

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state} (result {self.result or 'unknown'})"


def _user() -> tuple[str, int]:
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return str(uid), uid


def no_manager_message(detail: str) -> str:
    user, uid = _user()
    return (
        f"no systemd user manager can be reached for {user} (systemctl --user: {detail}). The gateway "
        f"runs as a systemd user service of {user}, so its user manager must run, also while nobody is "
        f"logged in. As root: `loginctl enable-linger {user}`, then `systemctl start user@{uid}.service` "
        f"(or log in again as {user}); `systemctl --user status` as {user} must then answer. Over ssh, "
        f"XDG_RUNTIME_DIR must be /run/user/{uid} (sshd with UsePAM yes sets it). Nothing was changed."
    )


class UserManager:
    """`systemctl --user` for the calling account."""

    def __init__(self, systemctl: str = SYSTEMCTL) -> None:
        self.systemctl = systemctl

    def _env(self) -> dict[str, str]:
        # Programs we start get the host's libraries, not the single-file binary's.
        env = binary.child_env()
        runtime = Path(f"/run/user/{os.getuid()}")
        # A session without PAM (a cron job, `su`) lacks XDG_RUNTIME_DIR though the bus is there.
        if not env.get("XDG_RUNTIME_DIR") and (runtime / "bus").exists():
            env["XDG_RUNTIME_DIR"] = str(runtime)
        return env

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([self.systemctl, "--user", *args], capture_output=True, text=True,
                                  env=self._env(), stdin=subprocess.DEVNULL, timeout=TIMEOUT, check=False)
        except FileNotFoundError:
            raise HostOpsError(no_manager_message(f"{self.systemctl} is not installed")) from None
        except subprocess.TimeoutExpired:
            command = " ".join(args)
            raise HostOpsError(f"systemctl --user {command} did not finish within {TIMEOUT}s") from None

    def _call(self, *args: str) -> str:
        result = self._run(*args)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
            raise HostOpsError(f"systemctl --user {' '.join(args)} failed: {detail}")
        return result.stdout

    def require(self) -> None:
        """Refuse, with the fix, when no user manager answers."""
        result = self._run("show-environment")
        if result.returncode != 0:
            detail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
            raise HostOpsError(no_manager_message(detail[0]))

    def daemon_reload(self) -> None:
        self._call("daemon-reload")

    def enable(self, unit: str) -> None:
        self._call("enable", unit)

    def start(self, unit: str) -> None:
        self._call("start", unit)

    def restart(self, unit: str) -> None:
        self._call("restart", unit)

    def status(self, unit: str) -> UnitStatus:
        out = self._call("show", f"--property={','.join(_PROPERTIES)}", unit)
        values = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
        try:
            pid = int(values.get("MainPID", "0") or 0)
        except ValueError:
            pid = 0
        return UnitStatus(main_pid=pid, active_state=values.get("ActiveState", ""),
                          sub_state=values.get("SubState", ""), result=values.get("Result", ""))
