"""The groups and kinds every 1.37 cluster serves, driven with the real kubectl 1.37: discovery
against upstream's list, autoscaling, ingress, certificates, pruning and the other everyday
commands that failed while these kinds were missing.

Each test keeps to its own namespace on the shared server unless it changes cluster-wide state.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from socialweb_computer import testing

# What a 1.37 kube-apiserver serves by default: every group-version whose version is GA (the
# versions enabled without --runtime-config), with each resource's scope and subresources.
# Source: kubernetes/kubernetes api/discovery/aggregated_v2.json and api__v1.json (the
# discovery documents the upstream integration test records), restricted to GA versions and
# checked against the 1.37 OpenAPI definitions of the kubernetes-validate package.
UPSTREAM_1_37: dict[str, dict[str, tuple[bool, tuple[str, ...]]]] = {
    "v1": {
        "bindings": (True, ()), "componentstatuses": (False, ()), "configmaps": (True, ()),
        "endpoints": (True, ()), "events": (True, ()), "limitranges": (True, ()),
        "namespaces": (False, ("finalize", "status")), "nodes": (False, ("proxy", "status")),
        "persistentvolumeclaims": (True, ("status",)), "persistentvolumes": (False, ("status",)),
        "pods": (True, ("attach", "binding", "ephemeralcontainers", "eviction", "exec", "log", "portforward",
                        "proxy", "resize", "status")),
        "podtemplates": (True, ()), "replicationcontrollers": (True, ("scale", "status")),
        "resourcequotas": (True, ("status",)), "secrets": (True, ()), "serviceaccounts": (True, ("token",)),
        "services": (True, ("proxy", "status")),
    },
    "admissionregistration.k8s.io/v1": {
        "mutatingadmissionpolicies": (False, ()), "mutatingadmissionpolicybindings": (False, ()),
        "mutatingwebhookconfigurations": (False, ()), "validatingadmissionpolicies": (False, ("status",)),
        "validatingadmissionpolicybindings": (False, ()), "validatingwebhookconfigurations": (False, ()),
    },
    "apiextensions.k8s.io/v1": {"customresourcedefinitions": (False, ("status",))},
    "apiregistration.k8s.io/v1": {"apiservices": (False, ("status",))},
    "apps/v1": {
        "controllerrevisions": (True, ()), "daemonsets": (True, ("status",)),
        "deployments": (True, ("scale", "status")), "replicasets": (True, ("scale", "status")),
        "statefulsets": (True, ("scale", "status")),
    },
    "authentication.k8s.io/v1": {"selfsubjectreviews": (False, ()), "tokenreviews": (False, ())},
    "authorization.k8s.io/v1": {
        "localsubjectaccessreviews": (True, ()), "selfsubjectaccessreviews": (False, ()),
        "selfsubjectrulesreviews": (False, ()), "subjectaccessreviews": (False, ()),
    },
    "autoscaling/v1": {"horizontalpodautoscalers": (True, ("status",))},
    "autoscaling/v2": {"horizontalpodautoscalers": (True, ("status",))},
    "batch/v1": {"cronjobs": (True, ("status",)), "jobs": (True, ("status",))},
    "certificates.k8s.io/v1": {
        "certificatesigningrequests": (False, ("approval", "status")), "clustertrustbundles": (False, ()),
        "podcertificaterequests": (True, ("status",)),
    },
    "coordination.k8s.io/v1": {"leases": (True, ())},
    "discovery.k8s.io/v1": {"endpointslices": (True, ())},
    "events.k8s.io/v1": {"events": (True, ())},
    "flowcontrol.apiserver.k8s.io/v1": {
        "flowschemas": (False, ("status",)), "prioritylevelconfigurations": (False, ("status",)),
    },
    "networking.k8s.io/v1": {
        "ingressclasses": (False, ()), "ingresses": (True, ("status",)), "ipaddresses": (False, ()),
        "networkpolicies": (True, ()), "servicecidrs": (False, ("status",)),
    },
    "node.k8s.io/v1": {"runtimeclasses": (False, ())},
    "policy/v1": {"poddisruptionbudgets": (True, ("status",))},
    "rbac.authorization.k8s.io/v1": {
        "clusterrolebindings": (False, ()), "clusterroles": (False, ()), "rolebindings": (True, ()),
        "roles": (True, ()),
    },
    "resource.k8s.io/v1": {
        "deviceclasses": (False, ()), "devicetaintrules": (False, ("status",)),
        "resourceclaims": (True, ("status",)), "resourceclaimtemplates": (True, ()),
        "resourceslices": (False, ()),
    },
    "scheduling.k8s.io/v1": {"priorityclasses": (False, ())},
    "storage.k8s.io/v1": {
        "csidrivers": (False, ()), "csinodes": (False, ()), "csistoragecapacities": (True, ()),
        "storageclasses": (False, ()), "volumeattachments": (False, ("status",)),
        "volumeattributesclasses": (False, ()),
    },
    "storagemigration.k8s.io/v1": {"storageversionmigrations": (False, ("status",))},
}


def _served(server: testing.ApiServerProcess) -> dict[str, dict[str, tuple[bool, tuple[str, ...]]]]:
    k = server.kubectl
    versions = ["v1"] + [v["groupVersion"] for g in json.loads(k("get", "--raw", "/apis").stdout)["groups"]
                         for v in g["versions"]]
    served: dict[str, dict[str, tuple[bool, tuple[str, ...]]]] = {}
    for gv in versions:
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        resources = json.loads(k("get", "--raw", path).stdout)["resources"]
        entry: dict[str, tuple[bool, tuple[str, ...]]] = {}
        for r in resources:
            if "/" not in r["name"]:
                subs = sorted(s["name"].split("/", 1)[1] for s in resources
                              if s["name"].startswith(r["name"] + "/"))
                entry[r["name"]] = (r["namespaced"], tuple(subs))
        served[gv] = entry
    return served


def test_discovery_serves_what_a_1_37_cluster_serves(shared_apiserver: testing.ApiServerProcess) -> None:
    served = _served(shared_apiserver)
    assert set(served) == set(UPSTREAM_1_37)
    for gv, resources in UPSTREAM_1_37.items():
        assert served[gv] == resources, gv
    # kubectl reads the aggregated form: the same resources, once per group (preferred version).
    names = set(shared_apiserver.kubectl("api-resources", "-o", "name").stdout.split())
    assert names == {f"{r}.{gv.split('/')[0]}" if "/" in gv else r
                     for gv, resources in UPSTREAM_1_37.items() for r in resources}


def test_autoscale_creates_an_hpa_that_says_it_has_no_metrics(shared_apiserver: testing.ApiServerProcess,
                                                              namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "deployment", "web", "-n", namespace, "--image=nginx:1.27", "--replicas=1")
    assert k("autoscale", "-n", namespace, "deployment", "web", "--min=2", "--max=4",
             "--cpu-percent=60").stdout.strip() == "horizontalpodautoscaler.autoscaling/web autoscaled"
    _wait(lambda: json.loads(k("get", "-n", namespace, "deployment", "web", "-o", "json").stdout)["spec"]
          ["replicas"] == 2, "the autoscaler to raise the Deployment to minReplicas")
    hpa = json.loads(k("get", "-n", namespace, "hpa", "web", "-o", "json").stdout)
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["metrics"][0]["resource"]["target"]
    assert target == {"type": "Utilization", "averageUtilization": 60}
    _wait(lambda: any(c["type"] == "ScalingActive" for c in json.loads(
        k("get", "-n", namespace, "hpa", "web", "-o", "json").stdout)["status"].get("conditions") or []),
        "the autoscaler to report its metrics")
    described = k("describe", "-n", namespace, "hpa", "web").stdout
    assert "FailedGetResourceMetric" in described and "get pods.metrics.k8s.io" in described
    table = k("get", "-n", namespace, "hpa", "web").stdout
    assert "cpu: <unknown>/60%" in table
    v1 = json.loads(k("get", "-n", namespace, "horizontalpodautoscalers.v1.autoscaling", "web", "-o",
                      "json").stdout)
    assert v1["apiVersion"] == "autoscaling/v1" and v1["spec"]["targetCPUUtilizationPercentage"] == 60


def test_create_ingress(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    out = k("create", "ingress", "web", "-n", namespace, "--class=default",
            "--rule=foo.example.com/bar*=svc:8080", "--rule=example.com/=svc2:http").stdout
    assert out.strip() == "ingress.networking.k8s.io/web created"
    ingress = json.loads(k("get", "-n", namespace, "ingress", "web", "-o", "json").stdout)
    paths = ingress["spec"]["rules"][0]["http"]["paths"]
    assert paths[0]["pathType"] == "Prefix" and paths[0]["backend"]["service"]["port"]["number"] == 8080
    assert ingress["status"] == {"loadBalancer": {}}
    lines = k("get", "-n", namespace, "ingress").stdout.splitlines()
    assert lines[0].split() == ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
    refused = k("create", "ingress", "bad", "-n", namespace, "--rule=/path=svc:80", "--dry-run=server",
                "-o", "yaml", check=False)
    assert refused.returncode == 0  # a host-less rule is fine
    bad = k("apply", "-n", namespace, "-f", "-", check=False, input="""\
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: nothing}
spec: {}
""")
    assert "either `defaultBackend` or `rules` must be specified" in bad.stderr


def test_certificate_approve_mints_a_working_credential(shared_apiserver: testing.ApiServerProcess,
                                                        tmp_path: Path) -> None:
    k = shared_apiserver.kubectl
    user = f"alice-{uuid.uuid4().hex[:6]}"
    key, csr = tmp_path / "alice.key", tmp_path / "alice.csr"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={user}/O=devs"],
                   check=True, capture_output=True)
    manifest = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": user}, "spec": {
                    "request": base64.b64encode(csr.read_bytes()).decode(),
                    "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"],
                    "expirationSeconds": 3600}}
    k("apply", "-f", "-", input=json.dumps(manifest))
    table = k("get", "csr", user).stdout
    assert "Pending" in table and "kubernetes.io/kube-apiserver-client" in table
    assert k("certificate", "approve", user).stdout.strip() == \
        f"certificatesigningrequest.certificates.k8s.io/{user} approved"
    _wait(lambda: json.loads(k("get", "csr", user, "-o", "json").stdout)["status"].get("certificate"),
          "the signer to issue the certificate")
    obj = json.loads(k("get", "csr", user, "-o", "json").stdout)
    assert obj["spec"]["username"] == "system:admin"
    assert "Approved,Issued" in k("get", "csr", user).stdout
    cert = tmp_path / "alice.crt"
    cert.write_bytes(base64.b64decode(obj["status"]["certificate"]))
    alice = tmp_path / "alice.kubeconfig"
    alice.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "alice",
        "clusters": [{"name": "c", "cluster": {"server": shared_apiserver.url,
                                               "certificate-authority": str(shared_apiserver.ca_file)}}],
        "users": [{"name": "alice", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "alice", "context": {"cluster": "c", "user": "alice"}}]}))
    env = shared_apiserver.tool_env()
    kubectl = str(testing.tool_path("kubectl"))
    whoami = subprocess.run([kubectl, "--kubeconfig", str(alice), "auth", "whoami", "-o", "json"], env=env,
                            capture_output=True, text=True)
    assert whoami.returncode == 0, whoami.stderr
    info = json.loads(whoami.stdout)["status"]["userInfo"]
    assert info["username"] == user and "devs" in info["groups"]
    denied = subprocess.run([kubectl, "--kubeconfig", str(alice), "get", "secrets", "-n", "default"], env=env,
                            capture_output=True, text=True)
    assert denied.returncode != 0 and "forbidden" in denied.stderr


def test_no_superuser_certificates_through_the_api(shared_apiserver: testing.ApiServerProcess,
                                                   tmp_path: Path) -> None:
    csr = tmp_path / "root.csr"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(tmp_path / "root.key"), "-out", str(csr), "-subj",
                    "/CN=root/O=system:masters"], check=True, capture_output=True)
    manifest = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": "wants-root"}, "spec": {
                    "request": base64.b64encode(csr.read_bytes()).decode(),
                    "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"]}}
    refused = shared_apiserver.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert refused.returncode != 0
    assert ('certificatesigningrequests.certificates.k8s.io "wants-root" is forbidden: use of '
            "kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"
            ) in refused.stderr


def test_apply_prune_without_an_allowlist(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    """kubectl's default prune list names ReplicationControllers and every other core kind."""
    k = shared_apiserver.kubectl
    both = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: keep, labels: {app: pruned}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: drop, labels: {app: pruned}}
"""
    k("apply", "-n", namespace, "-f", "-", input=both)
    one = both.split("---")[0]
    out = k("apply", "-n", namespace, "--prune", "-l", "app=pruned", "-f", "-", input=one).stdout
    assert "configmap/drop pruned" in out
    assert k("get", "-n", namespace, "configmap", "-l", "app=pruned", "-o", "name").stdout.split() == \
        ["configmap/keep"]


def test_cluster_info_dump(shared_apiserver: testing.ApiServerProcess, namespace: str,
                           tmp_path: Path) -> None:
    k = shared_apiserver.kubectl
    k("create", "configmap", "dumped", "-n", namespace)
    k("cluster-info", "dump", "--namespaces", namespace, "--output-directory", str(tmp_path / "dump"))
    assert (tmp_path / "dump" / "nodes.json").exists()
    assert (tmp_path / "dump" / namespace / "replication-controllers.json").exists()


def test_replication_controller_and_component_statuses(shared_apiserver: testing.ApiServerProcess,
                                                       namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input="""\
apiVersion: v1
kind: ReplicationController
metadata: {name: old}
spec:
  replicas: 2
  template:
    metadata: {labels: {app: old}}
    spec:
      containers: [{name: c, image: nginx}]
""")
    rc = json.loads(k("get", "-n", namespace, "rc", "old", "-o", "json").stdout)
    assert rc["spec"]["selector"] == {"app": "old"} and rc["metadata"]["labels"] == {"app": "old"}
    _wait(lambda: len(json.loads(k("get", "-n", namespace, "pods", "-l", "app=old", "-o", "json").stdout)
                      ["items"]) == 2, "the replication controller's pods")
    k("scale", "-n", namespace, "rc", "old", "--replicas=1")
    _wait(lambda: len([p for p in json.loads(k("get", "-n", namespace, "pods", "-l", "app=old", "-o",
                                                "json").stdout)["items"]
                       if not p["metadata"].get("deletionTimestamp")]) == 1, "scaling down")
    cs = k("get", "componentstatuses")
    assert cs.stdout.split()[:4] == ["NAME", "STATUS", "MESSAGE", "ERROR"]
    assert "etcd-0" in cs.stdout and "Healthy" in cs.stdout
    assert "v1 ComponentStatus is deprecated in v1.19+" in cs.stderr


def test_token_review_is_served(shared_apiserver: testing.ApiServerProcess) -> None:
    # kubectl validates a create-only kind from /openapi/v2 in protobuf.
    out = shared_apiserver.kubectl("create", "-o", "json", "-f", "-", input=json.dumps({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}}))
    review = json.loads(out.stdout)
    assert review["kind"] == "TokenReview" and not review["status"].get("authenticated")


def _wait(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if callable(condition) and condition():
                return
        except (subprocess.CalledProcessError, KeyError, IndexError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_stored_kinds_are_validated_with_upstreams_words(shared_apiserver: testing.ApiServerProcess,
                                                         namespace: str) -> None:
    """Kinds this server stores without running them still refuse what upstream refuses."""
    name = f"v-{uuid.uuid4().hex[:6]}"
    cases = [
        ({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name, "namespace": namespace},
          "template": {"spec": {"containers": []}}},
         f'The PodTemplate "{name}" is invalid: template.spec.containers: Required value'),
        ({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
          "metadata": {"name": name},
          "webhooks": [{"name": "bad", "clientConfig": {"url": "https://127.0.0.1:1/"}, "sideEffects": "None",
                        "admissionReviewVersions": ["v1"]}]},
         'webhooks[0].name: Invalid value: "bad": should be a domain with at least three segments '
         "separated by dots"),
        ({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
          "spec": {"priorityLevelConfiguration": {"name": "global-default"}, "matchingPrecedence": 20000}},
         "spec.matchingPrecedence: Invalid value: 20000: must not be greater than 10000"),
        ({"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
          "spec": {"priorityLevelConfiguration": {"name": "global-default"}, "matchingPrecedence": 1}},
         "spec.matchingPrecedence: Invalid value: 1: only the schema named 'exempt' may have "
         "matchingPrecedence 1"),
        ({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
          "metadata": {"name": name}, "spec": {}},
         "spec.validations: Required value: validations or auditAnnotations must contain at least one item"),
        ({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": name},
          "spec": {}},
         f'The IngressClass "{name}" is invalid: spec.controller: Required value'),
    ]
    for manifest, message in cases:
        refused = shared_apiserver.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
        assert refused.returncode == 1, manifest
        assert message in refused.stderr, refused.stderr
