"""The bootstrap policy every cluster starts with, ClusterRole aggregation kept current, the
default ServiceAccount of every namespace, and reconciliation of the defaults on restart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from socialweb_computer import testing

RBAC = "rbac.authorization.k8s.io"
LABEL = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}


def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _get(server: testing.ApiServerProcess, *args: str) -> Any:
    return json.loads(server.kubectl("get", *args, "-o", "json").stdout)


def test_bootstrap_roles_and_bindings_are_upstreams(auth_server: testing.ApiServerProcess) -> None:
    roles = {
        r["metadata"]["name"]: r
        for r in _get(auth_server, "clusterroles", "-l", "kubernetes.io/bootstrapping=rbac-defaults")["items"]
    }
    assert {
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:basic-user",
        "system:discovery",
        "system:public-info-viewer",
        "system:aggregate-to-admin",
        "system:aggregate-to-edit",
        "system:aggregate-to-view",
        "system:monitoring",
    } <= set(roles)
    for role in roles.values():
        assert role["metadata"]["labels"].items() >= LABEL.items()
        assert role["metadata"]["annotations"] == AUTOUPDATE
    assert roles["cluster-admin"]["rules"] == [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"nonResourceURLs": ["*"], "verbs": ["*"]},
    ]
    assert roles["system:basic-user"]["rules"] == [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
    ]
    assert roles["edit"]["metadata"]["labels"] == {**LABEL, f"{RBAC}/aggregate-to-admin": "true"}
    assert roles["view"]["aggregationRule"] == {
        "clusterRoleSelectors": [{"matchLabels": {f"{RBAC}/aggregate-to-view": "true"}}]
    }
    bindings = {b["metadata"]["name"]: b for b in _get(auth_server, "clusterrolebindings")["items"]}
    subjects = {
        name: [s["name"] for s in bindings[name]["subjects"]]
        for name in ("cluster-admin", "system:basic-user", "system:discovery", "system:public-info-viewer")
    }
    assert subjects == {
        "cluster-admin": ["system:masters"],
        "system:basic-user": ["system:authenticated"],
        "system:discovery": ["system:authenticated"],
        "system:public-info-viewer": ["system:authenticated", "system:unauthenticated"],
    }
    assert bindings["cluster-admin"]["metadata"]["annotations"] == AUTOUPDATE


def _rules(server: testing.ApiServerProcess, name: str) -> list[dict[str, Any]]:
    return _get(server, "clusterrole", name).get("rules") or []


def test_admin_edit_and_view_aggregate_and_follow_labelled_roles(
    auth_server: testing.ApiServerProcess,
) -> None:
    view, edit, admin = (_rules(auth_server, n) for n in ("view", "edit", "admin"))
    assert view and all(r in edit for r in view) and all(r in admin for r in edit)
    assert {
        "apiGroups": [""],
        "resources": ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"],
        "verbs": ["create", "delete", "deletecollection", "patch", "update"],
    } in edit
    leases_rule = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch"],
    }
    auth_server.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "leases-view", "labels": {f"{RBAC}/aggregate-to-view": "true"}},
                "rules": [leases_rule],
            }
        ),
    )
    for name in ("view", "edit", "admin"):
        _until(lambda n=name: leases_rule in _rules(auth_server, n), f"{name} to aggregate leases")
    out = auth_server.kubectl(
        "auth", "can-i", "list", "leases.coordination.k8s.io", "-n", "default", "--as=vic", check=False
    )
    assert out.stdout.startswith("no")
    auth_server.kubectl(
        "create", "rolebinding", "vic-view", "-n", "default", "--clusterrole=view", "--user=vic"
    )
    out = auth_server.kubectl(
        "auth", "can-i", "list", "leases.coordination.k8s.io", "-n", "default", "--as=vic", check=False
    )
    assert out.stdout == "yes\n"
    auth_server.kubectl("delete", "clusterrole", "leases-view")
    _until(lambda: leases_rule not in _rules(auth_server, "view"), "view to drop leases")


def test_every_namespace_gets_a_default_service_account(auth_server: testing.ApiServerProcess) -> None:
    auth_server.kubectl("create", "namespace", "fresh")
    _until(
        lambda: (
            auth_server.kubectl("get", "serviceaccount", "default", "-n", "fresh", check=False).returncode
            == 0
        ),
        "the default ServiceAccount",
    )
    auth_server.kubectl("delete", "serviceaccount", "default", "-n", "fresh")
    _until(
        lambda: (
            auth_server.kubectl("get", "serviceaccount", "default", "-n", "fresh", check=False).returncode
            == 0
        ),
        "the default ServiceAccount to come back",
    )
    names = auth_server.kubectl(
        "get",
        "serviceaccounts",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}",
    ).stdout
    for namespace in ("default", "kube-system", "kube-public", "kube-node-lease", "fresh"):
        assert f"{namespace}/default" in names.split()


def test_restart_tops_up_the_defaults_but_respects_autoupdate_false(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = testing.ApiServerProcess.start(state)
    try:
        basic = _get(server, "clusterrole", "system:basic-user")
        basic["rules"] = basic["rules"][:1]
        server.kubectl("replace", "-f", "-", input=json.dumps(basic))
        discovery = _get(server, "clusterrole", "system:discovery")
        discovery["metadata"]["annotations"] = {"rbac.authorization.kubernetes.io/autoupdate": "false"}
        discovery["rules"] = [{"nonResourceURLs": ["/api"], "verbs": ["get"]}]
        server.kubectl("replace", "-f", "-", input=json.dumps(discovery))
        server.kubectl("delete", "clusterrolebinding", "system:public-info-viewer")
    finally:
        server.stop()
    server = testing.ApiServerProcess.start(state)
    try:
        assert len(_rules(server, "system:basic-user")) == 2
        assert _rules(server, "system:discovery") == [{"nonResourceURLs": ["/api"], "verbs": ["get"]}]
        assert (
            server.kubectl("get", "clusterrolebinding", "system:public-info-viewer", check=False).returncode
            == 0
        )
    finally:
        server.stop()


async def test_new_cluster_starts_with_the_aggregated_rules_the_controller_would_write() -> None:
    from socialweb_computer.apiserver.cluster import LogicalCluster
    from socialweb_computer.storage import memory

    cluster = LogicalCluster("fresh", memory.MemoryBackend())
    await cluster.start()
    try:
        roles = cluster.auth.index.cluster_roles
        assert {"admin", "edit", "view"} <= {name for name, role in roles.items() if role.get("rules")}
        assert await cluster.auth.aggregator.reconcile() == 0  # nothing left for aggregation to rewrite
        assert {r["metadata"].get("managedFields", [{}])[0].get("manager") for r in roles.values()} == {
            "kube-apiserver"}
    finally:
        await cluster.close()
