"""Garbage collection seen through kubectl: background, foreground and orphan deletion of
an owner, and dependents of an owner that never existed."""

from __future__ import annotations

import json
import time

from socialweb_computer import testing

POLL = 0.1


def wait_for(check, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {check}")
        time.sleep(POLL)


def owned(server: testing.ApiServerProcess, ns: str, owner: str, uid: str, *, block: bool = False) -> None:
    ref = {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": uid}
    if block:
        ref["blockOwnerDeletion"] = True
    meta = {"namespace": ns, "ownerReferences": [ref]}
    docs = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {**meta, "name": f"{owner}-secret"},
         "stringData": {"a": "b"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {**meta, "name": f"{owner}-svc"},
         "spec": {"ports": [{"port": 80}]}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {**meta, "name": f"{owner}-pdb"},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": owner}}}},
    ]
    server.kubectl("create", "-f", "-", input="\n".join(json.dumps(d) for d in docs))


def make_pod(server: testing.ApiServerProcess, ns: str, name: str, finalizer: str = "") -> str:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    if finalizer:
        pod["metadata"]["finalizers"] = [finalizer]
    server.kubectl("create", "-f", "-", input=json.dumps(pod))
    return server.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.metadata.uid}").stdout


def names(server: testing.ApiServerProcess, ns: str) -> set[str]:
    out = server.kubectl("get", "secrets,services,pdb", "-n", ns, "-o", "name").stdout
    return set(out.split())


def test_background_deletion_removes_secret_service_and_pdb(shared_apiserver: testing.ApiServerProcess,
                                                            namespace: str) -> None:
    uid = make_pod(shared_apiserver, namespace, "job-pod")
    owned(shared_apiserver, namespace, "job-pod", uid)
    assert len(names(shared_apiserver, namespace)) == 3
    shared_apiserver.kubectl("delete", "pod", "job-pod", "-n", namespace)
    wait_for(lambda: not names(shared_apiserver, namespace))


def test_foreground_deletion_deletes_dependents_first(shared_apiserver: testing.ApiServerProcess,
                                                      namespace: str) -> None:
    uid = make_pod(shared_apiserver, namespace, "fg")
    owned(shared_apiserver, namespace, "fg", uid, block=True)
    # A finalizer on one dependent holds the owner in foreground deletion until it goes.
    shared_apiserver.kubectl("patch", "secret", "fg-secret", "-n", namespace, "--type=merge",
                             "-p", '{"metadata":{"finalizers":["example.com/hold"]}}')
    shared_apiserver.kubectl("delete", "pod", "fg", "-n", namespace, "--cascade=foreground", "--wait=false")
    wait_for(lambda: names(shared_apiserver, namespace) == {"secret/fg-secret"})
    pod = json.loads(shared_apiserver.kubectl("get", "pod", "fg", "-n", namespace, "-o", "json").stdout)
    assert pod["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in pod["metadata"]["finalizers"]
    shared_apiserver.kubectl("patch", "secret", "fg-secret", "-n", namespace, "--type=merge",
                             "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: not shared_apiserver.kubectl("get", "pod", "-n", namespace, "-o", "name").stdout.strip())
    assert not names(shared_apiserver, namespace)


def test_orphan_deletion_keeps_dependents_without_owner(shared_apiserver: testing.ApiServerProcess,
                                                        namespace: str) -> None:
    uid = make_pod(shared_apiserver, namespace, "orph")
    owned(shared_apiserver, namespace, "orph", uid)
    shared_apiserver.kubectl("delete", "pod", "orph", "-n", namespace, "--cascade=orphan")
    wait_for(lambda: not shared_apiserver.kubectl("get", "pod", "-n", namespace, "-o", "name").stdout.strip())
    time.sleep(0.3)
    assert len(names(shared_apiserver, namespace)) == 3
    secret = json.loads(shared_apiserver.kubectl("get", "secret", "orph-secret", "-n", namespace,
                                                 "-o", "json").stdout)
    assert not secret["metadata"].get("ownerReferences")


def test_dangling_owner_and_cluster_scoped_owner(shared_apiserver: testing.ApiServerProcess,
                                                 namespace: str) -> None:
    owned(shared_apiserver, namespace, "ghost", "00000000-0000-0000-0000-000000000000")
    wait_for(lambda: not names(shared_apiserver, namespace))
    # A namespaced object owned by a cluster-scoped one (a ClusterRole-like owner: a Namespace here).
    other = f"{namespace}-owner"
    shared_apiserver.kubectl("create", "namespace", other)
    ns_uid = shared_apiserver.kubectl("get", "namespace", other, "-o", "jsonpath={.metadata.uid}").stdout
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "child", "namespace": namespace,
                       "ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": other,
                                            "uid": ns_uid}]}}
    shared_apiserver.kubectl("create", "-f", "-", input=json.dumps(cm))
    time.sleep(0.3)
    assert shared_apiserver.kubectl("get", "configmap", "child", "-n", namespace, "-o", "name").stdout
    shared_apiserver.kubectl("delete", "namespace", other)
    wait_for(lambda: not shared_apiserver.kubectl("get", "configmap", "child", "-n", namespace,
                                                  "--ignore-not-found", "-o", "name").stdout.strip())
