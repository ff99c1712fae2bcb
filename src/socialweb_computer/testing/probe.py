"""Raw HTTPS to one cluster with a kubeconfig, and a probe that measures a neighbour's latency.

Tests and benchmarks of tenant isolation need the exact Status of a refusal (so no kubectl in
between) and the latency a quiet tenant sees while another one misbehaves:

    client = Client.from_kubeconfig(gateway.tenant_kubeconfig("b"))
    code, body, headers = client.request("GET", "/api/v1/namespaces/default")
    with LatencyProbe(client, "/api/v1/namespaces/default") as probe:
        ...abuse another tenant...
    print(probe.result.p99)

The probe keeps one connection open, as a real client does, so what it measures is the
server's time and the time it waits for the event loop, not a TLS handshake per request.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from socialweb_computer.testing import server as server_mod


class Client:
    """One persistent HTTPS connection; reconnects after a failure."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, *, timeout: float = 30.0) -> None:
        self.host, self.port, self.context, self.timeout = host, port, context, timeout
        self._connection: http.client.HTTPSConnection | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_kubeconfig(cls, path: Path | str, *, timeout: float = 30.0) -> Client:
        credentials = server_mod.read_kubeconfig(Path(path))
        return cls.from_credentials(credentials, timeout=timeout)

    @classmethod
    def from_credentials(cls, credentials: server_mod.Credentials, *, timeout: float = 30.0) -> Client:
        with tempfile.TemporaryDirectory() as scratch:
            files = {name: Path(scratch) / name for name in ("ca", "crt", "key")}
            files["ca"].write_bytes(credentials.ca_pem)
            files["crt"].write_bytes(credentials.cert_pem)
            files["key"].write_bytes(credentials.key_pem)
            files["key"].chmod(0o600)
            context = ssl.create_default_context(cafile=str(files["ca"]))
            context.load_cert_chain(str(files["crt"]), str(files["key"]))
        host, _, port = credentials.server.removeprefix("https://").rstrip("/").rpartition(":")
        return cls(host.strip("[]"), int(port), context, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> tuple[int, Any, http.client.HTTPMessage]:
        """(status, decoded JSON body or the raw bytes, response headers)."""
        if isinstance(body, dict | list):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        with self._lock:
            for attempt in (1, 2):
                connection = self._connection or http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=self.timeout)
                try:
                    connection.request(method, path, body=body,
                                       headers={"Content-Type": content_type, **(headers or {})})
                    response = connection.getresponse()
                    data = response.read()
                except (OSError, http.client.HTTPException):
                    connection.close()
                    self._connection = None
                    if attempt == 2:
                        raise
                    continue
                self._connection = None if response.will_close else connection
                try:
                    decoded: Any = json.loads(data) if data else {}
                except ValueError:
                    decoded = data
                return response.status, decoded, response.headers
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (as bench/common.py computes it)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclasses.dataclass
class Latencies:
    samples: list[float] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)

    @property
    def slowest(self) -> float:
        return max(self.samples, default=math.nan)

    def summary(self) -> str:
        return (f"{len(self.samples)} ok, {len(self.failures)} failed, p50 {self.p50 * 1000:.1f} ms, "
                f"p99 {self.p99 * 1000:.1f} ms, slowest {self.slowest * 1000:.1f} ms")


class LatencyProbe:
    """GETs `path` back to back (with `pause` between) on its own thread until stopped."""

    def __init__(self, client: Client, path: str, *, pause: float = 0.005, expect: int = 200) -> None:
        self.client, self.path, self.pause, self.expect = client, path, pause, expect
        self.result = Latencies()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="latency-probe", daemon=True)

    def __enter__(self) -> LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Latencies:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.result

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                code, body, _ = self.client.request("GET", self.path)
            except (OSError, http.client.HTTPException) as e:
                self.result.failures.append(repr(e))
            else:
                if code == self.expect:
                    self.result.samples.append(time.perf_counter() - started)
                else:
                    self.result.failures.append(f"{code}: {body!r:.200}")
            self._stop.wait(self.pause)


def measure(client: Client, path: str, count: int = 200) -> Latencies:
    """`count` sequential GETs of `path`: a quiet baseline."""
    result = Latencies()
    for _ in range(count):
        started = time.perf_counter()
        code, body, _ = client.request("GET", path)
        if code == 200:
            result.samples.append(time.perf_counter() - started)
        else:
            result.failures.append(f"{code}: {body!r:.200}")
    return result


def hammer(kubeconfig: Path | str, path: str, *, clients: int, seconds: float) -> dict[int, int]:
    """Send GETs of `path` from `clients` threads for `seconds`, in a child process (so the
    caller's own measurements do not share a GIL with them); returns the count of each status."""
    import subprocess
    import sys

    script = (
        "import collections, json, sys, threading, time\n"
        "from socialweb_computer.testing import probe\n"
        "kubeconfig, path = sys.argv[1], sys.argv[2]\n"
        "clients, seconds = int(sys.argv[3]), float(sys.argv[4])\n"
        "codes = collections.Counter()\n"
        "deadline = time.monotonic() + seconds\n"
        "def run():\n"
        "    c = probe.Client.from_kubeconfig(kubeconfig)\n"
        "    while time.monotonic() < deadline:\n"
        "        try:\n"
        "            codes[c.request('GET', path)[0]] += 1\n"
        "        except Exception:\n"
        "            codes[0] += 1\n"
        "threads = [threading.Thread(target=run) for _ in range(clients)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(json.dumps(codes))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(kubeconfig), path, str(clients), str(seconds)],
                          capture_output=True, text=True, timeout=seconds + 60, check=True)
    return {int(code): count for code, count in json.loads(done.stdout).items()}
