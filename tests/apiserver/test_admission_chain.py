"""The default admission chain through real kubectl: NamespaceLifecycle, LimitRanger and
ServiceAccount admission, with upstream's exact words."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from socialweb_computer import testing


def _apply(server: testing.ApiServerProcess, obj: dict[str, Any], *args: str, check: bool = False) -> Any:
    return server.kubectl("apply", "-f", "-", *args, input=json.dumps(obj), check=check)


def _pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "busybox", **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
    }


# ---------------------------------------------------------------- NamespaceLifecycle


def test_system_namespaces_cannot_be_deleted(shared_apiserver: testing.ApiServerProcess) -> None:
    for name in ("default", "kube-system", "kube-public"):
        for extra in (["--dry-run=server"], []):
            result = shared_apiserver.kubectl("delete", "namespace", name, *extra, check=False)
            assert result.returncode == 1
            assert result.stderr.strip() == (
                f'Error from server (Forbidden): namespaces "{name}" is forbidden: '
                "this namespace may not be deleted"
            )
    # kube-node-lease is not protected upstream either.
    dry = shared_apiserver.kubectl("delete", "namespace", "kube-node-lease", "--dry-run=server")
    assert dry.stdout.strip() == 'namespace "kube-node-lease" deleted (server dry run)'


def test_no_creates_in_a_missing_or_terminating_namespace(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    missing = shared_apiserver.kubectl("create", "configmap", "x", "-n", "no-such-ns", check=False)
    assert missing.stderr.strip() == 'error: failed to create configmap: namespaces "no-such-ns" not found'
    # An invalid object into a missing namespace is still a 404: lifecycle runs first.
    bad = _apply(
        shared_apiserver,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "Bad_Name", "namespace": "no-such-ns"},
        },
    )
    assert 'namespaces "no-such-ns" not found' in bad.stderr
    shared_apiserver.kubectl("create", "configmap", "held", "-n", namespace)
    shared_apiserver.kubectl(
        "patch",
        "configmap",
        "held",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":["example.com/hold"]}}',
    )
    shared_apiserver.kubectl("delete", "namespace", namespace, "--wait=false")
    result = shared_apiserver.kubectl("create", "configmap", "late", "-n", namespace, check=False)
    assert result.stderr.strip() == (
        f'error: failed to create configmap: configmaps "late" is forbidden: unable to create new content in '
        f"namespace {namespace} because it is being terminated"
    )
    shared_apiserver.kubectl(
        "patch",
        "configmap",
        "held",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
    )


# ---------------------------------------------------------------- LimitRanger


LIMITS = {
    "apiVersion": "v1",
    "kind": "LimitRange",
    "metadata": {"name": "limits"},
    "spec": {
        "limits": [
            {
                "type": "Container",
                "default": {"cpu": "500m", "memory": "256Mi"},
                "defaultRequest": {"cpu": "100m", "memory": "128Mi"},
                "max": {"cpu": "1", "memory": "1Gi"},
                "min": {"cpu": "50m"},
                "maxLimitRequestRatio": {"cpu": "10"},
            },
            {"type": "Pod", "max": {"memory": "2Gi"}},
            {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}, "max": {"storage": "5Gi"}},
        ]
    },
}


def test_limit_range_defaults_and_annotation(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _apply(shared_apiserver, {**LIMITS, "metadata": {"name": "limits", "namespace": namespace}}, check=True)
    _apply(
        shared_apiserver,
        _pod("defaulted", namespace, container={"resources": {"limits": {"cpu": "800m"}}}),
        check=True,
    )
    pod = json.loads(
        shared_apiserver.kubectl("get", "pod", "defaulted", "-n", namespace, "-o", "json").stdout
    )
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {"cpu": "800m", "memory": "256Mi"},
        "requests": {"cpu": "100m", "memory": "128Mi"},
    }
    assert pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"] == (
        "LimitRanger plugin set: cpu, memory request for container c; memory limit for container c"
    )
    assert pod["status"]["qosClass"] == "Burstable"


def test_limit_range_refusals(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    _apply(shared_apiserver, {**LIMITS, "metadata": {"name": "limits", "namespace": namespace}}, check=True)
    too_big = _apply(
        shared_apiserver,
        _pod(
            "big", namespace, container={"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}}
        ),
    )
    assert too_big.returncode == 1
    assert too_big.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "big" is forbidden: '
        "maximum cpu usage per Container is 1, but limit is 2"
    )
    several = _apply(
        shared_apiserver,
        _pod(
            "several",
            namespace,
            container={"resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "900m", "memory": "2Gi"}}},
        ),
    )
    assert several.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "several" is forbidden: '
        "[minimum cpu usage per Container is 50m, but request is 10m, maximum memory usage per Container is "
        "1Gi, but limit is 2Gi, cpu max limit to request ratio per Container is 10, but provided ratio is "
        "90.000000]"
    )
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Mi"}}},
    }
    refused = _apply(shared_apiserver, claim)
    assert refused.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": persistentvolumeclaims "tiny" is '
        "forbidden: "
        "minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 100Mi"
    )
    claim["spec"]["resources"]["requests"]["storage"] = "2Gi"
    assert _apply(shared_apiserver, claim).returncode == 0


# ---------------------------------------------------------------- ServiceAccount


def test_pods_get_the_projected_token_volume(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _apply(shared_apiserver, _pod("mounted", namespace), check=True)
    pod = json.loads(shared_apiserver.kubectl("get", "pod", "mounted", "-n", namespace, "-o", "json").stdout)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "default"
    (volume,) = spec["volumes"]
    assert re.fullmatch(r"kube-api-access-[a-z0-9]{5}", volume["name"])
    assert volume["projected"] == {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    }
    assert spec["containers"][0]["volumeMounts"] == [
        {
            "name": volume["name"],
            "readOnly": True,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        }
    ]


def test_a_new_namespace_takes_a_pod_at_once(shared_apiserver: testing.ApiServerProcess) -> None:
    """The serviceaccount controller makes `default` as the namespace appears (and admission waits
    for it a moment, as upstream's does), so the usual flows never meet the missing-account refusal:
    a Namespace and its Pod in one apply, and `kubectl create namespace` then `kubectl run`."""
    name = f"fresh-{uuid.uuid4().hex[:6]}"
    both = "---\n".join(
        json.dumps(o) for o in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                                _pod("first", name))
    )
    try:
        applied = shared_apiserver.kubectl("apply", "-f", "-", input=both, check=False)
        assert applied.returncode == 0, applied.stderr
        pod = json.loads(shared_apiserver.kubectl("get", "pod", "first", "-n", name, "-o", "json").stdout)
        assert pod["spec"]["serviceAccountName"] == "default"
        assert pod["spec"]["volumes"][0]["name"].startswith("kube-api-access-")
        shared_apiserver.kubectl("create", "namespace", f"{name}-b")
        ran = shared_apiserver.kubectl("run", "p", "-n", f"{name}-b", "--image=busybox", check=False)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "pod/p created"
    finally:
        for ns in (name, f"{name}-b"):
            shared_apiserver.kubectl(
                "delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False
            )


def test_automount_opt_outs_and_missing_accounts(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _apply(shared_apiserver, _pod("no-token", namespace, automountServiceAccountToken=False), check=True)
    spec = json.loads(
        shared_apiserver.kubectl("get", "pod", "no-token", "-n", namespace, "-o", "json").stdout
    )["spec"]
    assert "volumes" not in spec
    shared_apiserver.kubectl("create", "serviceaccount", "quiet", "-n", namespace)
    shared_apiserver.kubectl(
        "patch",
        "serviceaccount",
        "quiet",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"automountServiceAccountToken":false,"imagePullSecrets":[{"name":"reg"}]}',
    )
    _apply(shared_apiserver, _pod("quiet", namespace, serviceAccountName="quiet"), check=True)
    spec = json.loads(shared_apiserver.kubectl("get", "pod", "quiet", "-n", namespace, "-o", "json").stdout)[
        "spec"
    ]
    assert "volumes" not in spec
    assert spec["imagePullSecrets"] == [{"name": "reg"}]
    missing = _apply(shared_apiserver, _pod("lost", namespace, serviceAccountName="ghost"))
    assert missing.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "lost" is forbidden: '
        "error looking up "
        f'service account {namespace}/ghost: serviceaccount "ghost" not found'
    )
    # A mount of its own at the token path keeps the pod's choice.
    own = _pod(
        "own",
        namespace,
        container={
            "volumeMounts": [{"name": "mine", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        },
        volumes=[{"name": "mine", "emptyDir": {}}],
    )
    _apply(shared_apiserver, own, check=True)
    spec = json.loads(shared_apiserver.kubectl("get", "pod", "own", "-n", namespace, "-o", "json").stdout)[
        "spec"
    ]
    assert [v["name"] for v in spec["volumes"]] == ["mine"]


def test_deployment_pods_get_tokens_too(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    shared_apiserver.kubectl("create", "deployment", "web", "-n", namespace, "--image=busybox")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = json.loads(shared_apiserver.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)[
            "items"
        ]
        if listed:
            break
        time.sleep(0.1)
    assert listed
    assert listed[0]["spec"]["volumes"][0]["name"].startswith("kube-api-access-")
