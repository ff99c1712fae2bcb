"""A stand-in for `systemctl --user`, for hosts without a systemd user manager (these test machines).

Test double, and the only one in tests/hostops: no user manager can run here (no systemd as
PID 1, no user bus), so install's and upgrade's success paths need something to answer
`systemctl --user`.  It does what the user manager would do with *the unit file install
wrote*: daemon-reload loads it (start uses the loaded copy, as systemd does), enable makes the
WantedBy= symlink, start/restart run its exact ExecStart= with an environment built from
Environment= and EnvironmentFile= (nothing of the caller's), stop sends SIGTERM.  `show`
reports MainPID, ActiveState, SubState and Result.  Restart=on-failure is not emulated: a
service that exits non-zero stays `failed`.

The tests put it first on the service account's PATH through sshd's SetEnv; it keeps its
state in ~/.fake-systemd.  `parse_unit`, `exec_start` and `environment` are also imported by
the tests to run the unit's ExecStart line themselves.
"""

from __future__ import annotations

import os
import pwd
import shlex
import signal
import sys
import time
from pathlib import Path

UNIT_DIR = Path.home() / ".config" / "systemd" / "user"
STATE = Path.home() / ".fake-systemd"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file, each a list of (key, value) in file order."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"a key outside any section: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in sections.get(section, []) if k == key]


def _specifiers(text: str, home: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "%":
            spec = text[i + 1 : i + 2]
            if spec == "%":
                out.append("%")
            elif spec == "h":
                out.append(home)
            else:
                raise SystemExit(f"fake systemctl: unsupported specifier %{spec}")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def exec_start(sections: dict[str, list[tuple[str, str]]], home: str) -> list[str]:
    (line,) = values(sections, "Service", "ExecStart")
    return shlex.split(_specifiers(line, home))


def _env_file(path: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        result[key.strip()] = value
    return result


def environment(sections: dict[str, list[tuple[str, str]]], user: pwd.struct_passwd) -> dict[str, str]:
    """What the user manager gives the service: its own few variables, then the unit's."""
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "SHELL": user.pw_shell,
           "PATH": BASE_PATH, "LANG": "C.UTF-8"}
    for assignment in values(sections, "Service", "Environment"):
        for word in shlex.split(_specifiers(assignment, user.pw_dir)):
            key, _, value = word.partition("=")
            env[key] = value
    for path in values(sections, "Service", "EnvironmentFile"):
        optional = path.startswith("-")
        path = _specifiers(path.lstrip("-"), user.pw_dir)
        if optional and not os.path.exists(path):
            continue
        env.update(_env_file(path))  # EnvironmentFile= overrides Environment=, as in systemd
    return env


def _loaded(unit: str) -> dict[str, list[tuple[str, str]]]:
    path = STATE / "loaded" / unit
    if not path.exists():
        raise SystemExit(f"Failed to start {unit}: Unit {unit} not found.")
    return parse_unit(path.read_text())


def _pid(unit: str) -> int:
    try:
        return int((STATE / f"{unit}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _exit_status(unit: str, pid: int) -> str | None:
    # One file per run, written by that run's supervisor: a late writer never clobbers a new run.
    try:
        return (STATE / f"{unit}.exit.{pid}").read_text()
    except FileNotFoundError:
        return None


def daemon_reload() -> None:
    loaded = STATE / "loaded"
    loaded.mkdir(parents=True, exist_ok=True)
    for old in loaded.iterdir():
        old.unlink()
    for unit in UNIT_DIR.glob("*.service"):
        (loaded / unit.name).write_text(unit.read_text())


def enable(unit: str) -> None:
    for target in values(_loaded(unit), "Install", "WantedBy"):
        wants = UNIT_DIR / f"{target}.wants"
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / unit
        if not link.is_symlink():
            link.symlink_to(UNIT_DIR / unit)
            print(f"Created symlink {link} \u2192 {UNIT_DIR / unit}.", file=sys.stderr)


def start(unit: str) -> None:
    if _alive(_pid(unit)):
        return
    sections = _loaded(unit)
    user = pwd.getpwuid(os.getuid())
    argv = exec_start(sections, user.pw_dir)
    env = environment(sections, user)
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.close(read_end)
        _supervise(unit, argv, env, user.pw_dir, write_end)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        pid_text, _, error = answer.read().partition(" ")
    (STATE / f"{unit}.pid").write_text(pid_text)
    if error:
        raise SystemExit(f"Job for {unit} failed because of unavailable resources or another system "
                         f"error. ({error})")


def _supervise(unit: str, argv: list[str], env: dict[str, str], home: str, report: int) -> None:
    """The forked child: plays the user manager for one run of the service and records its exit.

    Writes "<pid>" to `report` once the service's exec succeeded, "<pid> <error>" if it failed.
    """
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # so the caller's ssh session does not wait for us
    log = os.open(STATE / f"{unit}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    code, pid = "203", 0  # 203: systemd's EXIT_EXEC
    try:
        exec_read, exec_write = os.pipe()  # close-on-exec: EOF means the exec succeeded
        pid = os.fork()
        if pid == 0:
            os.chdir(home)
            os.dup2(log, 1)
            os.dup2(log, 2)
            try:
                os.execve(argv[0], argv, env)
            except OSError as e:
                os.write(exec_write, f"exec {argv[0]}: {e.strerror}".encode())
            os._exit(203)
        os.close(exec_write)
        with os.fdopen(exec_read) as exec_errors:
            error = exec_errors.read()
        os.write(report, f"{pid} {error}".rstrip().encode())
        os.close(report)
        _, status = os.waitpid(pid, 0)
        code = str(os.waitstatus_to_exitcode(status))
    finally:
        (STATE / f"{unit}.exit.{pid}").write_text(code)
        os._exit(0)


def stop(unit: str) -> None:
    pid = _pid(unit)
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _exit_status(unit, pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    (STATE / f"{unit}.pid").unlink(missing_ok=True)


def show(unit: str, properties: list[str]) -> None:
    pid = _pid(unit)
    code = _exit_status(unit, pid) if pid else "0"
    if code is None:
        running = _alive(pid)
        state = {"MainPID": str(pid), "ActiveState": "active" if running else "deactivating",
                 "SubState": "running" if running else "stop-sigterm", "Result": "success"}
    elif code == "0":
        state = {"MainPID": "0", "ActiveState": "inactive", "SubState": "dead", "Result": "success"}
    else:
        state = {"MainPID": "0", "ActiveState": "failed", "SubState": "failed", "Result": "exit-code"}
    for name in properties or list(state):
        print(f"{name}={state.get(name, '')}")


def main(argv: list[str]) -> int:
    if "--user" not in argv:
        print("fake systemctl: only --user is emulated", file=sys.stderr)
        return 1
    args = [a for a in argv if a != "--user"]
    STATE.mkdir(exist_ok=True)
    command, rest = args[0], args[1:]
    properties = [p for a in rest if a.startswith("--property=") for p in a.split("=", 1)[1].split(",")]
    units = [a for a in rest if not a.startswith("-")]
    if command == "show-environment":
        print(f"HOME={Path.home()}")
    elif command == "daemon-reload":
        daemon_reload()
    elif command in ("enable", "start", "stop"):
        {"enable": enable, "start": start, "stop": stop}[command](units[0])
    elif command == "restart":
        stop(units[0])
        start(units[0])
    elif command == "show":
        show(units[0], properties)
    else:
        print(f"fake systemctl: {command} is not emulated", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
