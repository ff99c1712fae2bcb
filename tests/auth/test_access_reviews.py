"""Access reviews answer what the authorizer decides, in the real server's shapes:
SelfSubjectAccessReview (kubectl auth can-i), SelfSubjectRulesReview (can-i --list),
SelfSubjectReview (whoami), SubjectAccessReview and LocalSubjectAccessReview."""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer import testing

RBAC = "rbac.authorization.k8s.io"
AUTHZ = "/apis/authorization.k8s.io/v1"
NS = "reviews"


@pytest.fixture(scope="module")
def reviewer(auth_server: testing.ApiServerProcess, kit: Any) -> Any:
    auth_server.kubectl("create", "namespace", NS)
    auth_server.kubectl("create", "clusterrole", "cm-reader", "--verb=get,list", "--resource=configmaps")
    auth_server.kubectl(
        "create", "rolebinding", "cm-readers", "-n", NS, "--clusterrole=cm-reader", "--group=readers"
    )
    auth_server.kubectl(
        "create", "rolebinding", "broken", "-n", NS, "--clusterrole=no-such-role", "--user=rita"
    )
    client = kit.Client(auth_server, kit.mint(auth_server, "rita", "rita", ("readers",)))
    yield client
    client.close()


def _ssar(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": spec}


def test_ssar_allowed_names_the_binding(reviewer: Any) -> None:
    spec = {"resourceAttributes": {"namespace": NS, "verb": "list", "resource": "configmaps"}}
    status, body = reviewer.request("POST", f"{AUTHZ}/selfsubjectaccessreviews", _ssar(spec))
    assert status == 201
    assert body == {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {
            "allowed": True,
            "reason": f'RBAC: allowed by RoleBinding "cm-readers/{NS}" of ClusterRole '
            '"cm-reader" to Group "readers"',
        },
    }


def test_ssar_denied_carries_resolution_errors(reviewer: Any, admin: Any) -> None:
    spec = {"resourceAttributes": {"namespace": NS, "verb": "delete", "resource": "configmaps"}}
    status, body = reviewer.request("POST", f"{AUTHZ}/selfsubjectaccessreviews", _ssar(spec))
    assert (status, body["status"]) == (
        201,
        {"allowed": False, "reason": f'RBAC: clusterrole.{RBAC} "no-such-role" not found'},
    )
    status, body = admin.request("POST", f"{AUTHZ}/selfsubjectaccessreviews", _ssar(spec))
    assert (status, body["status"]) == (201, {"allowed": True})


def test_ssar_needs_exactly_one_kind_of_attributes(reviewer: Any) -> None:
    status, body = reviewer.request("POST", f"{AUTHZ}/selfsubjectaccessreviews", _ssar({}))
    assert status == 422
    assert body["message"] == (
        'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec: Invalid value: "null": exactly '
        "one of "
        "nonResourceAttributes or resourceAttributes must be specified"
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec",
            "message": 'Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes '
            "must be specified",
        }
    ]


def test_ssrr_lists_the_rules_that_apply(reviewer: Any) -> None:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": NS},
    }
    status, body = reviewer.request("POST", f"{AUTHZ}/selfsubjectrulesreviews", review)
    assert status == 201
    assert body["spec"] == {}
    status_ = body["status"]
    assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["configmaps"]} in status_[
        "resourceRules"
    ]
    assert {
        "verbs": ["create"],
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["selfsubjectreviews"],
    } in status_["resourceRules"]
    assert {
        "verbs": ["get"],
        "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
    } in status_["nonResourceRules"]
    assert status_["incomplete"] is False
    assert status_["evaluationError"] == f'clusterrole.{RBAC} "no-such-role" not found'
    status, body = reviewer.request("POST", f"{AUTHZ}/selfsubjectrulesreviews", {**review, "spec": {}})
    assert (status, body["message"]) == (400, "no namespace on request")


def test_kubectl_can_i_list_prints_the_table(
    auth_server: testing.ApiServerProcess, kit: Any, reviewer: Any
) -> None:
    rita = kit.mint(auth_server, "rita-kubectl", "rita", ("readers",))
    out = kit.kubectl_as(auth_server, rita, "auth", "can-i", "--list", "-n", NS)
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    assert lines[0] == "Resources Non-Resource URLs Resource Names Verbs"
    assert "configmaps [] [] [get list]" in lines
    assert "selfsubjectaccessreviews.authorization.k8s.io [] [] [create]" in lines
    assert "[/api] [] [get]" in lines


def test_subject_access_review_is_for_privileged_callers(reviewer: Any, admin: Any) -> None:
    sar = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "someone",
            "groups": ["readers"],
            "resourceAttributes": {"namespace": NS, "verb": "get", "resource": "configmaps"},
        },
    }
    status, body = admin.request("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert (status, body["status"]["allowed"]) == (201, True)
    # Groups are taken as given: no system:authenticated is added to a SubjectAccessReview's user.
    status, body = admin.request(
        "POST",
        f"{AUTHZ}/subjectaccessreviews",
        {**sar, "spec": {"user": "someone", "nonResourceAttributes": {"path": "/api", "verb": "get"}}},
    )
    assert (status, body["status"]["allowed"]) == (201, False)
    status, body = reviewer.request("POST", f"{AUTHZ}/subjectaccessreviews", sar)
    assert (status, body["message"]) == (
        403,
        (
            'subjectaccessreviews.authorization.k8s.io is forbidden: User "rita" cannot create resource '
            '"subjectaccessreviews" in API group "authorization.k8s.io" at the cluster scope'
        ),
    )
    status, body = admin.request(
        "POST",
        f"{AUTHZ}/subjectaccessreviews",
        {**sar, "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}},
    )
    assert (status, body["message"]) == (
        422,
        (
            'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": at '
            "least one of "
            "user or group must be specified"
        ),
    )


def test_local_subject_access_review_is_bound_to_its_namespace(admin: Any) -> None:
    path = f"{AUTHZ}/namespaces/{NS}/localsubjectaccessreviews"
    lsar = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "LocalSubjectAccessReview",
        "spec": {
            "user": "rita",
            "groups": ["readers"],
            "resourceAttributes": {"namespace": NS, "verb": "list", "resource": "configmaps"},
        },
    }
    status, body = admin.request("POST", path, lsar)
    assert status == 201 and body["metadata"]["namespace"] == NS and body["status"]["allowed"] is True
    elsewhere = {
        **lsar,
        "spec": {
            **lsar["spec"],
            "resourceAttributes": {"namespace": "default", "verb": "list", "resource": "configmaps"},
        },
    }
    status, body = admin.request("POST", path, elsewhere)
    assert (status, body["message"]) == (
        422,
        (
            'LocalSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes.namespace: '
            'Invalid value: "default": must match metadata.namespace'
        ),
    )
    status, body = admin.request("POST", path, {**lsar, "metadata": {"namespace": "default"}})
    assert (status, body["message"]) == (
        400,
        "the namespace of the provided object does not match the namespace sent on the request",
    )


def test_self_subject_review_is_stamped_now(reviewer: Any) -> None:
    status, body = reviewer.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201
    assert body["metadata"]["creationTimestamp"].endswith("Z")
    assert body["status"]["userInfo"]["groups"] == ["readers", "system:authenticated"]


def test_reviews_are_create_only(admin: Any) -> None:
    status, body = admin.request("GET", f"{AUTHZ}/selfsubjectaccessreviews")
    assert status == 405 and body["reason"] == "MethodNotAllowed"
