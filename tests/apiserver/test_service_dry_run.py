"""A dry-run Service create is told its ClusterIP but holds nothing: a real create may take it next."""

from __future__ import annotations

import json

from socialweb_computer import testing

SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  clusterIP: 10.96.77.77
  ports: [{{port: 80}}]
"""


def test_dry_run_holds_no_cluster_ip(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    dry = shared_apiserver.kubectl("-n", namespace, "create", "--dry-run=server", "-o", "json", "-f", "-",
                                   input=SERVICE.format(name="trial"))
    assert json.loads(dry.stdout)["spec"]["clusterIP"] == "10.96.77.77"
    shared_apiserver.kubectl("-n", namespace, "create", "-f", "-", input=SERVICE.format(name="real"))
    ip = shared_apiserver.kubectl("-n", namespace, "get", "service", "real",
                                  "-o", "jsonpath={.spec.clusterIP}")
    assert ip.stdout == "10.96.77.77"
