"""Container probes and lifecycle handlers: exec, httpGet, tcpSocket, grpc and sleep.

A probe returns (success, message); the message is what a kubelet puts in its Unhealthy
event (`Liveness probe failed: HTTP probe failed with statuscode: 500`). Handlers reach
the pod at its IP from the node, as a kubelet does; exec runs through CRI ExecSync.
`Prober` runs one probe of one container on its schedule (initialDelaySeconds,
periodSeconds, timeoutSeconds, success and failure thresholds) and reports changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from socialweb_computer.node.cri import runtime as cri

Object = dict[str, Any]
USER_AGENT = "kube-probe/1.37"


def _port(value: Any, container: Object) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port.get("containerPort", 0))
    raise ValueError(f"couldn't find port {value!r} in container")


async def run_handler(
    handler: Object,
    *,
    runtime: cri.Runtime,
    container_id: str,
    container: Object,
    pod_ip: str,
    timeout: float,
) -> tuple[bool, str]:
    """Runs one probe or lifecycle handler; returns (success, failure message)."""
    try:
        if "exec" in handler:
            return await _exec(handler["exec"], runtime, container_id, timeout)
        if "httpGet" in handler:
            return await _http(handler["httpGet"], container, pod_ip, timeout)
        if "tcpSocket" in handler:
            return await _tcp(handler["tcpSocket"], container, pod_ip, timeout)
        if "grpc" in handler:
            return await _grpc(handler["grpc"], pod_ip, timeout)
        if "sleep" in handler:
            await asyncio.sleep(int(handler["sleep"].get("seconds", 0)))
            return True, ""
    except ValueError as exc:
        return False, str(exc)
    return False, "unknown handler type"


async def _exec(spec: Object, runtime: cri.Runtime, container_id: str, timeout: float) -> tuple[bool, str]:
    command = list(spec.get("command") or [])
    try:
        reply = await runtime.exec_sync(container_id, command, timeout)
    except cri.CriError as exc:
        if "timeout" in exc.message or "deadline" in exc.message.lower():
            return False, f"command {command!r} timed out"
        return False, exc.message
    if reply.exit_code == 0:
        return True, ""
    output = (reply.stdout + reply.stderr).decode(errors="replace")
    return False, output


async def _http(spec: Object, container: Object, pod_ip: str, timeout: float) -> tuple[bool, str]:
    host = spec.get("host") or pod_ip
    port = _port(spec.get("port"), container)
    scheme = (spec.get("scheme") or "HTTP").lower()
    path = spec.get("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    url = f"{scheme}://{host}:{port}{path}"
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
    for header in spec.get("httpHeaders") or []:
        headers[header.get("name", "")] = header.get("value", "")
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                url,
                headers=headers,
                ssl=False,
                allow_redirects=True,  # probes never verify TLS, as upstream
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response,
        ):
            await response.content.read(10 << 10)
            if 200 <= response.status < 400:
                return True, ""
            return False, f"HTTP probe failed with statuscode: {response.status}"
    except TimeoutError:
        return False, (
            f'Get "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
        )
    except aiohttp.ClientConnectorError as exc:
        return False, f'Get "{url}": dial tcp {host}:{port}: connect: {_connect_reason(exc)}'
    except aiohttp.ClientError as exc:
        return False, f'Get "{url}": {exc}'


# How Go's syscall package words the errors a dial sees (what a kubelet's probe messages carry).
_GO_ERRNO = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network is unreachable",
    errno.ETIMEDOUT: "connection timed out",
    errno.ECONNRESET: "connection reset by peer",
}


def _connect_reason(exc: BaseException) -> str:
    error = getattr(exc, "os_error", exc)
    code = getattr(error, "errno", None)
    if code in _GO_ERRNO:
        return _GO_ERRNO[code]
    return str(error).lower()


async def _tcp(spec: Object, container: Object, pod_ip: str, timeout: float) -> tuple[bool, str]:
    host = spec.get("host") or pod_ip
    port = _port(spec.get("port"), container)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except TimeoutError:
        return False, f"dial tcp {host}:{port}: i/o timeout"
    except OSError as exc:
        return False, f"dial tcp {host}:{port}: connect: {_connect_reason(exc)}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, ""


async def _grpc(spec: Object, pod_ip: str, timeout: float) -> tuple[bool, str]:
    target = f"{pod_ip}:{int(spec.get('port', 0))}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(
                health_pb2.HealthCheckRequest(service=spec.get("service") or ""), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return False, f'timeout: failed to connect service "{target}" within {timeout:g}s'
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return False, f'timeout: failed to connect service "{target}" within {timeout:g}s'
            return False, f"rpc error: code = {exc.code().name} desc = {exc.details()}"
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return True, ""
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return False, f'service unhealthy (responded with "{name}")'


# ---------------------------------------------------------------- the schedule of one probe


@dataclasses.dataclass(frozen=True)
class Schedule:
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, probe: Object) -> Schedule:
        return cls(
            float(probe.get("initialDelaySeconds", 0)),
            float(probe.get("periodSeconds", 10)),
            float(probe.get("timeoutSeconds", 1)),
            int(probe.get("successThreshold", 1)),
            int(probe.get("failureThreshold", 3)),
        )


class Prober:
    """Runs one probe until cancelled; `on_result(success, message)` gets each settled change.

    `result` is None until the first decision (a readiness probe's container is not ready
    before it; a startup probe's container is not started), then True/False.
    """

    def __init__(
        self,
        kind: str,
        probe: Object,
        run: Callable[[float], Awaitable[tuple[bool, str]]],
        on_result: Callable[[str, bool, str], None],
        on_failure: Callable[[str, str], None],
    ) -> None:
        self.kind = kind
        self.probe = probe
        self.schedule = Schedule.of(probe)
        self._run = run
        self._on_result = on_result
        self._on_failure = on_failure
        self.result: bool | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, name: str) -> None:
        self._task = asyncio.create_task(self._loop(), name=name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        await asyncio.sleep(self.schedule.initial_delay)
        successes = failures = 0
        while True:
            ok, message = await self._run(self.schedule.timeout)
            if ok:
                successes, failures = successes + 1, 0
                if successes >= self.schedule.success_threshold and self.result is not True:
                    self.result = True
                    self._on_result(self.kind, True, "")
            else:
                successes, failures = 0, failures + 1
                self._on_failure(self.kind, message)
                if failures >= self.schedule.failure_threshold and self.result is not False:
                    self.result = False
                    self._on_result(self.kind, False, message)
                    if self.kind in ("liveness", "startup"):
                        return  # the container is restarted; a new prober starts with it
            await asyncio.sleep(self.schedule.period)
