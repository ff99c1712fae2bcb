"""The API engine through the official `kubernetes` Python client: typed CRUD, list
paging, watch resumed from a resourceVersion, and 410 Gone after compaction."""

from __future__ import annotations

import http.client
import json
import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from socialweb_computer import testing


def _cm(name: str, value: str = "1", labels: dict[str, str] | None = None) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data={"v": value})


def test_typed_crud_and_errors(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    core = client.CoreV1Api(shared_apiserver.python_client())
    created = core.create_namespaced_config_map(namespace, _cm("a"))
    assert created.metadata.uid and created.metadata.resource_version
    got = core.read_namespaced_config_map("a", namespace)
    assert got.data == {"v": "1"}
    got.data["v"] = "2"
    updated = core.replace_namespaced_config_map("a", namespace, got)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("a", namespace, got)  # resourceVersion is now stale
    assert stale.value.status == 409
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map(namespace, _cm("a"))
    assert exists.value.status == 409 and '"reason":"AlreadyExists"' in exists.value.body.replace(" ", "")
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", namespace)
    assert missing.value.status == 404
    core.patch_namespaced_config_map("a", namespace, {"metadata": {"labels": {"x": "y"}}})
    assert core.read_namespaced_config_map("a", namespace).metadata.labels == {"x": "y"}
    status = core.delete_namespaced_config_map("a", namespace)
    assert status is not None
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("a", namespace)


def test_generate_name_dry_run_and_selectors(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    core = client.CoreV1Api(shared_apiserver.python_client())
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(generate_name="gen-", labels={"app": "x"}))
    made = core.create_namespaced_config_map(namespace, body)
    assert made.metadata.name.startswith("gen-") and len(made.metadata.name) == len("gen-") + 5
    dry = core.create_namespaced_config_map(namespace, _cm("dry"), dry_run="All")
    assert dry.metadata.name == "dry"
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("dry", namespace)
    core.create_namespaced_config_map(namespace, _cm("other", labels={"app": "y"}))
    names = {
        c.metadata.name for c in core.list_namespaced_config_map(namespace, label_selector="app in (x)").items
    }
    assert names == {made.metadata.name}
    by_field = core.list_namespaced_config_map(namespace, field_selector="metadata.name=other").items
    assert [c.metadata.name for c in by_field] == ["other"]
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_config_map(namespace, field_selector="data.v=1")
    assert bad.value.status == 400


def test_paging_is_consistent(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    core = client.CoreV1Api(shared_apiserver.python_client())
    for i in range(12):
        core.create_namespaced_config_map(namespace, _cm(f"p{i:02d}"))
    first = core.list_namespaced_config_map(namespace, limit=5)
    assert len(first.items) == 5 and first.metadata._continue
    core.create_namespaced_config_map(namespace, _cm("p99"))  # after the snapshot: not in this list
    seen = [c.metadata.name for c in first.items]
    token = first.metadata._continue
    while token:
        page = core.list_namespaced_config_map(namespace, limit=5, _continue=token)
        seen += [c.metadata.name for c in page.items]
        token = page.metadata._continue
    seen = [name for name in seen if name != "kube-root-ca.crt"]  # in every namespace, as upstream
    assert seen == [f"p{i:02d}" for i in range(12)]


def test_watch_resumes_from_resource_version(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    core = client.CoreV1Api(shared_apiserver.python_client())
    listed = core.list_namespaced_config_map(namespace)
    start = listed.metadata.resource_version
    core.create_namespaced_config_map(namespace, _cm("w1"))
    core.patch_namespaced_config_map("w1", namespace, {"data": {"v": "2"}})
    core.delete_namespaced_config_map("w1", namespace)
    events = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_config_map, namespace, resource_version=start, timeout_seconds=3
    ):
        events.append(
            (event["type"], event["object"].metadata.name, event["object"].metadata.resource_version)
        )
        if len(events) == 3:
            w.stop()
    assert [e[:2] for e in events] == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    revisions = [int(e[2]) for e in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == 3
    # Resuming from the middle gives exactly the rest: no gap, no duplicate.
    rest = []
    for event in watch.Watch().stream(
        core.list_namespaced_config_map, namespace, resource_version=events[0][2], timeout_seconds=2
    ):
        rest.append(event["type"])
        if len(rest) == 2:
            break
    assert rest == ["MODIFIED", "DELETED"]


def test_watch_gets_410_after_compaction(tmp_path) -> None:
    server = testing.ApiServerProcess.start(
        tmp_path / "state", extra_args=["--history-limit", "5", "--compact-interval", "0.2"]
    )
    try:
        core = client.CoreV1Api(server.python_client())
        start = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(30):
            core.create_namespaced_config_map("default", _cm(f"c{i}"))
        done = threading.Event()
        threading.Timer(1.0, done.set).start()
        done.wait()
        connection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=server.ssl_context(), timeout=10
        )
        connection.request("GET", f"/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={start}")
        response = connection.getresponse()
        event = json.loads(response.readline())
        connection.close()
        assert response.status == 200 and event["type"] == "ERROR"
        assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
        with pytest.raises(ApiException) as gone:
            core.list_namespaced_config_map("default", resource_version=start, resource_version_match="Exact")
        assert gone.value.status == 410
    finally:
        server.stop()


def test_restart_keeps_objects_and_survives_kill(tmp_path) -> None:
    state = tmp_path / "state"
    server = testing.ApiServerProcess.start(state)
    core = client.CoreV1Api(server.python_client())
    core.create_namespaced_config_map("default", _cm("durable"))
    server.kill()
    server.wait(10)
    again = testing.ApiServerProcess.start(state, port=server.port)
    try:
        assert client.CoreV1Api(again.python_client()).read_namespaced_config_map(
            "durable", "default"
        ).data == {"v": "1"}
    finally:
        again.stop()
