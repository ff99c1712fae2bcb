"""What real clients notice: the cases where kubectl 1.37 behaved differently against this
server than against a 1.37 cluster, each driven through the real kubectl.

Each test keeps to its own namespace on the shared server unless it changes cluster-wide state.
"""

from __future__ import annotations

import json

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
