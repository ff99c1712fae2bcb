"""Impersonation: each header needs `impersonate` on its own resource, refusals are the real
403s, and the identity a request continues as is the one Kubernetes would build."""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer import testing

WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
RBAC = "rbac.authorization.k8s.io"


@pytest.fixture(scope="module")
def helpdesk(auth_server: testing.ApiServerProcess, kit: Any) -> Any:
    """A user who may impersonate just: user alice, group devs, SA ci/builder, uid u-1, extra scopes=read."""
    auth_server.kubectl("create", "namespace", "ci")
    rules = [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["alice"]},
        {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": ["devs"]},
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["uids"],
            "verbs": ["impersonate"],
            "resourceNames": ["u-1"],
        },
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["userextras/scopes"],
            "verbs": ["impersonate"],
            "resourceNames": ["read"],
        },
    ]
    client = kit.Client(auth_server)
    try:
        for obj, path in (
            ({"metadata": {"name": "helpdesk"}, "rules": rules}, f"/apis/{RBAC}/v1/clusterroles"),
            (
                {
                    "metadata": {"name": "helpdesk"},
                    "subjects": [{"kind": "User", "name": "helpdesk", "apiGroup": RBAC}],
                    "roleRef": {"kind": "ClusterRole", "name": "helpdesk", "apiGroup": RBAC},
                },
                f"/apis/{RBAC}/v1/clusterrolebindings",
            ),
            (
                {
                    "metadata": {"name": "sa", "namespace": "ci"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "resources": ["serviceaccounts"],
                            "verbs": ["impersonate"],
                            "resourceNames": ["builder"],
                        }
                    ],
                },
                f"/apis/{RBAC}/v1/namespaces/ci/roles",
            ),
            (
                {
                    "metadata": {"name": "sa", "namespace": "ci"},
                    "subjects": [{"kind": "User", "name": "helpdesk", "apiGroup": RBAC}],
                    "roleRef": {"kind": "Role", "name": "sa", "apiGroup": RBAC},
                },
                f"/apis/{RBAC}/v1/namespaces/ci/rolebindings",
            ),
        ):
            status, body = client.request("POST", path, obj)
            assert status == 201, body
    finally:
        client.close()
    identity = kit.mint(auth_server, "helpdesk", "helpdesk", ("support",))
    client = kit.Client(auth_server, identity)
    yield client
    client.close()


def _whoami(client: Any, headers: list[tuple[str, str]]) -> tuple[int, Any]:
    status, body = client.request("POST", WHOAMI, REVIEW, headers)
    return status, body["status"]["userInfo"] if status == 201 else body


def test_impersonated_identity_is_built_as_kubernetes_builds_it(helpdesk: Any) -> None:
    assert _whoami(helpdesk, [("Impersonate-User", "alice")]) == (
        201,
        {"username": "alice", "groups": ["system:authenticated"]},
    )
    assert _whoami(
        helpdesk,
        [
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "devs"),
            ("Impersonate-Uid", "u-1"),
            ("Impersonate-Extra-Scopes", "read"),
        ],
    ) == (
        201,
        {
            "username": "alice",
            "uid": "u-1",
            "groups": ["devs", "system:authenticated"],
            "extra": {"scopes": ["read"]},
        },
    )
    assert _whoami(helpdesk, [("Impersonate-User", "system:serviceaccount:ci:builder")]) == (
        201,
        {
            "username": "system:serviceaccount:ci:builder",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:ci", "system:authenticated"],
        },
    )


def test_each_header_is_authorized_on_its_own_resource(helpdesk: Any) -> None:
    refusals = [
        (
            [("Impersonate-User", "bob")],
            'users "bob" is forbidden: User "helpdesk" cannot impersonate resource "users" in API group "" '
            "at the cluster scope",
        ),
        (
            [("Impersonate-User", "alice"), ("Impersonate-Group", "system:masters")],
            'groups "system:masters" is forbidden: User "helpdesk" cannot impersonate resource "groups" in '
            'API group "" '
            "at the cluster scope",
        ),
        (
            [("Impersonate-User", "system:serviceaccount:ci:deployer")],
            'serviceaccounts "deployer" is forbidden: User "helpdesk" cannot impersonate resource '
            '"serviceaccounts" '
            'in API group "" in the namespace "ci"',
        ),
        (
            [("Impersonate-User", "alice"), ("Impersonate-Uid", "u-2")],
            'uids.authentication.k8s.io "u-2" is forbidden: User "helpdesk" cannot impersonate resource '
            '"uids" '
            'in API group "authentication.k8s.io" at the cluster scope',
        ),
        (
            [("Impersonate-User", "alice"), ("Impersonate-Extra-Scopes", "write")],
            'userextras.authentication.k8s.io "write" is forbidden: User "helpdesk" cannot impersonate '
            "resource "
            '"userextras/scopes" in API group "authentication.k8s.io" at the cluster scope',
        ),
    ]
    for headers, message in refusals:
        status, body = helpdesk.request("GET", "/api/v1/namespaces/ci/pods", headers=headers)
        assert (status, body["message"]) == (403, message), headers


def test_groups_without_a_user_is_a_bad_request(helpdesk: Any) -> None:
    status, body = helpdesk.request("GET", "/api", headers=[("Impersonate-Group", "devs")])
    assert (status, body["reason"], body["message"]) == (
        400,
        "BadRequest",
        "requested [{Group  devs    }] without impersonating a user",
    )


def test_the_request_runs_as_the_impersonated_user(helpdesk: Any) -> None:
    status, body = helpdesk.request(
        "GET", "/api/v1/namespaces/ci/pods", headers=[("Impersonate-User", "alice")]
    )
    assert (status, body["message"]) == (
        403,
        'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "ci"',
    )


def test_kubectl_as_sends_the_headers_on_every_request(
    auth_server: testing.ApiServerProcess, kit: Any, helpdesk: Any
) -> None:
    identity = kit.mint(auth_server, "helpdesk-kubectl", "helpdesk", ("support",))
    out = kit.kubectl_as(
        auth_server,
        identity,
        "auth",
        "whoami",
        "--as=alice",
        "--as-group=devs",
        "-o",
        "jsonpath={.status.userInfo.username} {.status.userInfo.groups}",
    )
    assert out.stdout == 'alice ["devs","system:authenticated"]'
    # Discovery is refused first; kubectl then prints what it prints against a real server.
    refused = kit.kubectl_as(auth_server, identity, "get", "pods", "-n", "ci", "--as=bob")
    assert refused.stderr.strip().endswith("Error from server (Forbidden): unknown")
    raw = kit.kubectl_as(auth_server, identity, "get", "--raw", "/api/v1/namespaces/ci/pods", "--as=bob")
    assert raw.stderr.strip() == (
        'Error from server (Forbidden): users "bob" is forbidden: User "helpdesk" cannot impersonate '
        "resource "
        '"users" in API group "" at the cluster scope'
    )
