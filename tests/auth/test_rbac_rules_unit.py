"""Rule semantics, request attributes and escalation arithmetic, without a server: the
corners the end-to-end suites reach only by chance."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict, CIMultiDictProxy

from socialweb_computer.auth import attributes, escalation, identity, impersonation, rbac

ALICE = identity.UserInfo("alice", ("devs", identity.AUTHENTICATED))


def _attrs(method: str, path: str) -> attributes.Attributes:
    return attributes.from_request(make_mocked_request(method, path), ALICE)


def _resource(
    verb: str, resource: str, sub: str = "", group: str = "", name: str = ""
) -> attributes.Attributes:
    return attributes.Attributes(
        ALICE, verb, True, api_group=group, resource=resource, subresource=sub, namespace="ns", name=name
    )


def test_request_verbs_follow_request_info() -> None:
    cases = {
        ("GET", "/api/v1/namespaces/ns/pods"): ("list", "pods", "", "ns", ""),
        ("GET", "/api/v1/namespaces/ns/pods?watch=true"): ("watch", "pods", "", "ns", ""),
        ("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dweb"): (
            "list",
            "pods",
            "",
            "ns",
            "web",
        ),
        ("DELETE", "/api/v1/namespaces/ns/pods"): ("deletecollection", "pods", "", "ns", ""),
        ("POST", "/api/v1/namespaces/ns/pods/web/exec"): ("create", "pods", "exec", "ns", "web"),
        ("GET", "/api/v1/namespaces/ns"): ("get", "namespaces", "", "ns", "ns"),
        ("PUT", "/api/v1/namespaces/ns/finalize"): ("update", "namespaces", "finalize", "ns", "ns"),
        ("HEAD", "/apis/apps/v1/namespaces/ns/deployments/web/scale"): (
            "get",
            "deployments",
            "scale",
            "ns",
            "web",
        ),
        ("GET", "/api/v1/watch/namespaces/ns/pods"): ("watch", "pods", "", "ns", ""),
        ("GET", "/api/v1/namespaces/ns/pods/web/proxy/some/path"): ("get", "pods", "proxy", "ns", "web"),
        ("PATCH", "/api/v1/nodes/n1/status"): ("patch", "nodes", "status", "", "n1"),
    }
    for (method, path), want in cases.items():
        got = _attrs(method, path)
        assert got.resource_request, path
        assert (got.verb, got.resource, got.subresource, got.namespace, got.name) == want, path
    for path in ("/api", "/api/v1", "/apis/apps", "/apis/apps/v1", "/healthz", "/"):
        got = _attrs("GET", path)
        assert (got.resource_request, got.verb, got.path) == (False, "get", path)
    assert _attrs("POST", "/logs").verb == "post"


def test_rule_matching_corners() -> None:
    rule = rbac.Rule(("get",), ("",), ("pods", "*/scale"), ("web",))
    assert rule.allows(_resource("get", "pods", name="web"))
    assert not rule.allows(_resource("get", "pods", name="db"))
    assert not rule.allows(_resource("get", "pods"))  # a list names nothing: resourceNames cannot match it
    assert rule.allows(_resource("get", "deployments", "scale", name="web"))
    assert not rule.allows(_resource("get", "pods", "log", name="web"))
    assert rbac.Rule(("*",), ("*",), ("*",)).allows(
        _resource("escalate", "roles", group="rbac.authorization.k8s.io")
    )
    assert not rbac.Rule(("get",), ("",), ("pods/*",)).allows(_resource("get", "pods", "log"))
    urls = rbac.Rule(("get",), non_resource_urls=("/logs/*", "/metrics"))
    for path, want in (
        ("/logs/a/b", True),
        ("/logs/", True),
        ("/logs", False),
        ("/metrics", True),
        ("/metrics/x", False),
    ):
        assert urls.allows(attributes.Attributes(ALICE, "get", False, path=path)) is want, path
    assert not urls.allows(_resource("get", "pods"))


def test_index_visits_cluster_bindings_then_namespace_bindings() -> None:
    index = rbac.Index()
    index.put(
        "clusterroles",
        {
            "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    index.put(
        "rolebindings",
        {
            "metadata": {"name": "b", "namespace": "ns"},
            "roleRef": {"kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}],
        },
    )
    index.put(
        "clusterrolebindings",
        {
            "metadata": {"name": "gone"},
            "roleRef": {"kind": "ClusterRole", "name": "x"},
            "subjects": [{"kind": "Group", "name": "devs"}],
        },
    )
    bot = identity.UserInfo("system:serviceaccount:ns:bot", ("system:serviceaccounts",))
    decision = rbac.authorize(index, attributes.Attributes(bot, "get", True, resource="pods", namespace="ns"))
    assert decision == rbac.Decision(
        True, 'RBAC: allowed by RoleBinding "b/ns" of ClusterRole "reader" to ServiceAccount "bot/ns"'
    )
    denied = rbac.authorize(index, _resource("get", "pods"))
    assert denied == rbac.Decision(False, 'RBAC: clusterrole.rbac.authorization.k8s.io "x" not found')
    index.remove("clusterrolebindings", {"metadata": {"name": "gone"}})
    assert rbac.authorize(index, _resource("get", "pods")) == rbac.Decision(False, "")
    assert rbac.aggregate_errors(["a", "b", "a"]) == "[a, b]"


def test_covers_breaks_rules_down_and_reports_compactly() -> None:
    owner = [
        rbac.Rule(("get", "list"), ("",), ("pods", "*/status")),
        rbac.Rule(("get",), ("",), ("secrets",), ("s1",)),
    ]
    wanted = [rbac.Rule(("get", "list", "watch"), ("",), ("pods", "deployments/status", "secrets"), ("s1",))]
    missing = escalation.covers(owner, wanted)
    assert [escalation.compact_string(r) for r in escalation.compact(missing)] == [
        '{APIGroups:[""], Resources:["pods"], ResourceNames:["s1"], Verbs:["watch"]}',
        '{APIGroups:[""], Resources:["deployments/status"], ResourceNames:["s1"], Verbs:["watch"]}',
        '{APIGroups:[""], Resources:["secrets"], ResourceNames:["s1"], Verbs:["list" "watch"]}',
    ]
    assert not escalation.covers(escalation.FULL_AUTHORITY, wanted)
    assert escalation.covers(
        [rbac.Rule(("get",), ("",), ("pods",), ("a",))], [rbac.Rule(("get",), ("",), ("pods",))]
    )
    assert not escalation.covers(
        [rbac.Rule(("get",), non_resource_urls=("/api/*",))],
        [rbac.Rule(("get",), non_resource_urls=("/api/v1",))],
    )


def test_impersonation_headers_are_parsed_like_go() -> None:
    headers = CIMultiDictProxy(
        CIMultiDict(
            [
                ("Impersonate-User", "system:serviceaccount:ci:builder"),
                ("Impersonate-Group", "a"),
                ("Impersonate-Group", "b"),
                ("Impersonate-Extra-Acme.com%2Fproject", "x"),
                ("Impersonate-Uid", "42"),
            ]
        )
    )
    got = impersonation.targets(headers)
    assert [(t.kind, t.namespace, t.name, t.extra_key) for t in got] == [
        ("ServiceAccount", "ci", "builder", ""),
        ("Group", "", "a", ""),
        ("Group", "", "b", ""),
        ("UserExtra", "", "x", "acme.com/project"),
        ("UID", "", "42", ""),
    ]
    bad_account = impersonation.targets(
        CIMultiDictProxy(CIMultiDict([("Impersonate-User", "system:serviceaccount:Not_A_Namespace:x")]))
    )
    assert bad_account[0].kind == "User"


def test_go_quoting() -> None:
    assert attributes.go_quote('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    assert attributes.go_quote_list(["x", "y"]) == '["x" "y"]'
    assert attributes.go_quote_list([]) == "[]"
