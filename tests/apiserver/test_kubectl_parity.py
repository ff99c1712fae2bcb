"""What real clients notice: the cases where kubectl 1.37 behaved differently against this
server than against a 1.37 cluster, each driven through the real kubectl.

Each test keeps to its own namespace on the shared server unless it changes cluster-wide state.
"""

from __future__ import annotations

import json
import time

from socialweb_computer import testing

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: app
          image: nginx:1.27
"""


def _listable(server: testing.ApiServerProcess) -> list[str]:
    out = server.kubectl("api-resources", "--verbs=list", "-o", "name").stdout
    return [line for line in out.split() if line]


def test_sort_by_works_for_every_listable_kind(shared_apiserver: testing.ApiServerProcess,
                                               namespace: str) -> None:
    """`--sort-by` asks for a Table with whole row objects; kubectl decodes each by its kind and
    apiVersion, so objects the server wrote itself (pods of a ReplicaSet, namespaces, events,
    system PriorityClasses) must carry them too."""
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)
    k("rollout", "status", "-n", namespace, "deployment/web", "--timeout=5s", check=False)
    for resource in _listable(shared_apiserver):
        plain = k("get", resource, "-A", "--no-headers", check=False)
        sorted_out = k("get", resource, "-A", "--no-headers", "--sort-by=.metadata.creationTimestamp",
                       check=False)
        assert sorted_out.returncode == plain.returncode, (resource, sorted_out.stderr)
        assert "<unknown>" not in sorted_out.stdout or "<unknown>" in plain.stdout, resource
        # Ages may tick over between the two calls: compare the shape of the tables (a table kubectl
        # could not decode has only NAME and AGE).
        assert _shape(sorted_out.stdout) == _shape(plain.stdout), resource


def _shape(table: str) -> list[int]:
    return sorted(len(line.split()) for line in table.splitlines())


def test_every_returned_object_carries_its_type(shared_apiserver: testing.ApiServerProcess,
                                                namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)
    for path in (f"/api/v1/namespaces/{namespace}/pods", "/api/v1/namespaces",
                 f"/apis/apps/v1/namespaces/{namespace}/replicasets",
                 "/apis/scheduling.k8s.io/v1/priorityclasses"):
        listed = json.loads(k("get", "--raw", path).stdout)
        assert listed["items"], path
        for item in listed["items"]:
            assert item["kind"] == listed["kind"].removesuffix("List"), path
            assert item["apiVersion"] == listed["apiVersion"], path


UNCHANGED = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: plain
  labels: {}
  annotations: {}
data: {}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: empty-maps
  annotations: {}
spec:
  selector:
    matchLabels: {app: empty-maps}
  template:
    metadata:
      labels: {app: empty-maps}
      annotations: {}
    spec:
      nodeSelector: {}
      containers:
        - name: app
          image: nginx:1.27
          env: []
          ports: []
"""


def test_diff_of_an_unchanged_object_exits_zero(shared_apiserver: testing.ApiServerProcess,
                                                namespace: str) -> None:
    """Empty maps and lists are omitted as Go's omitempty omits them, so what `kubectl diff` sends
    (a dry-run of the same manifest) matches what is stored."""
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=UNCHANGED)
    cm = json.loads(k("get", "-n", namespace, "configmap", "plain", "-o", "json").stdout)
    assert "labels" not in cm["metadata"] and "data" not in cm
    diff = k("diff", "-n", namespace, "-f", "-", input=UNCHANGED, check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert k("diff", "--server-side", "-n", namespace, "-f", "-", input=UNCHANGED,
             check=False).returncode == 0


def test_defaults_fill_empty_structs(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "deployment", "web", "-n", namespace, "--image=nginx:1.27")  # sends `strategy: {}`
    deployment = json.loads(k("get", "-n", namespace, "deployment", "web", "-o", "json").stdout)
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    k("create", "service", "nodeport", "np", "-n", namespace, "--tcp=80:8080")
    k("create", "service", "loadbalancer", "lb", "-n", namespace, "--tcp=80:8080")
    for name in ("np", "lb"):
        service = json.loads(k("get", "-n", namespace, "service", name, "-o", "json").stdout)
        assert service["spec"]["externalTrafficPolicy"] == "Cluster", name
    lb = json.loads(k("get", "-n", namespace, "service", "lb", "-o", "json").stdout)
    assert lb["spec"]["allocateLoadBalancerNodePorts"] is True


def test_watch_list_without_a_resource_version(shared_apiserver: testing.ApiServerProcess,
                                               namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "configmap", "one", "-n", namespace)
    out = k("get", "--raw", f"/api/v1/namespaces/{namespace}/configmaps?watch=1&sendInitialEvents=true"
            "&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1").stdout
    events = [json.loads(line) for line in out.splitlines()]
    types = [e["type"] for e in events]
    end = types.index("BOOKMARK")
    assert end >= 1 and set(types[:end]) == {"ADDED"}  # the namespace's configmaps, then the mark
    assert "one" in [e["object"]["metadata"]["name"] for e in events[:end]]
    assert events[end]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    refused = k("get", "--raw", f"/api/v1/namespaces/{namespace}/configmaps?watch=1"
                "&resourceVersionMatch=NotOlderThan&resourceVersion=1", check=False)
    assert ("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
            in refused.stderr)


def test_messages_print_values_as_go_does(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)
    moved = DEPLOYMENT.replace("matchLabels: {app: web}", "matchLabels: {app: other}").replace(
        "labels: {app: web}", "labels: {app: other}")
    refused = k("apply", "-n", namespace, "-f", "-", input=moved, check=False)
    assert ('spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"app":"other"}, '
            "MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable") in refused.stderr
    mismatched = DEPLOYMENT.replace("name: web", "name: web2").replace("      labels: {app: web}",
                                                                      "      labels: {app: x}")
    refused = k("apply", "-n", namespace, "-f", "-", input=mismatched, check=False)
    assert ('spec.template.metadata.labels: Invalid value: map[string]string{"app":"x"}: `selector` does not '
            "match template `labels`") in refused.stderr
    k("create", "service", "clusterip", "svc", "-n", namespace, "--tcp=80:8080")
    refused = k("patch", "-n", namespace, "service", "svc", "-p", '{"spec":{"clusterIP":"10.96.0.99"}}',
                check=False)
    assert 'spec.clusterIPs[0]: Invalid value: "10.96.0.99": may not change once set' in refused.stderr


def test_verbose_health_checks_list_each_check(shared_apiserver: testing.ApiServerProcess) -> None:
    k = shared_apiserver.kubectl
    ready = k("get", "--raw", "/readyz?verbose").stdout
    assert "[+]ping ok" in ready and "[+]etcd ok" in ready and "[+]shutdown ok" in ready
    assert ready.endswith("readyz check passed\n")
    assert k("get", "--raw", "/livez?verbose&exclude=etcd").stdout.splitlines()[-1] == "livez check passed"
    assert "[+]etcd" not in k("get", "--raw", "/livez?verbose&exclude=etcd").stdout
    assert k("get", "--raw", "/healthz/etcd").stdout == "ok"
    assert k("get", "--raw", "/healthz").stdout == "ok"
    assert k("get", "--raw", "/healthz/nonsense", check=False).returncode != 0


def test_terminating_namespace_reports_what_remains(shared_apiserver: testing.ApiServerProcess,
                                                    namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input="""\
apiVersion: v1
kind: ConfigMap
metadata:
  name: held
  finalizers: [example.com/hold]
""")
    k("delete", "namespace", namespace, "--wait=false")
    deadline = time.monotonic() + 30
    while True:
        ns = json.loads(k("get", "namespace", namespace, "-o", "json").stdout)
        conditions = {c["type"]: c for c in ns["status"].get("conditions") or []}
        if "NamespaceContentRemaining" in conditions or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ns["status"]["phase"] == "Terminating"
    remaining = conditions["NamespaceContentRemaining"]
    assert (remaining["status"], remaining["reason"]) == ("True", "SomeResourcesRemain")
    assert remaining["message"] == "Some resources are remaining: configmaps. has 1 resource instances"
    finalizers = conditions["NamespaceFinalizersRemaining"]
    assert finalizers["message"] == ("Some content in the namespace has finalizers remaining: "
                                     "example.com/hold in 1 resource instances")
    assert conditions["NamespaceDeletionContentFailure"]["reason"] == "ContentDeleted"
    k("patch", "-n", namespace, "configmap", "held", "--type=json",
      "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    k("wait", "--for=delete", f"namespace/{namespace}", "--timeout=30s")


def test_system_priority_classes_cannot_be_deleted(shared_apiserver: testing.ApiServerProcess) -> None:
    refused = shared_apiserver.kubectl("delete", "priorityclass", "system-node-critical", check=False)
    assert refused.returncode != 0
    assert ('priorityclasses.scheduling.k8s.io "system-node-critical" is forbidden: this is a system '
            "priority class and cannot be deleted") in refused.stderr
