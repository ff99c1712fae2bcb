"""A quiet tenant's latency while another tenant abuses the gateway, beside its quiet latency
in the same run; and what validating built-in objects costs on the create path.

Why: every tenant is served by one process and one event loop (issue 11). The target is that
a neighbour's p99 stays within 2x of its quiet p99 while one tenant is abusive. This script
starts the real gateway (`socialweb-computer gateway`, two tenants `abuser` and `neighbour`,
the spec's default limits unless told otherwise) and, for each case:

1. measures the neighbour quietly: `--samples` sequential GETs of a namespace on one kept-alive
   connection (what a client's informer or kubectl sees of the server, not of TLS);
2. starts the abuse in a child process (so the abuser and the measuring never share a GIL) and
   measures the neighbour again while it runs.

Cases: `flood` (seed step 5's runner role creating a Deployment of 2,147,483,647 replicas, until
the cluster's pod limit stops it; the Deployment is deleted afterwards, its pods garbage
collected, unmeasured), `alias-bomb`, `patch-copies` (60 JSON-patch `copy` operations),
`deep-json` (2,000 levels), `unknown-fields` (20,000 of them, fieldValidation=Warn),
`wrong-types` (wrongly typed built-in objects), `watches` (up to the watch limit, held), and
`requests` (60 clients hammering lists on connections opened before the measurement).

Second, in-process: the create path of the generic store (a Pod and a Deployment, SQLite in
memory, no controllers) with the Go-type decoding, required fields and field rules on and off,
alternating `--rounds` times; its floor is the same path with validation off.

Nothing is asserted; the last table holds the ratios.

    .venv/bin/python bench/isolation_bench.py
    .venv/bin/python bench/isolation_bench.py --cases flood,requests --seconds 10 --pods 300
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from socialweb_computer.clusterprovider import credential
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import probe, seed
from socialweb_computer.testing import server as server_mod

PROBE_PATH = "/api/v1/namespaces/default"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
CASES = ("flood", "alias-bomb", "patch-copies", "deep-json", "unknown-fields", "wrong-types", "watches",
         "requests")
BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""
FLOOD = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "flood"},
    "spec": {"replicas": 2147483647, "selector": {"matchLabels": {"app": "flood"}},
             "template": {"metadata": {"labels": {"app": "flood"}},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
}
WRONG = [
    (CONFIGMAPS, {"metadata": {"name": "t1"}, "data": {"a": 1}}),
    ("/api/v1/namespaces/default/pods", {"metadata": {"name": "t2"}, "spec": {
        "containers": [{"name": "c", "image": "x"}], "readinessGates": [1]}}),
    ("/api/v1/namespaces/default/services",
     {"metadata": {"name": "t3"}, "spec": {"ports": [{"port": 70000}]}}),
    ("/apis/apps/v1/namespaces/default/deployments", {"metadata": {"name": "t4"}, "spec": {"replicas": "x"}}),
]


# --------------------------------------------------------------------------- the abuser (child process)


def abuse(case: str, kubeconfig: str, seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
    """Run one abuse against the abuser tenant for `seconds` (in the child process)."""
    c = probe.Client.from_kubeconfig(kubeconfig)
    deadline = time.monotonic() + seconds
    codes: dict[int, int] = {}

    def count(code: int) -> None:
        codes[code] = codes.get(code, 0) + 1

    if case == "flood":
        runner = runner_client(extra)
        count(runner.request("POST", "/apis/apps/v1/namespaces/gitlab-runner/deployments", FLOOD)[0])
        while time.monotonic() < deadline:
            code, listed, _ = c.request("GET", "/api/v1/namespaces/gitlab-runner/pods?limit=1")
            if code == 200 and listed["metadata"].get("remainingItemCount", 0) + 1 >= extra["pods"]:
                break
            time.sleep(0.5)
        codes["pods-at-limit-after-s"] = round(seconds - (deadline - time.monotonic()), 1)  # type: ignore[index]
        return codes
    if case == "watches":
        sockets = [open_watch(c) for _ in range(extra["watches"] + 1)]
        time.sleep(max(deadline - time.monotonic(), 0))
        for s in sockets:
            s.close()
        return {"opened": len(sockets)}
    if case == "requests":
        clients = [probe.Client.from_kubeconfig(kubeconfig) for _ in range(60)]
        for each in clients:
            each.request("GET", CONFIGMAPS)  # connections open before the measured part
        print("ready", flush=True)
        sys.stdin.readline()
        deadline = time.monotonic() + seconds

        def hammer(each: probe.Client) -> None:
            while time.monotonic() < deadline:
                count(each.request("GET", CONFIGMAPS)[0])

        threads = [threading.Thread(target=hammer, args=(each,)) for each in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return codes
    send = {
        "alias-bomb": lambda: c.request("POST", CONFIGMAPS, BOMB, "application/yaml"),
        "patch-copies": lambda: c.request(
            "PATCH", f"{CONFIGMAPS}/target",
            json.dumps([{"op": "copy", "from": "/data", "path": f"/data/c{i}"} for i in range(60)]),
            "application/json-patch+json"),
        "deep-json": lambda: c.request(
            "POST", CONFIGMAPS, '{"metadata":{"name":"deep"},"data":{"x":' + "[" * 2000 + "]" * 2000 + "}}"),
        "unknown-fields": lambda: c.request(
            "POST", f"{CONFIGMAPS}?fieldValidation=Warn&dryRun=All",
            {"metadata": {"name": "unknowns"}, **{f"k{i}": i for i in range(20_000)}}),
        "wrong-types": lambda: [c.request("POST", path, body) for path, body in WRONG][-1],
    }[case]
    if case == "patch-copies":
        c.request("POST", CONFIGMAPS, {"metadata": {"name": "target"}, "data": {"a": "b" * 100}})
    while time.monotonic() < deadline:
        count(send()[0])
    return codes


def runner_client(extra: dict[str, Any]) -> probe.Client:
    runner = extra["runner"]
    return probe.Client.from_credentials(server_mod.Credentials(
        runner["server"], *(runner[key].encode() for key in ("ca_pem", "cert_pem", "key_pem"))))


def open_watch(c: probe.Client) -> Any:
    import socket
    raw = socket.create_connection((c.host, c.port), timeout=30)
    sock = c.context.wrap_socket(raw, server_hostname=c.host)
    sock.sendall(f"GET {CONFIGMAPS}?watch=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


# --------------------------------------------------------------------------- the measuring side


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def measure_while(neighbour: probe.Client, child: subprocess.Popen[str], samples: int,
                  seconds: float) -> list[float]:
    """Neighbour latencies until the child finishes (at most `samples`... and `seconds` + grace)."""
    out: list[float] = []
    deadline = time.monotonic() + seconds + 30
    while child.poll() is None and time.monotonic() < deadline:
        started = time.perf_counter()
        code, _, _ = neighbour.request("GET", PROBE_PATH)
        if code == 200:
            out.append(time.perf_counter() - started)
        time.sleep(0.002)
    return out


def run_case(case: str, gw: gateway_mod.GatewayProcess, args: argparse.Namespace,
             extra: dict[str, Any]) -> tuple[list[float], list[float], str]:
    neighbour = probe.Client.from_kubeconfig(gw.tenant_kubeconfig("neighbour"))
    for _ in range(20):
        neighbour.request("GET", PROBE_PATH)
    quiet = []
    for _ in range(args.samples):
        started = time.perf_counter()
        neighbour.request("GET", PROBE_PATH)
        quiet.append(time.perf_counter() - started)
    seconds = args.flood_seconds if case == "flood" else args.seconds
    child = subprocess.Popen(
        [sys.executable, __file__, "--abuse", case, str(gw.tenant_kubeconfig("abuser")), str(seconds),
         json.dumps(extra)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    if case == "requests":
        child.stdout.readline()  # its connections are open
        child.stdin.write("go\n")
        child.stdin.flush()
    during = measure_while(neighbour, child, args.samples, seconds)
    output, _ = child.communicate(timeout=seconds + 120)
    if case == "flood":
        cleanup_flood(gw, extra)
    return quiet, during, output.strip().splitlines()[-1] if output.strip() else ""


def cleanup_flood(gw: gateway_mod.GatewayProcess, extra: dict[str, Any]) -> None:
    runner = runner_client(extra)
    runner.request("DELETE", "/apis/apps/v1/namespaces/gitlab-runner/deployments/flood",
                   {"propagationPolicy": "Background"})
    admin = probe.Client.from_kubeconfig(gw.tenant_kubeconfig("abuser"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        _, listed, _ = admin.request("GET", "/api/v1/namespaces/gitlab-runner/pods?limit=1")
        if not listed.get("items"):
            return
        time.sleep(1)


def gateway_cases(args: argparse.Namespace) -> list[tuple[str, list[float], list[float], str]]:
    spec: dict[str, Any] = {"clusters": [{"name": "abuser"}, {"name": "neighbour"}]}
    limits = {key: value for key, value in (("pods", args.pods), ("watches", args.watches)) if value}
    if limits:
        spec["limits"] = limits
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        gw = gateway_mod.GatewayProcess.start(Path(scratch) / "state", spec, timeout=60)
        try:
            for name in ("abuser", "neighbour"):
                gw.wait_phase(name, "Ready", timeout=60)
            extra = prepare(gw, Path(scratch), args)
            for case in args.cases:
                print(f"... {case}", file=sys.stderr, flush=True)
                quiet, during, note = run_case(case, gw, args, extra)
                results.append((case, quiet, during, note))
            with urllib.request.urlopen(f"{gw.api_url}/readyz", timeout=10) as response:
                assert response.read() == b"ok"
        finally:
            gw.stop()
    return results


def prepare(gw: gateway_mod.GatewayProcess, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    gw.kubectl_with(gw.tenant_kubeconfig("abuser"), "apply", "-f", "-", input=seed.runner_rbac_yaml())
    out = scratch / "runner"
    url = gw.cluster_url("abuser")
    credential.mint_tenant_credential_for_cluster_as(
        state_dir=str(gw.state_dir), cluster="abuser", server=url, common_name="gitlab-runner",
        organizations=["gitlab-runner"], out_dir=str(out))
    runner = {"server": url, **{field: (out / name).read_text() for field, name in (
        ("ca_pem", "ca.crt"), ("cert_pem", "tls.crt"), ("key_pem", "tls.key"))}}
    return {"runner": runner, "pods": args.pods or 1000, "watches": args.watches or 500}


# --------------------------------------------------------------------------- the create path


POD = {"metadata": {"generateName": "p-", "labels": {"app": "x"}}, "spec": {"containers": [{
    "name": "c", "image": "busybox:1", "ports": [{"containerPort": 80}], "env": [{"name": "A", "value": "1"}],
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}
DEPLOYMENT = {"metadata": {"generateName": "d-"}, "spec": {
    "replicas": 3, "selector": {"matchLabels": {"app": "x"}},
    "template": {"metadata": {"labels": {"app": "x"}}, "spec": copy.deepcopy(POD["spec"])}}}


async def create_path(rounds: int, count: int) -> dict[str, dict[str, list[float]]]:
    from socialweb_computer.apiserver import registry as registry_mod
    from socialweb_computer.apiserver import store as store_mod
    from socialweb_computer.apiserver import typecheck
    from socialweb_computer.apiserver.strategies import fields
    from socialweb_computer.storage.memory import MemoryBackend

    real = (typecheck.first_error, fields.causes)
    results: dict[str, dict[str, list[float]]] = {"on": {"Pod": [], "Deployment": []},
                                                   "off": {"Pod": [], "Deployment": []}}
    for _ in range(rounds):
        for mode in ("off", "on"):
            if mode == "off":
                typecheck.first_error = lambda *a, **k: None  # type: ignore[assignment]
                fields.causes = lambda *a, **k: []  # type: ignore[assignment]
            backend = await MemoryBackend.open(compact_interval=0)
            store = store_mod.Store("bench", backend, registry_mod.Registry())
            namespaces = store.registry.lookup("", "v1", "namespaces")
            await store.create(namespaces, "", {"metadata": {"name": "default"}}, store_mod.WriteOptions())
            for plural, group, body in (("pods", "", POD), ("deployments", "apps", DEPLOYMENT)):
                kind = store.registry.lookup(group, "v1", plural)
                for _ in range(count):
                    obj = copy.deepcopy(body)
                    started = time.perf_counter()
                    await store.create(kind, "default", obj, store_mod.WriteOptions(field_manager="bench"))
                    results[mode][kind.kind].append(time.perf_counter() - started)
            await backend.close()
            typecheck.first_error, fields.causes = real
    return results


# --------------------------------------------------------------------------- report


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--abuse":
        case, kubeconfig = sys.argv[2], sys.argv[3]
        seconds, extra = float(sys.argv[4]), json.loads(sys.argv[5])
        print(json.dumps(abuse(case, kubeconfig, seconds, extra)))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--samples", type=int, default=300, help="quiet neighbour requests per case")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each abuse runs")
    parser.add_argument("--flood-seconds", type=float, default=120.0, help="at most this long for the flood")
    parser.add_argument("--pods", type=int, default=0,
                        help="limits.pods of the gateway (default: the spec's)")
    parser.add_argument("--watches", type=int, default=0, help="limits.watches (default: the spec's)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the create-path part")
    parser.add_argument("--creates", type=int, default=300, help="creates per kind per round")
    parser.add_argument("--skip-gateway", action="store_true", help="only the create-path part")
    args = parser.parse_args()
    args.cases = [c for c in args.cases.split(",") if c]
    if not args.skip_gateway:
        rows = gateway_cases(args)
        print("\nneighbour GET latency, quiet vs while the abuser runs (same run)")
        print(f"{'case':<16}{'quiet p50':>10}{'quiet p99':>10}{'abuse p50':>10}{'abuse p99':>10}"
              f"{'p99 x':>8}{'n':>6}  abuser's answers")
        for case, quiet, during, note in rows:
            ratio = percentile(during, .99) / percentile(quiet, .99) if quiet and during else math.nan
            print(f"{case:<16}{percentile(quiet, .5) * 1000:>9.1f} {percentile(quiet, .99) * 1000:>9.1f} "
                  f"{percentile(during, .5) * 1000:>9.1f} {percentile(during, .99) * 1000:>9.1f} "
                  f"{ratio:>7.2f} {len(during):>5}  {note}")
    results = asyncio.run(create_path(args.rounds, args.creates))
    print(f"\ncreate path of the store, {args.rounds} rounds x {args.creates} creates per kind (ms)")
    print(f"{'kind':<12}{'off p50':>9}{'off p99':>9}{'on p50':>9}{'on p99':>9}{'p50 x':>8}")
    for kind in ("Pod", "Deployment"):
        off, on = results["off"][kind], results["on"][kind]
        print(f"{kind:<12}{percentile(off, .5) * 1000:>8.3f} {percentile(off, .99) * 1000:>8.3f} "
              f"{percentile(on, .5) * 1000:>8.3f} {percentile(on, .99) * 1000:>8.3f} "
              f"{percentile(on, .5) / percentile(off, .5):>7.2f}")


if __name__ == "__main__":
    main()
