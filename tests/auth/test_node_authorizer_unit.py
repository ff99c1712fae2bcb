"""The Node authorizer and NodeRestriction without a server: the graph's cases as a table, the
authorizer's decisions and reasons, the label rules, and the graph kept equal to the store
(including after a hook fails). The end-to-end proof is test_node_authorization.py."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import attributes, identity, nodeauthorizer, nodegraph, noderestriction, policy
from socialweb_computer.storage import memory

N1 = identity.UserInfo("system:node:n1", ("system:nodes", identity.AUTHENTICATED))


def _pod(name: str, node: str = "n1", namespace: str = "ns", uid: str = "", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": node, **spec}}


def _container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "busybox", **fields}


# ------------------------------------------------------------------------------ what a pod references

REFERENCE_CASES: list[tuple[str, dict[str, Any], set[tuple[str, str]]]] = [
    ("secret volume", {"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}, {("secret", "s")}),
    ("configMap volume", {"volumes": [{"name": "v", "configMap": {"name": "c"}}]}, {("configmap", "c")}),
    ("projected secret and configMap", {"volumes": [{"name": "v", "projected": {"sources": [
        {"secret": {"name": "s"}}, {"configMap": {"name": "c"}}, {"serviceAccountToken": {"path": "t"}},
        {"downwardAPI": {"items": []}}]}}]}, {("secret", "s"), ("configmap", "c")}),
    ("env valueFrom", {"containers": [_container(env=[
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "D", "value": "plain"}])]}, {("secret", "s"), ("configmap", "c")}),
    ("envFrom", {"containers": [_container(envFrom=[{"secretRef": {"name": "s"}},
                                                    {"configMapRef": {"name": "c"}, "prefix": "X_"}])]},
     {("secret", "s"), ("configmap", "c")}),
    ("init and ephemeral containers", {
        "initContainers": [_container(envFrom=[{"secretRef": {"name": "init-s"}}])],
        "ephemeralContainers": [_container(env=[{"name": "A", "valueFrom": {
            "configMapKeyRef": {"name": "debug-c", "key": "k"}}}])]},
     {("secret", "init-s"), ("configmap", "debug-c")}),
    ("imagePullSecrets", {"imagePullSecrets": [{"name": "pull"}, {}]}, {("secret", "pull")}),
    ("serviceAccountName", {"serviceAccountName": "builder"}, {("serviceaccount", "builder")}),
    ("persistentVolumeClaim", {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
     {("persistentvolumeclaim", "data")}),
    ("ephemeral volume: <pod>-<volume>", {"volumes": [{"name": "scratch", "ephemeral": {
        "volumeClaimTemplate": {"spec": {}}}}]}, {("persistentvolumeclaim", "p-scratch")}),
    ("secrets of volume plugins", {"volumes": [
        {"name": "a", "azureFile": {"secretName": "az"}},
        {"name": "b", "cephfs": {"secretRef": {"name": "ceph"}}},
        {"name": "c", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}},
        {"name": "d", "flexVolume": {"driver": "f", "secretRef": {"name": "flex"}}},
        {"name": "e", "rbd": {"secretRef": {"name": "rbd"}}},
        {"name": "f", "iscsi": {"secretRef": {"name": "i"}}}]},
     {("secret", n) for n in ("az", "ceph", "csi", "flex", "rbd", "i")}),
    ("nothing referenced", {"containers": [_container()], "volumes": [{"name": "e", "emptyDir": {}}]}, set()),
    ("malformed fields are ignored", {"volumes": "nope", "containers": [None, {"env": 7}],
                                      "imagePullSecrets": [{"name": 3}]}, set()),
]


@pytest.mark.parametrize(("spec", "want"), [c[1:] for c in REFERENCE_CASES],
                         ids=[c[0] for c in REFERENCE_CASES])
def test_what_a_pod_references(spec: dict[str, Any], want: set[tuple[str, str]]) -> None:
    refs = nodegraph.pod_references(_pod("p", **spec))
    assert refs == {(kind, "ns", name) for kind, name in want}


# ------------------------------------------------------------------------------ the graph


def test_graph_paths_follow_pods_onto_their_nodes() -> None:
    graph = nodegraph.Graph()
    shared = {"volumes": [{"name": "v", "secret": {"secretName": "shared"}}]}
    graph.put_pod(_pod("a", "n1", **shared))
    graph.put_pod(_pod("b", "n1", **shared))
    graph.put_pod(_pod("c", "n2", **shared, serviceAccountName="sa"))
    graph.put_pod(_pod("pending", "", volumes=[{"name": "v", "secret": {"secretName": "unbound"}}]))
    table = [
        ("n1", "secret", "ns", "shared", True),
        ("n2", "secret", "ns", "shared", True),
        ("n3", "secret", "ns", "shared", False),
        ("n1", "secret", "other", "shared", False),  # namespaced: the same name elsewhere is unrelated
        ("n1", "secret", "ns", "unbound", False),  # a pod with no node grants nothing
        ("n1", "serviceaccount", "ns", "sa", False),
        ("n2", "serviceaccount", "ns", "sa", True),
        ("n1", "pod", "ns", "a", True),
        ("n2", "pod", "ns", "a", False),
        ("n1", "pod", "ns", "pending", False),
    ]
    for node, kind, namespace, name, want in table:
        assert graph.has_path(node, kind, namespace, name) is want, (node, kind, namespace, name)
    graph.remove_pod("ns", "a")
    assert graph.has_path("n1", "secret", "ns", "shared")  # b still references it
    graph.remove_pod("ns", "b")
    assert not graph.has_path("n1", "secret", "ns", "shared")
    assert graph.has_path("n2", "secret", "ns", "shared")
    graph.remove_pod("ns", "c")
    graph.remove_pod("ns", "pending")
    assert graph.statistics() == {"pods": 0, "objects": 0, "persistentvolumes": 0}


def test_a_pod_recreated_on_another_node_moves_its_references() -> None:
    graph = nodegraph.Graph()
    refs = {"containers": [_container(envFrom=[{"configMapRef": {"name": "cfg"}}])]}
    graph.put_pod(_pod("p", "n1", uid="first", **refs))
    graph.remove_pod("ns", "p")
    graph.put_pod(_pod("p", "n2", uid="second", **refs))
    assert not graph.has_path("n1", "configmap", "ns", "cfg")
    assert graph.has_path("n2", "configmap", "ns", "cfg")
    # An update that changes what the pod references (an ephemeral container added) is followed.
    graph.put_pod(_pod("p", "n2", uid="second", **refs, ephemeralContainers=[
        _container(envFrom=[{"secretRef": {"name": "debug"}}])]))
    assert graph.has_path("n2", "secret", "ns", "debug")
    graph.put_pod(_pod("p", "", uid="second"))  # (cannot happen through the API) unbound: gone
    assert graph.statistics()["objects"] == 0


def test_persistent_volumes_reach_a_node_through_their_claim() -> None:
    graph = nodegraph.Graph()
    graph.put_pv({"metadata": {"name": "pv1"}, "spec": {
        "claimRef": {"namespace": "ns", "name": "data"},
        "csi": {"driver": "d", "volumeHandle": "h",
                "nodeStageSecretRef": {"name": "stage", "namespace": "vault"}},
        "azureFile": {"secretName": "az"}}})
    assert not graph.has_path("n1", "persistentvolume", "", "pv1")
    graph.put_pod(_pod("p", "n1", volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]))
    assert graph.has_path("n1", "persistentvolumeclaim", "ns", "data")
    assert graph.has_path("n1", "persistentvolume", "", "pv1")
    assert graph.has_path("n1", "secret", "vault", "stage")  # node <- pod <- pvc <- pv <- secret
    assert graph.has_path("n1", "secret", "ns", "az")  # azureFile: the claim's namespace by default
    assert not graph.has_path("n2", "persistentvolume", "", "pv1")
    graph.remove_pv("pv1")
    assert not graph.has_path("n1", "secret", "vault", "stage")


# ------------------------------------------------------------------------------ the authorizer's answers


def _authorizer() -> nodeauthorizer.NodeAuthorizer:
    class Fixed:
        graph = nodegraph.Graph()

    Fixed.graph.put_pod(_pod("mine", "n1", serviceAccountName="builder", volumes=[
        {"name": "s", "secret": {"secretName": "s1"}},
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]))
    Fixed.graph.put_pod(_pod("theirs", "n2", volumes=[{"name": "s", "secret": {"secretName": "s2"}}]))
    return nodeauthorizer.NodeAuthorizer(Fixed)  # type: ignore[arg-type]


def _ask(verb: str, resource: str, *, group: str = "", namespace: str = "", name: str = "",
         sub: str = "", field_selector: str = "") -> attributes.Attributes:
    return attributes.Attributes(N1, verb, True, api_group=group, resource=resource, subresource=sub,
                                 namespace=namespace, name=name, field_selector=field_selector)


NO_RELATIONSHIP = "no relationship found between node 'n1' and this object"
DECISIONS: list[tuple[attributes.Attributes, bool, str]] = [
    (_ask("get", "secrets", namespace="ns", name="s1"), True, ""),
    (_ask("watch", "secrets", namespace="ns", name="s1"), True, ""),  # fieldSelector=metadata.name=s1
    (_ask("get", "secrets", namespace="ns", name="s2"), False, NO_RELATIONSHIP),
    (_ask("get", "secrets", namespace="ns", name="unused"), False, NO_RELATIONSHIP),
    (_ask("list", "secrets", namespace="ns"), False, "No Object name found"),
    (_ask("list", "secrets"), False, "can only read namespaced object of this type"),
    (_ask("update", "secrets", namespace="ns", name="s1"), False, "can only read resources of this type"),
    (_ask("get", "configmaps", namespace="ns", name="s1"), False, NO_RELATIONSHIP),
    (_ask("get", "persistentvolumeclaims", namespace="ns", name="data"), True, ""),
    (_ask("list", "persistentvolumeclaims", namespace="ns"), False,
     "can only get individual resources of this type"),
    (_ask("patch", "persistentvolumeclaims", namespace="ns", name="data", sub="status"), True, ""),
    (_ask("get", "persistentvolumeclaims", namespace="ns", name="data", sub="status"), False,
     "can only get/update/patch this type"),
    (_ask("create", "serviceaccounts", namespace="ns", name="builder", sub="token"), True, ""),
    (_ask("create", "serviceaccounts", namespace="ns", name="default", sub="token"), False, NO_RELATIONSHIP),
    (_ask("get", "serviceaccounts", namespace="ns", name="builder"), False,
     "can only create tokens for individual service accounts"),
    (_ask("get", "nodes", name="n1"), True, ""),
    (_ask("watch", "nodes", name="n1"), True, ""),
    (_ask("get", "nodes", name="n2"), False, "node 'n1' cannot read 'n2', only its own Node object"),
    (_ask("list", "nodes"), False, "node 'n1' cannot read all nodes, only its own Node object"),
    (_ask("create", "nodes"), True, ""),
    (_ask("patch", "nodes", name="n2", sub="status"), True, ""),  # NodeRestriction refuses it
    (_ask("delete", "nodes", name="n1"), False, ""),
    (_ask("get", "pods", namespace="ns", name="mine"), True, ""),
    (_ask("get", "pods", namespace="ns", name="theirs"), False, NO_RELATIONSHIP),
    (_ask("list", "pods", field_selector="spec.nodeName=n1"), True, ""),
    (_ask("watch", "pods", field_selector="status.phase!=Failed,spec.nodeName==n1"), True, ""),
    (_ask("list", "pods", field_selector="spec.nodeName=n2"), False,
     "can only list/watch pods with spec.nodeName field selector"),
    (_ask("list", "pods", namespace="ns"), False,
     "can only list/watch pods with spec.nodeName field selector"),
    (_ask("create", "pods", namespace="ns"), True, ""),
    (_ask("update", "pods", namespace="ns", name="mine"), False, ""),
    (_ask("patch", "pods", namespace="ns", name="theirs", sub="status"), True, ""),  # NodeRestriction
    (_ask("create", "pods", namespace="ns", name="theirs", sub="eviction"), True, ""),
    (_ask("create", "pods", namespace="ns", name="mine", sub="exec"), False, ""),
    (_ask("update", "leases", group="coordination.k8s.io", namespace="kube-node-lease", name="n1"), True, ""),
    (_ask("update", "leases", group="coordination.k8s.io", namespace="kube-node-lease", name="n2"), False,
     "can only access node lease with the same name as the requesting node"),
    (_ask("get", "leases", group="coordination.k8s.io", namespace="default", name="n1"), False,
     'can only access leases in the "kube-node-lease" system namespace'),
    (_ask("list", "leases", group="coordination.k8s.io", namespace="kube-node-lease"), False,
     "can only get, create, update, patch, or delete a node lease"),
    (_ask("create", "events", namespace="ns"), True, ""),
    (_ask("watch", "services"), True, ""),
    (_ask("get", "endpoints", namespace="ns", name="kubernetes"), True, ""),
    (_ask("delete", "services", namespace="ns", name="x"), False, ""),
    (_ask("create", "subjectaccessreviews", group="authorization.k8s.io"), True, ""),
    (_ask("get", "deployments", group="apps", namespace="ns", name="d"), False, ""),
    (attributes.Attributes(N1, "get", False, path="/healthz"), False, ""),  # discovery comes from RBAC
]


@pytest.mark.parametrize(("attrs", "allowed", "reason"), DECISIONS,
                         ids=[f"{a.verb} {a.resource}/{a.subresource} {a.name}" for a, _, _ in DECISIONS])
def test_node_authorizer_decisions(attrs: attributes.Attributes, allowed: bool, reason: str) -> None:
    assert _authorizer().authorize(attrs) == nodeauthorizer.Decision(allowed, reason)


def test_who_is_a_node() -> None:
    assert nodeauthorizer.node_name(N1) == "n1"
    assert nodeauthorizer.node_name(identity.UserInfo("system:node:n1", ("other",))) is None
    assert nodeauthorizer.node_name(identity.UserInfo("kubelet", ("system:nodes",))) is None
    assert nodeauthorizer.node_name(identity.UserInfo("system:node:", ("system:nodes",))) == ""
    unknown = attributes.Attributes(identity.UserInfo("system:node:", ("system:nodes",)), "get", True,
                                    resource="nodes", name="x")
    want = nodeauthorizer.Decision(False, 'unknown node for user "system:node:"')
    assert _authorizer().authorize(unknown) == want
    other = attributes.Attributes(identity.UserInfo("alice"), "get", True, resource="secrets", namespace="ns",
                                  name="s1")
    assert _authorizer().authorize(other) is None


LABELS = [
    ({"kubernetes.io/hostname": "n1", "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "x",
      "sub.node.kubernetes.io/y": "1", "kubelet.kubernetes.io/z": "1", "example.com/team": "ci"}, []),
    ({"node-role.kubernetes.io/worker": ""}, ["node-role.kubernetes.io/worker"]),
    ({"node-restriction.kubernetes.io/pool": "a", "x.node-restriction.kubernetes.io/b": "1"},
     ["node-restriction.kubernetes.io/pool", "x.node-restriction.kubernetes.io/b"]),
    ({"k8s.io/anything": "1", "kubernetes.io/other": "1", "beta.kubernetes.io/os": "linux"},
     ["k8s.io/anything", "kubernetes.io/other"]),
]


@pytest.mark.parametrize(("labels", "refused"), LABELS)
def test_labels_a_node_may_not_set(labels: dict[str, str], refused: list[str]) -> None:
    assert noderestriction.forbidden_labels(labels, None) == refused
    assert noderestriction.forbidden_labels(None, labels) == refused  # removing them is refused too
    assert noderestriction.forbidden_labels(labels, labels) == []  # unchanged ones are fine


# ------------------------------------------------------------------------------ against a live store


@pytest.fixture
async def cluster() -> AsyncIterator[LogicalCluster]:
    cluster = LogicalCluster("nodes", memory.MemoryBackend())
    await cluster.start()
    yield cluster
    await cluster.close()


def _kind(cluster: LogicalCluster, plural: str, group: str = "") -> Any:
    return cluster.registry.lookup(group, "v1", plural)


async def _create(cluster: LogicalCluster, plural: str, namespace: str,
                  obj: dict[str, Any]) -> dict[str, Any]:
    result = await cluster.store.create(_kind(cluster, plural), namespace, copy.deepcopy(obj),
                                        store_mod.WriteOptions())
    return result.object


def _reads(cluster: LogicalCluster, name: str, namespace: str = "default") -> bool:
    return cluster.auth.authorize(_ask("get", "secrets", namespace=namespace, name=name)).allowed


async def test_an_idle_cluster_holds_an_empty_graph(cluster: LogicalCluster) -> None:
    assert cluster.auth.node_graph.graph.statistics() == {"pods": 0, "objects": 0, "persistentvolumes": 0}
    assert cluster.auth.node_restriction.node_uids == {}


async def test_the_graph_follows_the_store_and_is_loaded_at_start(cluster: LogicalCluster) -> None:
    await _create(cluster, "pods", "default", {"metadata": {"name": "p"}, "spec": {
        "nodeName": "n1", "containers": [_container(envFrom=[{"secretRef": {"name": "s"}}])]}})
    assert _reads(cluster, "s")
    restarted = LogicalCluster("nodes", cluster.store.backend)
    await restarted.start()
    try:
        assert _reads(restarted, "s")
    finally:
        await restarted.close()
    await cluster.store.delete(_kind(cluster, "pods"), "default", "p",
                               store_mod.DeleteOptions(grace_period_seconds=0))
    assert not _reads(cluster, "s")


async def test_a_failing_hook_fails_closed_and_the_graph_is_rebuilt(
        cluster: LogicalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    await _create(cluster, "pods", "default", {"metadata": {"name": "a"}, "spec": {
        "nodeName": "n1", "containers": [_container(envFrom=[{"secretRef": {"name": "sa"}}])]}})
    real = nodegraph.pod_references
    failures = []

    def broken_once(pod: dict[str, Any]) -> frozenset[nodegraph.Ref]:
        if pod["metadata"]["name"] == "b" and not failures:
            failures.append(pod)
            raise RuntimeError("simulated bug")
        return real(pod)

    monkeypatch.setattr(nodegraph, "pod_references", broken_once)
    await _create(cluster, "pods", "default", {"metadata": {"name": "b"}, "spec": {
        "nodeName": "n1", "containers": [_container(envFrom=[{"secretRef": {"name": "sb"}}])]}})
    assert failures and not _reads(cluster, "sb")  # failed closed: the write was acknowledged, access not
    assert _reads(cluster, "sa")
    rebuild = cluster.auth.node_graph._rebuild
    assert rebuild is not None
    await rebuild
    assert _reads(cluster, "sb") and _reads(cluster, "sa")


async def test_node_restriction_on_the_store_write_path(cluster: LogicalCluster) -> None:
    nodes = _kind(cluster, "nodes")
    node = await _create(cluster, "nodes", "", {"metadata": {"name": "n1", "labels": {"team": "ci"}}})
    await _create(cluster, "nodes", "", {"metadata": {"name": "n2"}})

    def as_node(verb: str, resource: str, name: str = "", sub: str = "", namespace: str = "") -> Any:
        attrs = _ask(verb, resource, name=name, sub=sub, namespace=namespace)
        return policy.REQUEST.set(policy.RequestContext(cluster.auth, attrs))

    async def refused(coro: Any) -> str:
        with pytest.raises(errors.StatusError) as caught:
            await coro
        assert caught.value.code == 403
        return caught.value.message

    token = as_node("update", "nodes", "n1")
    try:
        role = {"node-role.kubernetes.io/control": "", "k8s.io/x": "1"}
        relabelled = {**node, "metadata": {**node["metadata"], "labels": role}}
        message = await refused(cluster.store.update(nodes, "", "n1", relabelled, store_mod.WriteOptions()))
        assert message == ('nodes "n1" is forbidden: is not allowed to modify labels: '
                           "k8s.io/x, node-role.kubernetes.io/control")
        tainted = {**node, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
        message = await refused(cluster.store.update(nodes, "", "n1", tainted, store_mod.WriteOptions()))
        assert message == 'nodes "n1" is forbidden: node "n1" is not allowed to modify taints'
        own = {"team": "other", "kubernetes.io/os": "linux"}
        kept = {**node, "metadata": {**node["metadata"], "labels": own}}
        await cluster.store.update(nodes, "", "n1", kept, store_mod.WriteOptions())
    finally:
        policy.REQUEST.reset(token)
    token = as_node("create", "pods", namespace="default")
    try:
        n1 = cluster.auth.node_restriction.node_uids["n1"]
        owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": n1, "controller": True}
        mirror = {"metadata": {"name": "static-web-n1", "annotations": {"kubernetes.io/config.mirror": "h"},
                               "ownerReferences": [owner]},
                  "spec": {"nodeName": "n1", "containers": [_container()]}}
        created = await _create(cluster, "pods", "default", mirror)
        assert "serviceAccountName" not in created["spec"]  # mirror pods keep no service account
        wrong = {**mirror, "metadata": {**mirror["metadata"], "name": "x", "ownerReferences": [
            {**mirror["metadata"]["ownerReferences"][0], "uid": "not-it"}]}}
        message = await refused(_create(cluster, "pods", "default", wrong))
        assert message == f'pods "x" is forbidden: node n1 UID mismatch: expected not-it got {n1}'
        message = await refused(_create(cluster, "pods", "default", {
            "metadata": {"generateName": "plain-"}, "spec": {"containers": [_container()]}}))
        assert message == ('pods "plain-" is forbidden: pod does not have "kubernetes.io/config.mirror" '
                           'annotation, node "n1" can only create mirror pods')
    finally:
        policy.REQUEST.reset(token)


def _token(audience: str = "") -> dict[str, Any]:
    return {"serviceAccountToken": {"path": "token", **({"audience": audience} if audience else {})}}


async def test_a_token_request_is_held_to_the_nodes_own_pods(cluster: LogicalCluster) -> None:
    pod = await _create(cluster, "pods", "default", {"metadata": {"name": "p"}, "spec": {
        "nodeName": "n1", "containers": [_container()], "volumes": [
            {"name": "kube-api-access-x", "projected": {"sources": [_token()]}},
            {"name": "t", "projected": {"sources": [_token("vault")]}}]}})
    admit = cluster.auth.node_restriction.admit_token_request
    attrs = _ask("create", "serviceaccounts", namespace="default", name="default", sub="token")

    def request(uid: str = "", audiences: tuple[str, ...] = (), name: str = "p") -> dict[str, Any]:
        ref = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid or pod["metadata"]["uid"]}
        return {"spec": {"audiences": list(audiences), "boundObjectRef": ref}}

    await admit(attrs, request())
    await admit(attrs, request(audiences=("vault",)))
    prefix = 'serviceaccounts "default" is forbidden: '
    cases = [
        ({"spec": {}}, prefix + "node requested token not bound to a pod"),
        (request(uid="other"), prefix + "the UID in the bound object reference (other) does not match "
                                        "the UID in record. The object might have been deleted and then "
                                        "recreated"),
        (request(audiences=("elsewhere",)), prefix + 'audience "elsewhere" not found in pod spec volume, '
                                                     "system:node:n1 is not authorized to request tokens for "
                                                     "this audience"),
        (request(audiences=("a", "b")), prefix + "node may only request 0 or 1 audiences"),
    ]
    for body, message in cases:
        with pytest.raises(errors.StatusError) as caught:
            await admit(attrs, body)
        assert (caught.value.code, caught.value.message) == (403, message)
    with pytest.raises(errors.StatusError) as caught:
        await admit(attrs, request(name="gone"))
    assert (caught.value.code, caught.value.message) == (404, 'pod "gone" not found')
    n2 = dataclasses.replace(attrs, user=identity.UserInfo("system:node:n2", ("system:nodes",)))
    with pytest.raises(errors.StatusError) as caught:
        await admit(n2, request())
    assert caught.value.message == prefix + "node requested token bound to a pod scheduled on a different " \
                                            "node"
