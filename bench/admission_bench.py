"""What the admission chain costs on the create path, beside floors measured in the same run.

Why: every create of a tenant cluster passes NamespaceLifecycle, LimitRanger, ServiceAccount,
PodSecurity, Priority and ResourceQuota (docs/admission.md). The figure that matters is what
they add to a create, on the store the gateway runs (SQLite, with fsync), so that a change to a
plugin shows up as a ratio, not as a raw number on a noisy machine.

Two tables, same run:

1. In process, one `LogicalCluster` on SQLite, creates through `Store.create` (the code every
   HTTP create runs after decoding, authorization excluded). The floor is the **bare store
   put**: the backend's own create of the same encoded Pod, nothing of ours above it. Beside
   it: the Pod create with admission off (`store.admission = None`: the API engine alone), with
   the chain in a plain namespace (its fixed cost: ServiceAccount injects the token volume,
   PodSecurity reads the namespace, ResourceQuota finds no quota), and with the chain in a
   guarded namespace (a LimitRange with defaults, a ResourceQuota on pods/cpu/memory that every
   create is charged to by a compare-and-swap of its status, and `enforce=restricted`).
   ConfigMaps the same way, against a `configmaps` count quota.
2. Over HTTPS against the real `socialweb-computer apiserver`: the same creates (Pod plain and
   guarded, ConfigMap plain and under quota), beside the mTLS echo baseline of common.py.

    .venv/bin/python bench/admission_bench.py                   # about a minute
    .venv/bin/python bench/admission_bench.py --requests 300    # quick

Nothing is asserted; tests/bench runs it with the smallest settings so it keeps working.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import common
import orjson

from socialweb_computer import testing
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.storage import sqlite

PLAIN, GUARDED = "bench-plain", "bench-guarded"
_JSON = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "admission-bench"}

# A pod that passes `restricted`, sets no resources (LimitRanger fills them in) and names no
# ServiceAccount (admission picks `default` and mounts its token volume). No scheduler serves
# its schedulerName, so the scheduler's writes stay out of the figures.
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"labels": {"app": "bench"}},
    "spec": {
        "schedulerName": "bench-unscheduled",
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "job",
            "image": "registry.example/ci/job:1",
            "command": ["sh", "-c", "make test"],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }],
    },
}
CONFIGMAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {},
    "data": {"settings": "log_level: info\nworkers: 4\n" + "x" * 300},
}
LIMIT_RANGE = {
    "apiVersion": "v1",
    "kind": "LimitRange",
    "metadata": {"name": "defaults"},
    "spec": {"limits": [{
        "type": "Container",
        "default": {"cpu": "500m", "memory": "256Mi"},
        "defaultRequest": {"cpu": "100m", "memory": "64Mi"},
        "max": {"cpu": "4", "memory": "8Gi"},
    }]},
}
QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "compute"},
    "spec": {"hard": {"pods": "1000000", "configmaps": "1000000", "requests.cpu": "1000000",
                      "requests.memory": "100000Ti", "limits.cpu": "1000000", "limits.memory": "100000Ti"}},
}


def _named(template: dict[str, Any], prefix: str, counter: itertools.count[int]) -> dict[str, Any]:
    obj = copy.deepcopy(template)
    obj["metadata"]["name"] = f"{prefix}-{next(counter)}"
    return obj


def _namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


GUARD_LABELS = {"pod-security.kubernetes.io/enforce": "restricted"}


# ------------------------------------------------------------------ in process


async def in_process(load: common.Load) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        backend = await sqlite.SqliteBackend.open(str(Path(tmp) / "bench.db"), compact_interval=0)
        cluster = LogicalCluster("bench", backend)
        await cluster.start()
        try:
            await _in_process_cases(cluster, backend, load)
        finally:
            await cluster.close()
            await backend.close()


async def _in_process_cases(
    cluster: LogicalCluster, backend: sqlite.SqliteBackend, load: common.Load
) -> None:
    store = cluster.store
    kind = {plural: cluster.registry.lookup("", "v1", plural)
            for plural in ("namespaces", "pods", "configmaps", "limitranges", "resourcequotas",
                           "serviceaccounts")}
    options = store_mod.WriteOptions()
    await store.create(kind["namespaces"], "", _namespace(PLAIN), options)
    await store.create(kind["namespaces"], "", _namespace(GUARDED, GUARD_LABELS), options)
    for namespace in (PLAIN, GUARDED):
        # The ServiceAccount controller creates `default` soon after the namespace; do not race it.
        await _until(lambda ns=namespace: store.get(kind["serviceaccounts"], ns, "default"))
    await store.create(kind["limitranges"], GUARDED, copy.deepcopy(LIMIT_RANGE), options)
    await store.create(kind["resourcequotas"], GUARDED, copy.deepcopy(QUOTA), options)
    await _until(lambda: _quota_has_status(store, kind["resourcequotas"]))
    chain = store.admission
    counter = itertools.count()

    # The floor: the encoded pod exactly as the admitted create stores it, put by the backend alone.
    sample = (await store.create(kind["pods"], GUARDED, _named(POD, "sample", counter), options)).object
    stored = store_mod.encode_for_storage(kind["pods"], sample)

    async def bare_put() -> None:
        await backend.create(f"/bench-floor/pods/{next(counter)}", stored)

    def create(plural: str, namespace: str, template: dict[str, Any], admission: bool) -> Callable[
            [], Awaitable[object]]:
        async def call() -> object:
            store.admission = chain if admission else None
            try:
                return await store.create(kind[plural], namespace, _named(template, "b", counter), options)
            finally:
                store.admission = chain

        return call

    floor = await common.measure("bare store put (SQLite create of the pod)", bare_put, load)
    cases = {
        "create pod, admission off": create("pods", PLAIN, POD, False),
        "create pod, chain, plain namespace": create("pods", PLAIN, POD, True),
        "create pod, chain, LimitRange+quota+restricted": create("pods", GUARDED, POD, True),
        "create configmap, admission off": create("configmaps", PLAIN, CONFIGMAP, False),
        "create configmap, chain, plain namespace": create("configmaps", PLAIN, CONFIGMAP, True),
        "create configmap, chain, count quota": create("configmaps", GUARDED, CONFIGMAP, True),
    }
    results = [await common.measure(name, call, load) for name, call in cases.items()]
    print(f"\nin process, SQLite, Store.create; {load.describe()}")
    print(common.format_table(results, floor))
    used = (await store.get(kind["resourcequotas"], GUARDED, "compute"))["status"]["used"]
    print(f"  quota {GUARDED}/compute used after the run: pods={used.get('pods')}, "
          f"configmaps={used.get('configmaps')}, requests.cpu={used.get('requests.cpu')}")


async def _quota_has_status(store: store_mod.Store, kind: Any) -> bool:
    return bool((await store.get(kind, GUARDED, "compute")).get("status", {}).get("used"))


async def _until(predicate: Callable[[], Awaitable[object]], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await predicate():
                return
        except Exception:  # not there yet
            if loop.time() > deadline:
                raise
        if loop.time() > deadline:
            raise TimeoutError("bench setup: the cluster's controllers did not catch up")
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------ over HTTPS


async def over_https(load: common.Load) -> None:
    with tempfile.TemporaryDirectory() as state, testing.ApiServerProcess.start(state) as server:
        for namespace in (_namespace(PLAIN), _namespace(GUARDED, GUARD_LABELS)):
            server.kubectl("apply", "-f", "-", input=json.dumps(namespace))
        for namespace in (PLAIN, GUARDED):
            await _until(lambda ns=namespace: asyncio.to_thread(lambda: server.kubectl(
                "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0))
        for obj in (LIMIT_RANGE, QUOTA):
            server.kubectl("apply", "-n", GUARDED, "-f", "-", input=json.dumps(obj))
        counter = itertools.count()
        async with common.client_session(server.ssl_context()) as session:
            def post(plural: str, namespace: str, template: dict[str, Any]) -> Callable[[], Awaitable[bytes]]:
                url = f"{server.url}/api/v1/namespaces/{namespace}/{plural}"

                def call() -> Awaitable[bytes]:
                    body = orjson.dumps(_named(template, "h", counter))
                    return common.fetch(session, "POST", url, data=body, headers=_JSON)

                return call

            await common.compare({
                "POST pod, plain namespace": post("pods", PLAIN, POD),
                "POST pod, LimitRange+quota+restricted": post("pods", GUARDED, POD),
                "POST configmap, plain namespace": post("configmaps", PLAIN, CONFIGMAP),
                "POST configmap, count quota": post("configmaps", GUARDED, CONFIGMAP),
            }, load)


async def bench(load: common.Load) -> None:
    await in_process(load)
    await over_https(load)


if __name__ == "__main__":
    common.main(bench, description=__doc__.splitlines()[0])
