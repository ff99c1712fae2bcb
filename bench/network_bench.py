"""Service connection and cluster DNS latency from a pod, beside a direct pod-IP connection.

Why: a pod that talks to a Service pays for the node's rules (a DNAT chosen by nftables) and,
by name, for a lookup at the node's cluster DNS; the floor is the same connection straight to
the server pod's IP, measured by the same client in the same run.

1. starts a registry on loopback with busybox and a Python image, a gateway with cluster
   `bench` and one sandbox node;
2. a server pod (busybox httpd) behind a ClusterIP Service `web`;
3. a client pod (Python) that runs PROBE: `--connections` rounds of, one after another, an
   HTTP GET on a new TCP connection to the pod IP (floor), to the ClusterIP, and by name
   (lookup included, the search path as resolv.conf gives it), and a lookup alone
   (getaddrinfo of the absolute name, and of the short name through the search path); the
   cases take turns so the machine's load falls on each alike;
4. prints p50/p99 beside the floor. It asserts nothing.

    .venv/bin/python bench/network_bench.py
    .venv/bin/python bench/network_bench.py --connections 200

tests/bench/test_network_bench.py runs PROBE on loopback so the client part keeps working.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes

# Runs inside the client pod (and in the bench's test): argv = connections, pod IP, ClusterIP,
# absolute name, short name, port of the pod, port of the Service. Prints one JSON object.
PROBE = r"""
import json, socket, sys, time
count, pod_ip, cluster_ip, name, short, pod_port, svc_port = sys.argv[1:8]
count, pod_port, svc_port = int(count), int(pod_port), int(svc_port)

def get(host, port, resolve):
    started = time.perf_counter()
    address = (host, port)
    if resolve:
        address = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        while s.recv(65536):
            pass
    return time.perf_counter() - started

def lookup(host):
    started = time.perf_counter()
    socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)
    return time.perf_counter() - started

cases = {
    "pod IP (floor)": lambda: get(pod_ip, pod_port, False),
    "ClusterIP": lambda: get(cluster_ip, svc_port, False),
    "by name (lookup + connect)": lambda: get(short, svc_port, True),
    "lookup, absolute name": lambda: lookup(name),
    "lookup, short name (search path)": lambda: lookup(short),
}
out = {case: [] for case in cases}
for run in cases.values():
    run()  # warm up
for _ in range(count):  # interleaved, so that the machine's load falls on every case alike
    for case, run in cases.items():
        out[case].append(run())
print(json.dumps(out))
"""


def _manifests(image: str, python: str, connections: int, pod_ip: str, cluster_ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": python,
                    "command": [
                        "python3",
                        "-c",
                        PROBE,
                        str(connections),
                        pod_ip,
                        cluster_ip,
                        "web.bench.svc.cluster.local.",
                        "web",
                        "8080",
                        "80",
                    ],
                }
            ],
        },
    }


def _wait(tenant: Any, what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except Exception:  # not there yet
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def measure(connections: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="network-bench-") as tmp:
        work = Path(tmp)
        with images.Registry.start(work / "registry") as registry:
            busybox = registry.push(images.busybox_image(), "bench/busybox:1")
            python = registry.push(images.python_image(), "bench/python:1")
            spec = {"clusters": [{"name": "bench"}]}
            with gateway_mod.GatewayProcess.start(work / "state", spec, timeout=60) as gw:
                gw.wait_phase("bench", "Ready", timeout=60)
                kubeconfig = gw.tenant_kubeconfig("bench")

                def kubectl(*args: str, input: str | None = None) -> str:
                    return gw.kubectl_with(kubeconfig, *args, input=input).stdout

                with nodes.sandbox_node(gw.state_dir, "bench", host_ports=[registry.port]):
                    kubectl("create", "namespace", "bench")
                    script = "mkdir -p /w && hostname > /w/index.html && exec httpd -f -p 8080 -h /w"
                    kubectl(
                        "run",
                        "web",
                        "-n",
                        "bench",
                        "-l",
                        "app=web",
                        f"--image={busybox}",
                        "--port=8080",
                        "--",
                        "sh",
                        "-c",
                        script,
                    )
                    kubectl("expose", "pod", "web", "-n", "bench", "--port=80", "--target-port=8080")
                    pod_ip = _wait(
                        None,
                        "the server pod",
                        lambda: json.loads(kubectl("get", "pod", "web", "-n", "bench", "-o", "json"))[
                            "status"
                        ].get("podIP"),
                    )
                    cluster_ip = json.loads(kubectl("get", "service", "web", "-n", "bench", "-o", "json"))[
                        "spec"
                    ]["clusterIP"]
                    probe = _manifests(busybox, python, connections, pod_ip, cluster_ip)
                    kubectl("apply", "-n", "bench", "-f", "-", input=json.dumps(probe))
                    _wait(
                        None,
                        "the probe",
                        lambda: (
                            json.loads(kubectl("get", "pod", "probe", "-n", "bench", "-o", "json"))[
                                "status"
                            ].get("phase")
                            in ("Succeeded", "Failed")
                        ),
                        timeout=600,
                    )
                    log = kubectl("logs", "probe", "-n", "bench")
                    return json.loads(log.strip().splitlines()[-1])


def report(figures: dict[str, list[float]]) -> None:
    floor = figures["pod IP (floor)"]
    floor_p50 = common.percentile(tuple(sorted(floor)), 50)
    print(f"{len(floor)} measurements per case, sequential, one client pod, one node")
    print(f"{'measure':<36} {'p50 ms':>8} {'p99 ms':>8} {'p50 x':>6}")
    print("-" * 62)
    for case, values in figures.items():
        ordered = tuple(sorted(values))
        p50, p99 = common.percentile(ordered, 50), common.percentile(ordered, 99)
        print(f"{case:<36} {p50 * 1000:8.2f} {p99 * 1000:8.2f} {p50 / floor_p50 if floor_p50 else 0:6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=100)
    args = parser.parse_args()
    report(measure(args.connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
