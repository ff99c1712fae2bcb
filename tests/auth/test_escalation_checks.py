"""Escalation prevention: a namespace admin cannot write a Role granting more than they hold,
nor bind a role they could not grant, unless they have `escalate` / `bind`; aggregation
rules need cluster-admin. The refusals are the real server's words."""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer import testing

RBAC = "rbac.authorization.k8s.io"
NS = "escalation"
ROLES = f"/apis/{RBAC}/v1/namespaces/{NS}/roles"
BINDINGS = f"/apis/{RBAC}/v1/namespaces/{NS}/rolebindings"
GROUPS = '["ns-admins" "system:authenticated"]'


@pytest.fixture(scope="module")
def ns_admin(auth_server: testing.ApiServerProcess, kit: Any) -> Any:
    auth_server.kubectl("create", "namespace", NS)
    # Namespace admin through the bootstrap `admin` role (which does not include e.g. nodes).
    auth_server.kubectl(
        "create", "rolebinding", "ns-admins", "-n", NS, "--clusterrole=admin", "--group=ns-admins"
    )
    identity = kit.mint(auth_server, "ns-admin", "dana", ("ns-admins",))
    client = kit.Client(auth_server, identity)
    yield client
    client.close()


def _role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules}


def _binding(name: str, kind: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
        "subjects": [{"kind": "User", "apiGroup": RBAC, "name": "eve"}],
    }


def test_a_role_within_what_the_user_holds_is_allowed(ns_admin: Any) -> None:
    status, body = ns_admin.request(
        "POST",
        ROLES,
        _role(
            "pod-reader", [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]
        ),
    )
    assert status == 201, body
    status, body = ns_admin.request("POST", BINDINGS, _binding("pod-reader", "Role", "pod-reader"))
    assert status == 201, body


def test_granting_more_than_held_is_refused_in_the_real_words(ns_admin: Any) -> None:
    status, body = ns_admin.request(
        "POST",
        ROLES,
        _role(
            "too-much",
            [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                {
                    "apiGroups": ["apps"],
                    "resources": ["deployments"],
                    "verbs": ["escalate"],
                    "resourceNames": ["web"],
                },
            ],
        ),
    )
    assert status == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'roles.{RBAC} "too-much" is forbidden: user "dana" (groups={GROUPS}) is attempting '
        "to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["nodes"], Verbs:["get" "list"]}\n'
        '{APIGroups:["apps"], Resources:["deployments"], ResourceNames:["web"], Verbs:["escalate"]}',
        "reason": "Forbidden",
        "details": {"name": "too-much", "group": RBAC, "kind": "roles"},
        "code": 403,
    }


def test_updates_and_patches_are_checked_on_the_final_object(
    auth_server: testing.ApiServerProcess, kit: Any, ns_admin: Any
) -> None:
    status, role = ns_admin.request(
        "POST", ROLES, _role("grows", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    )
    assert status == 201, role
    role["rules"].append({"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]})
    status, body = ns_admin.request("PUT", f"{ROLES}/grows", role)
    assert status == 403 and '{APIGroups:[""], Resources:["nodes"], Verbs:["list"]}' in body["message"]
    patch = [
        {"op": "add", "path": "/rules/-", "value": {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}}
    ]
    status, body = ns_admin.request(
        "PATCH", f"{ROLES}/grows", patch, {"Content-Type": "application/json-patch+json"}
    )
    assert status == 403 and 'Resources:["*"]' in body["message"]
    # Only metadata a garbage collector owns: never an escalation.
    status, body = ns_admin.request(
        "PATCH",
        f"{ROLES}/grows",
        {"metadata": {"finalizers": ["example.com/hold"]}},
        {"Content-Type": "application/merge-patch+json"},
    )
    assert status == 200, body


def test_escalate_verb_lifts_the_role_check(auth_server: testing.ApiServerProcess, kit: Any) -> None:
    auth_server.kubectl("create", "role", "escalator", "-n", NS, "--verb=escalate,create", "--resource=roles")
    auth_server.kubectl("create", "rolebinding", "escalator", "-n", NS, "--role=escalator", "--user=frank")
    client = kit.Client(auth_server, kit.mint(auth_server, "frank", "frank"))
    try:
        status, body = client.request(
            "POST",
            ROLES,
            _role("node-reader", [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
        )
        assert status == 201, body
    finally:
        client.close()


def test_binding_a_role_you_could_not_grant_needs_bind(
    auth_server: testing.ApiServerProcess, kit: Any, ns_admin: Any
) -> None:
    status, body = ns_admin.request("POST", BINDINGS, _binding("root", "ClusterRole", "cluster-admin"))
    assert status == 403
    assert body["message"] == (
        f'rolebindings.{RBAC} "root" is forbidden: user "dana" (groups={GROUPS}) is attempting to grant RBAC '
        'permissions not currently held:\n{APIGroups:["*"], Resources:["*"], Verbs:["*"]}\n'
        '{NonResourceURLs:["*"], Verbs:["*"]}'
    )
    assert body["details"] == {"name": "root", "group": RBAC, "kind": "rolebindings"}
    # A binding to a role that does not exist: the registry reports the role as not found.
    status, body = ns_admin.request("POST", BINDINGS, _binding("ghost", "Role", "ghost"))
    assert (status, body["message"]) == (404, f'roles.{RBAC} "ghost" not found')
    # `bind` on that one ClusterRole lifts it.
    auth_server.kubectl(
        "create",
        "clusterrole",
        "bind-cluster-admin",
        "--verb=bind",
        "--resource=clusterroles",
        "--resource-name=cluster-admin",
    )
    auth_server.kubectl(
        "create", "rolebinding", "binder", "-n", NS, "--clusterrole=bind-cluster-admin", "--group=ns-admins"
    )
    status, body = ns_admin.request("POST", BINDINGS, _binding("root", "ClusterRole", "cluster-admin"))
    assert status == 201, body


def test_aggregation_rules_need_cluster_admin(auth_server: testing.ApiServerProcess, kit: Any) -> None:
    auth_server.kubectl(
        "create", "clusterrole", "role-writer", "--verb=create,update,get", "--resource=clusterroles"
    )
    auth_server.kubectl(
        "create", "clusterrolebinding", "role-writer", "--clusterrole=role-writer", "--user=gina"
    )
    client = kit.Client(auth_server, kit.mint(auth_server, "gina", "gina"))
    try:
        aggregating = {
            "apiVersion": f"{RBAC}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "gather"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]},
        }
        status, body = client.request("POST", f"/apis/{RBAC}/v1/clusterroles", aggregating)
        assert (status, body["message"]) == (
            403,
            f'clusterroles.{RBAC} "gather" is forbidden: must have '
            "cluster-admin privileges to use the aggregationRule",
        )
    finally:
        client.close()


def test_kubectl_shows_the_escalation_refusal(
    auth_server: testing.ApiServerProcess, kit: Any, ns_admin: Any
) -> None:
    out = kit.kubectl_as(
        auth_server,
        kit.mint(auth_server, "ns-admin-kubectl", "dana", ("ns-admins",)),
        "create",
        "role",
        "secrets-everything",
        "-n",
        NS,
        "--verb=*",
        "--resource=secrets",
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f'Error from server (Forbidden): roles.{RBAC} "secrets-everything" is forbidden: user "dana" '
        f"(groups={GROUPS}) is attempting to grant RBAC permissions not currently held:\n"
        '{APIGroups:[""], Resources:["secrets"], Verbs:["*"]}'
    )
