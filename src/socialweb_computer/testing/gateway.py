"""Run the real gateway as a child process, for end-to-end tests and benchmarks.

    with GatewayProcess.start(tmp_path / "state", {"clusters": [{"name": "ci"}]}) as gw:
        gw.kubectl("get", "clusters")                       # the admin plane
        gw.kubectl_with(gw.tenant_kubeconfig("ci"), "get", "namespaces")

It is an `ApiServerProcess` whose kubeconfig is the admin plane's; ready means the
gateway's own `/readyz` (HTTP API) says ok and `gateway.json` names this process. The
spec is written next to the state directory; ports default to free ones (apiPort and
adminPort 0, a free block of cluster ports) unless the spec says otherwise.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.testing import server as server_mod

DEFAULT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "socialweb_computer")


def free_port_block(size: int, *, low: int = 20000, high: int = 32000) -> tuple[int, int]:
    """A run of `size` loopback ports that are free now, below the kernel's ephemeral range."""
    for _ in range(200):
        start = random.randrange(low, high - size)
        if all(app_mod.bind_error("127.0.0.1", port) is None for port in range(start, start + size)):
            return start, start + size - 1
    raise RuntimeError(f"no block of {size} free ports between {low} and {high}")


def with_free_ports(spec: Mapping[str, Any], cluster_ports: int = 20) -> dict[str, Any]:
    """`spec` with any listen port it leaves out set to a free one."""
    result = copy.deepcopy(dict(spec))
    listen = result.setdefault("listen", {})
    listen.setdefault("apiPort", 0)
    listen.setdefault("adminPort", 0)
    if "clusterPorts" not in listen:
        low, high = free_port_block(cluster_ports)
        listen["clusterPorts"] = f"{low}-{high}"
    return result


def _parent_of(pid: object) -> int | None:
    try:
        with open(f"/proc/{int(pid)}/stat") as f:  # type: ignore[call-overload]
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, TypeError, IndexError):
        return None


class GatewayProcess(server_mod.ApiServerProcess):
    spec_path: Path
    api_url: str
    require_ready: bool = True

    @classmethod
    def start(
        cls,
        state_dir: Path | str,
        spec: Mapping[str, Any] | None = None,
        *,  # type: ignore[override]
        port: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        command: Sequence[str] = DEFAULT_COMMAND,
        timeout: float = 30.0,
        free_ports: bool = True,
        ready: bool = True,
    ) -> GatewayProcess:
        """`ready=False` returns once the gateway answers `/readyz` at all (200 or 503): for tests of
        a gateway that serves but reports a problem."""
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        spec_path = state_dir.parent / f"{state_dir.name}.spec.yaml"
        if spec is not None or not spec_path.exists():
            body = with_free_ports(spec or {}) if free_ports else dict(spec or {})
            spec_path.write_text(yaml.safe_dump(body))
        argv = [*command, "gateway", "--state-dir", str(state_dir), "--spec", str(spec_path), *extra_args]
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with (
            open(state_dir / "apiserver.stdout.log", "ab") as out,
            open(state_dir / "apiserver.stderr.log", "ab") as err,
        ):
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env, start_new_session=True
            )
        gateway = cls(popen, state_dir)
        gateway.spec_path = spec_path
        gateway.api_url = ""
        gateway.require_ready = ready
        try:
            gateway._wait_ready(timeout)
        except BaseException:
            gateway.stop(timeout=2.0)
            raise
        return gateway

    def restart(self, *, timeout: float = 30.0, ready: bool = True) -> GatewayProcess:
        """Start a new gateway on the same state directory and spec (after stop() or kill())."""
        return GatewayProcess.start(self.state_dir, None, timeout=timeout, ready=ready)

    def _probe_once(self) -> str | None:
        try:
            document = json.loads((self.state_dir / "gateway.json").read_text())
        except (OSError, ValueError) as exc:
            return f"gateway.json not usable yet: {exc!r}"
        if self.pid not in (document.get("pid"), _parent_of(document.get("pid"))):
            # (The single-file binary's bootloader is our child; the gateway is its child.)
            return "gateway.json is from an earlier process"
        self.api_url = document["apiURL"]
        try:
            with urllib.request.urlopen(f"{self.api_url}/readyz", timeout=2) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 503 and not self.require_ready:
                body = b"ok"  # it answers; what it reports is the test's business
            else:
                return f"GET /readyz failed: {exc!r}"
        except (OSError, urllib.error.URLError) as exc:
            return f"GET /readyz failed: {exc!r}"
        if body.strip() != b"ok":
            return f"GET /readyz answered {body[:200]!r}"
        self._adopt(server_mod.read_kubeconfig(self.kubeconfig))
        return None

    # ---- what the gateway says ---------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.api_url}/api/config", timeout=5) as response:
            return json.loads(response.read())

    def tenant_kubeconfig(self, name: str) -> Path:
        return self.state_dir / "clusters" / name / "admin.kubeconfig"

    def cluster_url(self, name: str) -> str:
        return self.kubectl("get", "cluster", name, "-o", "jsonpath={.status.url}").stdout

    def wait_phase(self, name: str, phase: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.kubectl("get", "cluster", name, "-o", "json", check=False)
            if result.returncode == 0:
                cluster = json.loads(result.stdout)
                if cluster.get("status", {}).get("phase") == phase:
                    return cluster
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"cluster {name} not {phase} after {timeout}s: {result.stdout}"
                    f"{result.stderr}\n{self.logs()}"
                )
            time.sleep(0.1)

    def kubectl_with(
        self,
        kubeconfig: Path | str,
        *args: str,
        input: str | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        timeout: float = server_mod.TOOL_TIMEOUT,
    ) -> subprocess.CompletedProcess[str]:
        """The pinned kubectl with another kubeconfig (a tenant's, a runner's)."""
        return self._run_tool(
            "kubectl",
            [f"--kubeconfig={kubeconfig}", *args],
            input=input,
            check=check,
            env=env,
            timeout=timeout,
        )
