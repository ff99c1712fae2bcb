"""A bounded fuzz run against the published OpenAPI: objects drawn from each kind's own schema,
mostly well shaped, with a share of wrong types, extreme numbers, odd strings and nulls, POSTed
and patched onto a real server. Whatever comes back must be a success or a 4xx Status: never a
500, never a traceback in the server's log, and the server answers throughout.

Slow (about two minutes): `pytest -m slow tests/apiserver/test_fuzz.py`. `FUZZ_SECONDS` bounds it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from socialweb_computer import testing
from socialweb_computer.testing import probe

pytestmark = pytest.mark.slow

BUDGET = float(os.environ.get("FUZZ_SECONDS", "120"))
# (group-version document, collection path, schema) for a spread of built-in kinds.
KINDS = [
    ("api/v1", "/api/v1/namespaces/{ns}/configmaps", "io.k8s.api.core.v1.ConfigMap"),
    ("api/v1", "/api/v1/namespaces/{ns}/secrets", "io.k8s.api.core.v1.Secret"),
    ("api/v1", "/api/v1/namespaces/{ns}/pods", "io.k8s.api.core.v1.Pod"),
    ("api/v1", "/api/v1/namespaces/{ns}/services", "io.k8s.api.core.v1.Service"),
    ("apis/apps/v1", "/apis/apps/v1/namespaces/{ns}/deployments", "io.k8s.api.apps.v1.Deployment"),
    ("apis/apps/v1", "/apis/apps/v1/namespaces/{ns}/statefulsets", "io.k8s.api.apps.v1.StatefulSet"),
    ("apis/batch/v1", "/apis/batch/v1/namespaces/{ns}/jobs", "io.k8s.api.batch.v1.Job"),
    ("apis/batch/v1", "/apis/batch/v1/namespaces/{ns}/cronjobs", "io.k8s.api.batch.v1.CronJob"),
    ("apis/rbac.authorization.k8s.io/v1", "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
     "io.k8s.api.rbac.v1.RoleBinding"),
    ("apis/policy/v1", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
     "io.k8s.api.policy.v1.PodDisruptionBudget"),
]
WRONG = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=8), st.booleans(),
                  st.none(), st.lists(st.integers(), max_size=2), st.floats(allow_nan=False),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def strategy(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for `schema`, right-typed nine times in ten."""
    ref = schema.get("$ref") or (schema.get("allOf") or [{}])[0].get("$ref")
    if ref:
        return st.deferred(lambda: strategy(components[ref.rsplit("/", 1)[1]], components, depth + 1))
    types = schema.get("type") or ("object" if schema.get("properties") else "")
    if depth > 6:
        return st.one_of(st.none(), st.just({}))
    if "oneOf" in schema or not types:
        right: st.SearchStrategy[Any] = st.one_of(st.text(max_size=6), st.integers(-5, 500))
    elif types == "object" and schema.get("properties"):
        props = schema["properties"]
        right = st.fixed_dictionaries({}, optional={k: strategy(v, components, depth + 1)
                                                    for k, v in list(props.items())[:25]})
    elif types == "object":
        extra = schema.get("additionalProperties")
        values = strategy(extra, components, depth + 1) if isinstance(extra, dict) else st.text(max_size=5)
        right = st.dictionaries(st.text(max_size=10), values, max_size=3)
    elif types == "array":
        right = st.lists(strategy(schema.get("items") or {}, components, depth + 1), max_size=3)
    elif types == "integer":
        right = st.one_of(st.integers(-3, 70_000), st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**63) - 1]))
    elif types == "number":
        right = st.floats(allow_nan=False, allow_infinity=False)
    elif types == "boolean":
        right = st.booleans()
    else:
        odd = ["", "0", "1Gi", "100m", "x" * 300, "TCP", "*/5 * * * *", "2026-01-01T00:00:00Z", "\u0000"]
        right = st.one_of(st.text(max_size=12), st.sampled_from(odd))
    return st.one_of(*([right] * 9), WRONG)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = testing.ApiServerProcess.start(tmp_path_factory.mktemp("fuzz") / "state")
    client = probe.Client.from_kubeconfig(server.kubeconfig)
    assert client.request("POST", "/api/v1/namespaces", {"metadata": {"name": "fuzz"}})[0] == 201
    documents = {}
    for gv, _, _ in KINDS:
        code, index, _ = client.request("GET", "/openapi/v3")
        assert code == 200
        code, documents[gv], _ = client.request("GET", index["paths"][gv]["serverRelativeURL"])
        assert code == 200
    yield server, client, documents, time.monotonic() + BUDGET
    logs = server.logs(200_000)
    died = server.returncode
    server.stop()
    assert died is None, logs
    assert "Traceback" not in logs and "unhandled error" not in logs, logs


@pytest.mark.parametrize(("gv", "path", "schema"), KINDS, ids=[k[2].rsplit(".", 1)[1] for k in KINDS])
def test_no_500_from_objects_drawn_from_the_schema(fuzzed: Any, gv: str, path: str, schema: str) -> None:
    server, client, documents, deadline = fuzzed
    components = documents[gv]["components"]["schemas"]
    objects = strategy(components[schema], components)
    collection = path.format(ns="fuzz")

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=objects, name=st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z"),
           patch=st.dictionaries(st.sampled_from(["spec", "data", "metadata", "status", "x"]),
                                 strategy(components[schema], components), max_size=2))
    def once(body: Any, name: str, patch: Any) -> None:
        if time.monotonic() > deadline:
            return
        if isinstance(body, dict):
            meta = body.get("metadata")
            body["metadata"] = {**(meta if isinstance(meta, dict) else {}), "name": name}
        for method, where, sent, kind in (
                ("POST", collection, body, "application/json"),
                ("PATCH", f"{collection}/{name}", patch, "application/merge-patch+json"),
                ("PATCH", f"{collection}/{name}", patch, "application/strategic-merge-patch+json"),
                ("GET", f"{collection}?limit=5", None, "application/json")):
            data = json.dumps(sent) if sent is not None else None
            code, answer, _ = client.request(method, where, data, kind)
            assert code < 500, (method, where, sent, answer)
            if code >= 400:
                assert isinstance(answer, dict) and answer.get("kind") == "Status", answer

    once()
    # The server answered throughout, tables included.
    assert client.request("GET", "/readyz")[0] == 200
    tables = server.kubectl("get", "pods,deployments,jobs,cronjobs,services,configmaps", "-n", "fuzz",
                            check=False)
    assert tables.returncode == 0, tables.stderr
