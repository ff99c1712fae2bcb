"""What the Node authorizer costs: a kubelet's reads over HTTPS, its graph's memory, its hooks.

Why: every request a node agent makes (reading a pod's secrets, patching pod status) goes
through the Node authorizer, and every pod write through its graph; an idle tenant must not
pay for it (issue 10 asks that the graph cost nothing without pods).

Part 1, over HTTPS against the real apiserver: GET of a Secret by a node credential
(`system:node:n1`, the secret referenced by a pod bound to n1) and a refused GET of an
unrelated one, with `--pods` pods bound across 10 nodes, each referencing 3 secrets and a
ConfigMap. The floor in the same run is the same GET by a user that RBAC allows (a Role on
secrets), and the aiohttp mTLS echo baseline.

Part 2, in process: memory the graph holds per bound pod and per idle cluster (tracemalloc,
only allocations made by the node authorizer's modules), the time of one decision against an
RBAC decision, and of one pod hook update against the store write it rides on.

    .venv/bin/python bench/nodeauth_bench.py                  # about a minute
    .venv/bin/python bench/nodeauth_bench.py --pods 200 --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ssl
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import common

from socialweb_computer import testing
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import attributes, identity, pki
from socialweb_computer.storage import memory

NODES = 10
NODE_MODULES = ("auth/nodegraph.py", "auth/nodeauthorizer.py", "auth/noderestriction.py")


def _pod(i: int) -> dict[str, Any]:
    secrets = [f"s{i}-{j}" for j in range(3)]
    return {"metadata": {"name": f"p{i}"}, "spec": {
        "nodeName": f"n{i % NODES + 1}",
        "containers": [{
            "name": "app", "image": "registry.invalid/app",
            "envFrom": [{"secretRef": {"name": secrets[0]}}, {"configMapRef": {"name": f"c{i}"}}],
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": secrets[1], "key": "k"}}}]}],
        "volumes": [{"name": "s", "secret": {"secretName": secrets[2]}}]}}


def _context(server: testing.ApiServerProcess, directory: Path, user: str,
             groups: tuple[str, ...]) -> ssl.SSLContext:
    pki_dir = server.state_dir / "pki"
    ca = pki.KeyPair.load(str(pki_dir / "client-ca.crt"), str(pki_dir / "client-ca.key"))
    pair = pki.new_client_cert(ca, user, groups, validity=datetime.timedelta(hours=1))
    stem = directory / user.replace(":", "_")
    pair.save(f"{stem}.crt", f"{stem}.key")
    context = ssl.create_default_context(cafile=str(server.ca_file))
    context.load_cert_chain(f"{stem}.crt", f"{stem}.key")
    return context


async def over_https(load: common.Load, pods: int) -> None:
    with (
        tempfile.TemporaryDirectory() as workdir,
        testing.ApiServerProcess.start(Path(workdir) / "state") as server,
    ):
        base = f"{server.url}/api/v1/namespaces/default"
        async with common.client_session(server.ssl_context()) as admin:
            semaphore = asyncio.Semaphore(8)

            async def create(path: str, body: dict[str, Any]) -> None:
                async with semaphore:
                    await common.fetch(admin, "POST", f"{base}/{path}", json=body)

            await create("secrets", {"metadata": {"name": "s0-0"}, "stringData": {"k": "v"}})
            await create("secrets", {"metadata": {"name": "lonely"}, "stringData": {"k": "v"}})
            await asyncio.gather(*(create("pods", _pod(i)) for i in range(pods)))
            rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/default"
            await common.fetch(admin, "POST", f"{server.url}{rbac}/roles", json={
                "metadata": {"name": "reader"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]})
            await common.fetch(admin, "POST", f"{server.url}{rbac}/rolebindings", json={
                "metadata": {"name": "reader"}, "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "User", "name": "reader", "apiGroup": "rbac.authorization.k8s.io"}]})
        node = _context(server, Path(workdir), "system:node:n1", ("system:nodes",))
        reader = _context(server, Path(workdir), "reader", ())
        secret = f"{base}/secrets/s0-0"
        async with common.client_session(node) as as_node, common.client_session(reader) as as_reader:

            async def refused() -> bytes:
                async with as_node.get(f"{base}/secrets/lonely") as response:
                    assert response.status == 403, response.status
                    return await response.read()

            await common.compare({
                "GET secret, RBAC user (floor)": lambda: common.fetch(as_reader, "GET", secret),
                f"GET secret, node, {pods} pods": lambda: common.fetch(as_node, "GET", secret),
                "GET unrelated secret, node (403)": refused,
            }, load)


async def in_process(pods: int) -> None:
    tracemalloc.start()
    idle = [LogicalCluster(f"idle{i}", memory.MemoryBackend()) for i in range(20)]
    for cluster in idle:
        await cluster.start()
    idle_bytes = _node_bytes() / len(idle)
    for cluster in idle:
        await cluster.close()
    del idle

    cluster = LogicalCluster("busy", memory.MemoryBackend())
    await cluster.start()
    kind = cluster.registry.lookup("", "v1", "pods")
    before = _node_bytes()
    write_seconds = 0.0
    for i in range(pods):
        started = time.perf_counter()
        await cluster.store.create(kind, "default", _pod(i), store_mod.WriteOptions())
        write_seconds += time.perf_counter() - started
    per_pod = (_node_bytes() - before) / pods
    tracemalloc.stop()

    graph = cluster.auth.node_graph.graph
    objects = [cluster.store._finish(kind, _pod(i)) for i in range(pods)]
    started = time.perf_counter()
    for obj in objects:
        graph.put_pod({**obj, "spec": {**obj["spec"], "nodeName": "elsewhere"}})
        graph.put_pod(obj)
    hook = (time.perf_counter() - started) / (2 * pods)

    node = identity.UserInfo("system:node:n1", ("system:nodes", identity.AUTHENTICATED))
    reader = identity.UserInfo("reader", (identity.AUTHENTICATED,))
    ask = attributes.Attributes(node, "get", True, resource="secrets", namespace="default", name="s0-0")
    floor = attributes.Attributes(reader, "get", True, resource="secrets", namespace="default", name="s0-0")
    decide, rbac_decide = _timed(cluster.auth.authorize, ask), _timed(cluster.auth.authorize, floor)
    await cluster.close()
    print(f"\nin process, {pods} bound pods on {NODES} nodes (3 secrets and a ConfigMap each):")
    print(f"  node authorizer's memory per idle cluster: {idle_bytes:.0f} B")
    print(f"  graph memory per bound pod:                {per_pod:.0f} B")
    print(f"  one decision: node {decide * 1e6:.2f} us, RBAC (floor, denied) {rbac_decide * 1e6:.2f} us")
    print(f"  one pod hook update {hook * 1e6:.1f} us; a pod create through the store "
          f"{write_seconds / pods * 1e6:.0f} us")


def _node_bytes() -> int:
    snapshot = tracemalloc.take_snapshot()
    return sum(stat.size for stat in snapshot.statistics("filename")
               if any(stat.traceback[0].filename.endswith(m) for m in NODE_MODULES))


def _timed(function: Any, argument: Any, rounds: int = 20000) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        function(argument)
    return (time.perf_counter() - started) / rounds


async def bench(load: common.Load, pods: int) -> None:
    await over_https(load, pods)
    await in_process(pods)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pods", type=int, default=1000)
    known, rest = parser.parse_known_args()
    load = common.parse_load(rest, description=__doc__)
    asyncio.run(bench(load, known.pods))


if __name__ == "__main__":
    main()
