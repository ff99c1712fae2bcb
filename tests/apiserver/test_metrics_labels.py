"""How a request is labelled in apiserver_request_total: upstream's verbs and scopes, bounded values."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from socialweb_computer.apiserver import metrics, registry

CASES = [
    # method, path, headers, (verb, group, version, resource, subresource, scope), long-running
    ("GET", "/api/v1/namespaces/a/pods", {}, ("LIST", "", "v1", "pods", "", "namespace"), False),
    ("GET", "/api/v1/pods?watch=true", {}, ("WATCH", "", "v1", "pods", "", "cluster"), True),
    ("GET", "/api/v1/namespaces/a/pods/p", {}, ("GET", "", "v1", "pods", "", "resource"), False),
    ("POST", "/api/v1/namespaces/a/configmaps", {}, ("POST", "", "v1", "configmaps", "", "resource"), False),
    ("PUT", "/api/v1/namespaces/a/pods/p/status", {}, ("PUT", "", "v1", "pods", "status", "resource"), False),
    ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", {"Content-Type": "application/apply-patch+yaml"},
     ("APPLY", "apps", "v1", "deployments", "", "resource"), False),
    ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", {"Content-Type": "application/merge-patch+json"},
     ("PATCH", "apps", "v1", "deployments", "", "resource"), False),
    ("DELETE", "/api/v1/namespaces/a/pods", {},
     ("DELETECOLLECTION", "", "v1", "pods", "", "namespace"), False),
    ("DELETE", "/api/v1/nodes/n", {}, ("DELETE", "", "v1", "nodes", "", "resource"), False),
    ("POST", "/api/v1/namespaces/a/pods/p/exec", {}, ("CONNECT", "", "v1", "pods", "exec", "resource"), True),
    ("GET", "/api/v1/namespaces/a/pods/p/log", {}, ("GET", "", "v1", "pods", "log", "resource"), True),
    # Not served: bounded to empty values whatever the client sent.
    ("GET", "/api/v1/made-up-1234", {}, ("LIST", "", "", "", "", ""), False),
    ("GET", "/apis/nope.example/v9/things/x", {}, ("GET", "", "", "", "", ""), False),
    ("GET", "/version", {}, ("GET", "", "", "", "", ""), False),
]


@pytest.mark.parametrize(("method", "path", "headers", "expected", "long_running"), CASES)
def test_labels(method: str, path: str, headers: dict[str, str], expected: tuple[str, ...],
                long_running: bool) -> None:
    info = metrics.describe(make_mocked_request(method, path, headers=headers), registry.Registry())
    verb, dry_run, group, version, resource, subresource, scope, component = info.labels
    assert (verb, group, version, resource, subresource, scope) == expected
    assert component == "apiserver" and dry_run == ""
    assert info.long_running is long_running
    assert info.mutating is (method in ("POST", "PUT", "PATCH", "DELETE"))


def test_dry_run_label() -> None:
    info = metrics.describe(make_mocked_request("POST", "/api/v1/namespaces?dryRun=All"), registry.Registry())
    assert info.labels[1] == "All"


def test_counting_and_gauges() -> None:
    counts = metrics.ApiserverMetrics()
    reg = registry.Registry()
    watch = metrics.describe(make_mocked_request("GET", "/api/v1/pods?watch=1"), reg)
    write = metrics.describe(make_mocked_request("POST", "/api/v1/namespaces"), reg)
    w = counts.begin(watch)
    p = counts.begin(write)
    families = {f.name: f for f in counts.collect({"pods": 3})}
    inflight = {s.labels["request_kind"]: s.value
                for s in families["apiserver_current_inflight_requests"].samples}
    assert inflight == {"readOnly": 0, "mutating": 1}
    (open_watch,) = families["apiserver_longrunning_requests"].samples
    assert open_watch.labels["verb"] == "WATCH" and open_watch.value == 1
    assert "dry_run" not in open_watch.labels
    counts.end(write, p, 201)
    counts.end(watch, w, 200)
    families = {f.name: f for f in counts.collect({"pods": 3})}
    assert families["apiserver_longrunning_requests"].samples == []
    totals = {(s.labels["verb"], s.labels["code"]): s.value for s in families["apiserver_request"].samples}
    assert totals == {("POST", "201"): 1, ("WATCH", "200"): 1}
    buckets = [s for s in families["apiserver_request_duration_seconds"].samples
               if s.name.endswith("_bucket")]
    assert {s.labels["le"] for s in buckets} >= {"0.005", "60.0", "+Inf"}
    assert families["apiserver_storage_objects"].samples[0].value == 3
