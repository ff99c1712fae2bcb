"""What a kube-apiserver creates for itself, seen with kubectl: the local APIServices of every
served group-version (and of CRDs), and the bootstrap priority-and-fairness configuration.

The expected lists are upstream's (kube-apiserver's APIService priority table; k8s.io/apiserver
pkg/apis/flowcontrol/bootstrap), kept here as data.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from socialweb_computer import testing

# `kubectl get flowschemas` of a fresh 1.37 cluster: name → (priority level, precedence, method).
UPSTREAM_FLOW_SCHEMAS = {
    "exempt": ("exempt", 1, "<none>"),
    "probes": ("exempt", 2, "<none>"),
    "system-leader-election": ("leader-election", 100, "ByUser"),
    "system-node-high": ("node-high", 400, "ByUser"),
    "system-nodes": ("system", 500, "ByUser"),
    "kube-controller-manager": ("workload-high", 800, "ByNamespace"),
    "kube-scheduler": ("workload-high", 800, "ByNamespace"),
    "kube-system-service-accounts": ("workload-high", 900, "ByNamespace"),
    "service-accounts": ("workload-low", 9000, "ByUser"),
    "global-default": ("global-default", 9900, "ByUser"),
    "catch-all": ("catch-all", 10000, "ByUser"),
}
# `kubectl get prioritylevelconfigurations`: name → (type, shares, queues, hand size, queue length).
UPSTREAM_PRIORITY_LEVELS = {
    "catch-all": ("Limited", "5", "<none>", "<none>", "<none>"),
    "exempt": ("Exempt", "<none>", "<none>", "<none>", "<none>"),
    "global-default": ("Limited", "20", "128", "6", "50"),
    "leader-election": ("Limited", "10", "16", "4", "50"),
    "node-high": ("Limited", "40", "64", "6", "50"),
    "system": ("Limited", "30", "64", "6", "50"),
    "workload-high": ("Limited", "40", "128", "6", "50"),
    "workload-low": ("Limited", "100", "128", "6", "50"),
}


def _eventually(check: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _rows(server: testing.ApiServerProcess, *args: str) -> list[list[str]]:
    out = server.kubectl("get", *args, "--no-headers").stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def test_local_apiservices_for_every_served_group_version(shared_apiserver: testing.ApiServerProcess) -> None:
    def listed() -> dict[str, list[str]]:
        rows = {row[0]: row[1:] for row in _rows(shared_apiserver, "apiservices")}
        return rows if all(r[1] == "True" for r in rows.values()) and "v1." in rows else {}

    rows = _eventually(listed, "the local APIServices to be Available")
    assert isinstance(rows, dict)
    for name in (
        "v1.",
        "v1.apps",
        "v2.autoscaling",
        "v1.batch",
        "v1.flowcontrol.apiserver.k8s.io",
        "v1.resource.k8s.io",
        "v1.storage.k8s.io",
    ):
        assert rows[name][:2] == ["Local", "True"], name
    apps = json.loads(shared_apiserver.kubectl("get", "apiservice", "v1.apps", "-o", "json").stdout)
    assert apps["spec"] == {
        "group": "apps",
        "version": "v1",
        "groupPriorityMinimum": 17800,
        "versionPriority": 15,
    }
    assert apps["metadata"]["labels"] == {"kube-aggregator.kubernetes.io/automanaged": "onstart"}
    (available,) = apps["status"]["conditions"]
    assert (available["type"], available["reason"], available["message"]) == (
        "Available",
        "Local",
        "Local APIServices are always available",
    )
    # Every group-version discovery lists has one, except the aggregator's own group: upstream
    # registers the group-versions of the servers it delegates to, and apiregistration is not one.
    served = json.loads(shared_apiserver.kubectl("get", "--raw", "/apis").stdout)
    for group in served["groups"]:
        if group["name"] == "apiregistration.k8s.io":
            continue
        for version in group["versions"]:
            assert f"{version['version']}.{group['name']}" in rows, version


def test_a_crd_gets_an_apiservice_while_it_is_served(shared_apiserver: testing.ApiServerProcess) -> None:
    group = f"g{uuid.uuid4().hex[:6]}.example.com"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    shared_apiserver.kubectl("apply", "-f", "-", input=json.dumps(crd))
    name = f"v1.{group}"

    def apiservice() -> dict:
        out = shared_apiserver.kubectl("get", "apiservice", name, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    obj = _eventually(apiservice, "the CRD's APIService")
    assert isinstance(obj, dict)
    assert obj["spec"]["groupPriorityMinimum"] == 1000 and obj["spec"]["versionPriority"] == 100
    assert obj["metadata"]["labels"] == {"kube-aggregator.kubernetes.io/automanaged": "true"}
    shared_apiserver.kubectl("delete", "crd", f"gadgets.{group}")
    _eventually(lambda: not apiservice(), "the CRD's APIService to go")


def test_an_apiservice_naming_a_missing_service_is_not_available(
    shared_apiserver: testing.ApiServerProcess,
) -> None:
    group = f"g{uuid.uuid4().hex[:6]}.example.com"
    shared_apiserver.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": f"v1.{group}"},
                "spec": {
                    "group": group,
                    "version": "v1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 10,
                    "service": {"namespace": "default", "name": "nowhere"},
                    "insecureSkipTLSVerify": True,
                },
            }
        ),
    )

    def row() -> list[str]:
        found = [r for r in _rows(shared_apiserver, "apiservices") if r[0] == f"v1.{group}"]
        return found[0] if found and found[0][2] != "Unknown" else []

    assert _eventually(row, "the availability condition")[1:4] == [
        "default/nowhere",
        "False",
        "(ServiceNotFound)",
    ]
    shared_apiserver.kubectl("delete", "apiservice", f"v1.{group}")


def test_bootstrap_flow_schemas_and_priority_levels(shared_apiserver: testing.ApiServerProcess) -> None:
    def schemas() -> list[list[str]]:
        rows = _rows(shared_apiserver, "flowschemas")
        return rows if len(rows) >= len(UPSTREAM_FLOW_SCHEMAS) and all(r[-1] == "False" for r in rows) else []

    rows = _eventually(schemas, "the bootstrap FlowSchemas, none dangling")
    assert isinstance(rows, list)
    ours = [r for r in rows if r[0] in UPSTREAM_FLOW_SCHEMAS]
    assert [r[0] for r in ours] == list(UPSTREAM_FLOW_SCHEMAS)  # kubectl's order: by precedence
    for name, level, precedence, method, *_ in ours:
        assert (level, int(precedence), method) == UPSTREAM_FLOW_SCHEMAS[name]
    levels = {r[0]: tuple(r[1:6]) for r in _rows(shared_apiserver, "prioritylevelconfigurations")}
    assert {k: levels[k] for k in UPSTREAM_PRIORITY_LEVELS} == UPSTREAM_PRIORITY_LEVELS
    exempt = json.loads(shared_apiserver.kubectl("get", "flowschema", "exempt", "-o", "json").stdout)
    assert exempt["metadata"]["annotations"] == {"apf.kubernetes.io/autoupdate-spec": "true"}
    (dangling,) = exempt["status"]["conditions"]
    assert (dangling["type"], dangling["status"], dangling["reason"], dangling["message"]) == (
        "Dangling",
        "False",
        "Found",
        'This FlowSchema references the PriorityLevelConfiguration object named "exempt" and it exists',
    )


def test_a_dangling_flow_schema_and_mandatory_objects_come_back(
    shared_apiserver: testing.ApiServerProcess,
) -> None:
    name = f"fs-{uuid.uuid4().hex[:6]}"
    shared_apiserver.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": name},
                "spec": {
                    "priorityLevelConfiguration": {"name": "no-such-level"},
                    "matchingPrecedence": 5000,
                    "rules": [
                        {
                            "subjects": [{"kind": "Group", "group": {"name": "devs"}}],
                            "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/version"]}],
                        }
                    ],
                },
            }
        ),
    )

    def condition() -> dict:
        obj = json.loads(shared_apiserver.kubectl("get", "flowschema", name, "-o", "json").stdout)
        return next(
            (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Dangling"), {}
        )

    cond = _eventually(condition, "the Dangling condition")
    assert isinstance(cond, dict)
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True",
        "NotFound",
        'This FlowSchema references the PriorityLevelConfiguration object named "no-such-level" but there is '
        "no such object",
    )
    shared_apiserver.kubectl("delete", "flowschema", name)
    shared_apiserver.kubectl("delete", "flowschema", "catch-all")
    _eventually(
        lambda: shared_apiserver.kubectl("get", "flowschema", "catch-all", check=False).returncode == 0,
        "the mandatory catch-all FlowSchema to be recreated",
    )
