"""Every failure is a `Status` with the right code and reason — never a traceback — and the
server stays up afterwards. Driven over raw HTTPS so the exact bytes are visible."""

from __future__ import annotations

import http.client
import json

import pytest

from socialweb_computer import testing


def _request(
    server: testing.ApiServerProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.ssl_context(), timeout=10
    )
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return response.status, json.loads(data) if data else {}


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "code", "reason"),
    [
        ("GET", "/api/v1/nothings", None, {}, 404, "NotFound"),
        ("GET", "/apis/example.com/v1/widgets", None, {}, 404, "NotFound"),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b"{not json",
            {"Content-Type": "application/json"},
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b"a: [b",
            {"Content-Type": "application/yaml"},
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b"<xml/>",
            {"Content-Type": "application/xml"},
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/x",
            b"{}",
            {"Content-Type": "text/plain"},
            415,
            "UnsupportedMediaType",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b'{"metadata":{"name":"big"},"data":{"a":"' + b"x" * (3 * 1024 * 1024) + b'"}}',
            {"Content-Type": "application/json"},
            413,
            "RequestEntityTooLarge",
        ),
        ("GET", "/api/v1/namespaces/default/configmaps?limit=x", None, {}, 400, "BadRequest"),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(",
            None,
            {},
            400,
            "BadRequest",
        ),
        ("GET", "/api/v1/namespaces/default/configmaps?continue=garbage", None, {}, 400, "BadRequest"),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps?fieldValidation=Bogus",
            b'{"metadata":{"name":"v"}}',
            {"Content-Type": "application/json"},
            422,
            "Invalid",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps?dryRun=Maybe",
            b'{"metadata":{"name":"v"}}',
            {"Content-Type": "application/json"},
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b'{"metadata":{"name":"v","resourceVersion":"5"}}',
            {"Content-Type": "application/json"},
            400,
            "BadRequest",
        ),
        (
            "PUT",
            "/api/v1/namespaces/default/configmaps/absent",
            b'{"metadata":{"name":"absent"}}',
            {"Content-Type": "application/json"},
            404,
            "NotFound",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods",
            b'{"metadata":{"name":"p"},"spec":{}}',
            {"Content-Type": "application/json"},
            422,
            "Invalid",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/configmaps",
            b"k8s\x00\x01\x02",
            {"Content-Type": "application/vnd.kubernetes.protobuf"},
            400,
            "BadRequest",
        ),
    ],
)
def test_failures_are_status_objects(
    shared_apiserver: testing.ApiServerProcess,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    code: int,
    reason: str,
) -> None:
    status, payload = _request(shared_apiserver, method, path, body, headers)
    assert status == code, payload
    assert payload["kind"] == "Status" and payload["status"] == "Failure"
    assert payload["code"] == code and payload["reason"] == reason
    assert "Traceback" not in payload["message"]
    assert _request(shared_apiserver, "GET", "/version")[0] == 200  # still serving


def test_unknown_resource_message_matches_kube(shared_apiserver: testing.ApiServerProcess) -> None:
    _, payload = _request(shared_apiserver, "GET", "/api/v1/nothings")
    assert payload["message"] == "the server could not find the requested resource"


def test_conflict_on_stale_resource_version(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    headers = {"Content-Type": "application/json"}
    status, created = _request(
        shared_apiserver,
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        json.dumps({"metadata": {"name": "c"}, "data": {"a": "1"}}).encode(),
        headers,
    )
    assert status == 201
    stale = dict(created, data={"a": "2"})
    assert (
        _request(
            shared_apiserver,
            "PUT",
            f"/api/v1/namespaces/{namespace}/configmaps/c",
            json.dumps(stale).encode(),
            headers,
        )[0]
        == 200
    )
    status, payload = _request(
        shared_apiserver,
        "PUT",
        f"/api/v1/namespaces/{namespace}/configmaps/c",
        json.dumps(stale).encode(),
        headers,
    )
    assert status == 409 and payload["reason"] == "Conflict"
    assert payload["message"] == (
        'Operation cannot be fulfilled on configmaps "c": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


def test_finalizers_hold_deletion(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    headers = {"Content-Type": "application/json"}
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    body = {"metadata": {"name": "f", "finalizers": ["example.com/hold"]}}
    assert _request(shared_apiserver, "POST", path, json.dumps(body).encode(), headers)[0] == 201
    status, deleting = _request(shared_apiserver, "DELETE", f"{path}/f")
    assert status == 200 and deleting["metadata"]["deletionTimestamp"]
    status, still = _request(shared_apiserver, "GET", f"{path}/f")
    assert status == 200 and still["metadata"]["finalizers"] == ["example.com/hold"]
    patch = json.dumps({"metadata": {"finalizers": None}}).encode()
    assert (
        _request(
            shared_apiserver, "PATCH", f"{path}/f", patch, {"Content-Type": "application/merge-patch+json"}
        )[0]
        == 200
    )
    assert _request(shared_apiserver, "GET", f"{path}/f")[0] == 404


def test_delete_preconditions(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    headers = {"Content-Type": "application/json"}
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    _request(shared_apiserver, "POST", path, json.dumps({"metadata": {"name": "p"}}).encode(), headers)
    options = json.dumps({"preconditions": {"uid": "not-the-uid"}}).encode()
    status, payload = _request(shared_apiserver, "DELETE", f"{path}/p", options, headers)
    assert status == 409 and "Precondition failed: UID in precondition: not-the-uid" in payload["message"]


def test_anonymous_may_only_read_public_info(shared_apiserver: testing.ApiServerProcess) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(shared_apiserver.ca_file))
    connection = http.client.HTTPSConnection("127.0.0.1", shared_apiserver.port, context=context, timeout=10)
    connection.request("GET", "/version")
    assert connection.getresponse().status == 200
    connection.close()
    connection = http.client.HTTPSConnection("127.0.0.1", shared_apiserver.port, context=context, timeout=10)
    connection.request("GET", "/api/v1/namespaces")
    response = connection.getresponse()
    payload = json.loads(response.read())
    connection.close()
    assert response.status in (401, 403) and payload["kind"] == "Status"


def test_binding_assigns_a_pod_once(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    headers = {"Content-Type": "application/json"}
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("a", "b"):
        pod = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        assert _request(shared_apiserver, "POST", pods, json.dumps(pod).encode(), headers)[0] == 201
    binding = {"metadata": {"name": "a"}, "target": {"kind": "Node", "name": "node-1"}}
    assert (
        _request(shared_apiserver, "POST", f"{pods}/a/binding", json.dumps(binding).encode(), headers)[0]
        == 201
    )
    status, payload = _request(
        shared_apiserver, "POST", f"{pods}/a/binding", json.dumps(binding).encode(), headers
    )
    assert status == 409 and 'is already assigned to node "node-1"' in payload["message"]
    binding["metadata"]["name"] = "b"
    bindings = f"/api/v1/namespaces/{namespace}/bindings"
    assert _request(shared_apiserver, "POST", bindings, json.dumps(binding).encode(), headers)[0] == 201
    _, pod_b = _request(shared_apiserver, "GET", f"{pods}/b")
    assert pod_b["spec"]["nodeName"] == "node-1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= pod_b["status"]["conditions"][0].items()
