"""Run the real apiserver as a child process and drive it with real clients.

End-to-end tests and benchmarks must see the server the way a user does: a separate process
serving HTTPS on loopback, reached with the kubeconfig it writes, by the pinned kubectl in the
repo's .tools/bin (never the machine's), helm, or the official Python client.  This module owns
that plumbing so each test does not reinvent it.  Called by tests/conftest.py (the `apiserver`
and `shared_apiserver` fixtures) and by bench/ scripts.

    server = ApiServerProcess.start(tmp_path / "state")
    server.kubectl("get", "namespaces", "-o", "name").stdout
    server.stop()

The launch command is `python -m socialweb_computer apiserver --state-dir DIR --port PORT`;
the server writes DIR/admin.kubeconfig and answers `GET /readyz` with 200 "ok" once ready.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # the kubernetes client is a test extra, imported only when asked for
    from kubernetes import client as k8s_client

REPO_ROOT = Path(__file__).resolve().parents[3]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
KUBECONFIG_NAME = "admin.kubeconfig"
DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "socialweb_computer")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
TOOL_TIMEOUT = 60.0
_POLL_INTERVAL = 0.05
_PROBE_TIMEOUT = 2.0
_LOG_TAIL_CHARS = 4000

# Environment variables of the caller that would make kubectl/helm read or write outside the
# per-server home, or talk to another cluster.
_TOOL_ENV_DROPPED = ("KUBECONFIG", "KUBECACHEDIR", "HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME",
                     "HELM_KUBECONTEXT", "HELM_NAMESPACE")


class ToolMissingError(RuntimeError):
    """The pinned kubectl/helm is not installed in the repo's .tools/bin."""


class ServerStartError(RuntimeError):
    """The server exited, or did not become ready in time; the message carries its log tail."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl/helm call failed; unlike CalledProcessError, str() shows stdout and stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


class CommandTimeout(subprocess.TimeoutExpired):
    """A kubectl/helm call hung; str() shows whatever it printed before it was killed."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n--- stdout ---\n{self.output}\n--- stderr ---\n{self.stderr}"


def tool_path(name: str) -> Path:
    """Path of a pinned tool (kubectl, helm) in .tools/bin; raises ToolMissingError if absent."""
    path = TOOLS_BIN / name
    if not os.access(path, os.X_OK):
        raise ToolMissingError(f"{path} is missing: run scripts/install-tools.sh")
    return path


@dataclass(frozen=True)
class Credentials:
    """What a kubeconfig's current context says about how to reach and log in to the server."""

    server: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def read_kubeconfig(path: Path) -> Credentials:
    """Credentials of the current context (or the first one) of the kubeconfig at `path`.

    Raises ValueError (or OSError) while the file is absent, partly written or incomplete.
    """
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a kubeconfig")
    context = _named(config, "contexts", config.get("current-context"))
    cluster = _named(config, "clusters", context.get("cluster"))
    user = _named(config, "users", context.get("user"))
    return Credentials(
        server=str(cluster["server"]),
        ca_pem=_pem_field(cluster, "certificate-authority", path.parent),
        cert_pem=_pem_field(user, "client-certificate", path.parent),
        key_pem=_pem_field(user, "client-key", path.parent),
    )


def _named(config: Mapping[str, Any], section: str, name: object) -> Mapping[str, Any]:
    entries = config.get(section) or []
    for entry in entries:
        if name is None or entry.get("name") == name:
            return entry[section.removesuffix("s")]
    raise ValueError(f"kubeconfig has no {section} entry named {name!r}")


def _pem_field(entry: Mapping[str, Any], field: str, base: Path) -> bytes:
    # A kubeconfig may embed the PEM (`<field>-data`, base64) or point at a file (`<field>`).
    if entry.get(f"{field}-data"):
        return base64.b64decode(entry[f"{field}-data"])
    if entry.get(field):
        return (base / entry[field]).read_bytes()
    raise ValueError(f"kubeconfig entry lacks {field}")


class ApiServerProcess:
    """A running `socialweb-computer apiserver` child process and the clients that reach it.

    Build one with `ApiServerProcess.start(...)`; it is also a context manager that stops the
    server on exit.  Attributes: state_dir, kubeconfig, url, port, ca_file, cert_file, key_file
    (PEMs extracted from the kubeconfig, written next to it), stdout_path, stderr_path, home
    (a private HOME for kubectl/helm so their caches never leak between servers).
    """

    def __init__(self, popen: subprocess.Popen[bytes], state_dir: Path) -> None:
        self._popen = popen
        self.state_dir = state_dir
        self.kubeconfig = state_dir / KUBECONFIG_NAME
        self.stdout_path = state_dir / "apiserver.stdout.log"
        self.stderr_path = state_dir / "apiserver.stderr.log"
        self.ca_file = state_dir / f"{KUBECONFIG_NAME}.ca.pem"
        self.cert_file = state_dir / f"{KUBECONFIG_NAME}.cert.pem"
        self.key_file = state_dir / f"{KUBECONFIG_NAME}.key.pem"
        self.home = Path(tempfile.mkdtemp(prefix="swc-client-home-"))
        # Removed by stop(), or when this object is collected or the interpreter exits, so a test
        # that kills a server and never stops it leaves nothing behind.
        self._remove_home = weakref.finalize(self, shutil.rmtree, str(self.home), ignore_errors=True)
        self.url = ""
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    def start(cls, state_dir: Path | str, *, port: int = 0, extra_args: Sequence[str] = (),
              env: Mapping[str, str] | None = None, command: Sequence[str] = DEFAULT_COMMAND,
              timeout: float = START_TIMEOUT) -> ApiServerProcess:
        """Launch the server on `state_dir` and wait (at most `timeout` s) until /readyz says ok.

        `port` 0 lets the server pick a free port.  `env` is added to this process's environment.
        `command` replaces the `python -m socialweb_computer` prefix (tests use a stand-in).
        On failure the child is killed and ServerStartError carries its log tail.
        """
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        argv = [*command, "apiserver", "--state-dir", str(state_dir), "--port", str(port), *extra_args]
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with (open(state_dir / "apiserver.stdout.log", "ab") as out,
              open(state_dir / "apiserver.stderr.log", "ab") as err):
            # A new session: the server's children form one group we can kill as a whole.
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     env=child_env, start_new_session=True)
        server = cls(popen, state_dir)
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop(timeout=2.0)
            raise
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_problem = "kubeconfig not written yet"
        while True:
            if self._popen.poll() is not None:
                raise ServerStartError(f"apiserver exited with {self._popen.returncode} before it was "
                                       f"ready ({last_problem})\n{self.logs()}")
            problem = self._probe_once()
            if problem is None:
                return
            last_problem = problem
            if time.monotonic() >= deadline:
                raise ServerStartError(f"apiserver not ready after {timeout:.0f}s ({last_problem})\n"
                                       f"{self.logs()}")
            time.sleep(_POLL_INTERVAL)

    def _probe_once(self) -> str | None:
        """None when the server is ready, else what is still wrong."""
        try:
            credentials = read_kubeconfig(self.kubeconfig)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
            return f"kubeconfig not usable yet: {exc!r}"
        self._adopt(credentials)
        try:
            status, body = self._get("/readyz")
        except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
            return f"GET /readyz failed: {exc!r}"
        if status == 200 and body.strip() == b"ok":
            return None
        return f"GET /readyz answered {status} {body[:200]!r}"

    def _adopt(self, credentials: Credentials) -> None:
        self.url = credentials.server.rstrip("/")
        self.port = urllib.parse.urlsplit(self.url).port or 443
        _write_file(self.ca_file, credentials.ca_pem)
        _write_file(self.cert_file, credentials.cert_pem)
        _write_file(self.key_file, credentials.key_pem, private=True)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the server has exited (negative: killed by that signal), else None."""
        return self._popen.poll()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server process without waiting (for crash and restart tests)."""
        self._popen.send_signal(sig)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server to exit; raises subprocess.TimeoutExpired after `timeout` s."""
        return self._popen.wait(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then SIGKILL to the whole process group after `timeout` s; returns the exit status."""
        if self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                # The leader is not reaped yet, so its pid still names our group: safe to kill.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._popen.pid, signal.SIGKILL)
                self._popen.wait()
        self._remove_home()
        return self._popen.returncode

    def __enter__(self) -> ApiServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def logs(self, limit: int = _LOG_TAIL_CHARS) -> str:
        """The last `limit` characters of the server's stdout and stderr, for failure messages."""
        parts = []
        for path in (self.stdout_path, self.stderr_path):
            try:
                text = path.read_bytes()[-limit:].decode(errors="replace")
            except OSError:
                text = "(none)"
            parts.append(f"--- {path.name} ---\n{text}")
        return "\n".join(parts)

    # ---- clients ---------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts the server's CA and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context

    def _get(self, path: str) -> tuple[int, bytes]:
        parts = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPSConnection(parts.hostname or "127.0.0.1", parts.port,
                                                 context=self.ssl_context(), timeout=_PROBE_TIMEOUT)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                env: Mapping[str, str] | None = None,
                timeout: float = TOOL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this server (text mode); raises CommandError on failure."""
        return self._run_tool("kubectl", [f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, check=check, env=env, timeout=timeout)

    def helm(self, *args: str, input: str | None = None, check: bool = True,
             env: Mapping[str, str] | None = None,
             timeout: float = TOOL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run the pinned helm against this server (text mode); raises CommandError on failure."""
        return self._run_tool("helm", [f"--kubeconfig={self.kubeconfig}", *args],
                              input=input, check=check, env=env, timeout=timeout)

    def tool_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment kubectl/helm run with: private HOME and XDG dirs, SPDY for exec/attach."""
        base = {key: value for key, value in os.environ.items() if key not in _TOOL_ENV_DROPPED}
        return {
            **base,
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "XDG_DATA_HOME": str(self.home / ".local" / "share"),
            "PATH": f"{TOOLS_BIN}{os.pathsep}{base.get('PATH', os.defpath)}",
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
            **(env or {}),
        }

    def _run_tool(self, name: str, args: list[str], *, input: str | None, check: bool,
                  env: Mapping[str, str] | None, timeout: float) -> subprocess.CompletedProcess[str]:
        argv = [str(tool_path(name)), *args]
        try:
            result = subprocess.run(argv, input=input, capture_output=True, text=True,
                                    env=self.tool_env(env), timeout=timeout, check=False,
                                    stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(exc.cmd, exc.timeout, _text(exc.output), _text(exc.stderr)) from None
        if check and result.returncode != 0:
            raise CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def python_client(self) -> k8s_client.ApiClient:
        """An ApiClient of the official `kubernetes` package configured from the kubeconfig.

        Use it as a context manager (`with server.python_client() as api:`) so its pool is closed.
        """
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)


def logged_tracebacks(server: ApiServerProcess) -> list[str]:
    """The lines of the server's stderr log that carry a traceback (a logged exception).

    The server logs one line per event, folding a traceback into its line, so each entry is
    one whole event. Tests fail on any: an ordinary event (a client closing its watch) must
    never be logged as one."""
    try:
        text = server.stderr_path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if "Traceback (most recent call last)" in line]


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def _write_file(path: Path, data: bytes, *, private: bool = False) -> None:
    # Rewritten at each probe (the server may regenerate credentials on restart); keys are
    # created 0600 so they are never readable by others, even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
