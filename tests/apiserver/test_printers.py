"""Server-side Tables: ages, the built-in printers' cells, custom-resource columns, the Table envelope,
Accept negotiation, and what the real kubectl prints from them."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, printers

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
KUBECTL = Path(__file__).parents[2] / ".tools/bin/kubectl"


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def kind(group: str, name: str) -> kinds.KindInfo:
    for info in kinds.BUILTIN_KINDS:
        if (info.group, info.kind) == (group, name):
            return info
    return kinds.KindInfo(group=group, version="v1", kind=name, plural=name.lower() + "s",
                          singular=name.lower(), namespaced=True)


def cells(group: str, name: str, obj: dict[str, Any]) -> list[Any]:
    table = printers.build_table(kind(group, name), [obj], now=NOW)
    return table["rows"][0]["cells"]


def meta(name: str, age: float = 300, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "default", "creationTimestamp": ago(age), **extra}


# --------------------------------------------------------------------------- ages


@pytest.mark.parametrize(("seconds", "text"), [
    (-2.5, "<invalid>"), (-1.5, "0s"), (0, "0s"), (59, "59s"), (119, "119s"), (120, "2m"), (125, "2m5s"),
    (599, "9m59s"), (600, "10m"), (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (3 * 3600 + 12 * 60, "3h12m"),
    (8 * 3600 - 1, "7h59m"), (8 * 3600, "8h"), (47 * 3600 + 3599, "47h"), (48 * 3600, "2d"),
    (49 * 3600, "2d1h"), (8 * 86400 - 1, "7d23h"), (8 * 86400, "8d"), (729 * 86400, "729d"),
    (730 * 86400, "2y"), (731 * 86400, "2y1d"), (8 * 365 * 86400, "8y"), (20 * 365 * 86400, "20y"),
])
def test_human_duration(seconds: float, text: str) -> None:
    assert printers.human_duration(seconds) == text


def test_since_handles_unset_and_fractional_times() -> None:
    assert printers.since(None, NOW) == "<unknown>"
    assert printers.since("2025-06-01T11:59:30.123456Z", NOW) == "29s"
    assert printers.since("2025-06-01T13:00:00+02:00", NOW) == "60m"


# --------------------------------------------------------------------------- pods


def pod(status: dict[str, Any], *, spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta("p", 300, **metadata),
            "spec": spec or {"containers": [{"name": "c", "image": "nginx"}]}, "status": status}


def running(name: str = "c", restarts: int = 0, finished: float | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"name": name, "ready": True, "restartCount": restarts,
                              "state": {"running": {"startedAt": ago(60)}}}
    if finished is not None:
        status["lastState"] = {"terminated": {"exitCode": 1, "finishedAt": ago(finished)}}
    return status


def container(state: dict[str, Any], restarts: int = 0, name: str = "c", **extra: Any) -> dict[str, Any]:
    return {"name": name, "ready": False, "restartCount": restarts, "state": state, **extra}


READY = [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}]
GATED = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
BACKOFF = container({"waiting": {"reason": "CrashLoopBackOff"}}, 3,
                    lastState={"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(30)}})
COMPLETED = container({"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ago(10)}})


@pytest.mark.parametrize(("status", "expected"), [
    ({"phase": "Pending"}, ["0/1", "Pending", "0"]),
    ({"phase": "Running", "conditions": READY, "containerStatuses": [running()]}, ["1/1", "Running", "0"]),
    ({"phase": "Running", "conditions": READY, "containerStatuses": [running(restarts=5, finished=120)]},
     ["1/1", "Running", "5 (2m ago)"]),
    ({"phase": "Running", "containerStatuses": [BACKOFF]}, ["0/1", "CrashLoopBackOff", "3 (30s ago)"]),
    ({"phase": "Pending", "containerStatuses": [container({"waiting": {"reason": "ContainerCreating"}})]},
     ["0/1", "ContainerCreating", "0"]),
    ({"phase": "Succeeded", "containerStatuses": [COMPLETED]}, ["0/1", "Completed", "0"]),
    ({"phase": "Failed", "containerStatuses": [container({"terminated": {"exitCode": 137}})]},
     ["0/1", "ExitCode:137", "0"]),
    ({"phase": "Failed", "containerStatuses": [container({"terminated": {"exitCode": 0, "signal": 9}})]},
     ["0/1", "Signal:9", "0"]),
    ({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}, ["0/1", "Evicted", "0"]),
    ({"phase": "Pending", "conditions": [GATED]}, ["0/1", "SchedulingGated", "0"]),
])
def test_pod_ready_status_restarts(status: dict[str, Any], expected: list[str]) -> None:
    assert cells("", "Pod", pod(status))[1:4] == expected


INIT_SPEC = {"initContainers": [{"name": "init", "image": "busybox"}],
             "containers": [{"name": "c", "image": "x"}]}
MAIN_WAITING = container({"waiting": {"reason": "PodInitializing"}})


@pytest.mark.parametrize(("state", "expected"), [
    ({"running": {}}, "Init:0/1"),
    ({"waiting": {"reason": "PodInitializing"}}, "Init:0/1"),
    ({"waiting": {"reason": "ErrImagePull"}}, "Init:ErrImagePull"),
    ({"terminated": {"exitCode": 1, "reason": "Error"}}, "Init:Error"),
    ({"terminated": {"exitCode": 3}}, "Init:ExitCode:3"),
    ({"terminated": {"exitCode": 3, "signal": 15}}, "Init:Signal:15"),
])
def test_pod_init_containers(state: dict[str, Any], expected: str) -> None:
    status = {"phase": "Pending", "initContainerStatuses": [container(state, name="init")],
              "containerStatuses": [MAIN_WAITING]}
    assert cells("", "Pod", pod(status, spec=INIT_SPEC))[2] == expected


def test_pod_init_done_then_running() -> None:
    done = container({"terminated": {"exitCode": 0}}, name="init")
    status = {"phase": "Running", "conditions": READY, "initContainerStatuses": [done],
              "containerStatuses": [running()]}
    assert cells("", "Pod", pod(status, spec=INIT_SPEC))[1:4] == ["1/1", "Running", "0"]


def test_pod_sidecar_counts_as_a_container() -> None:
    spec = {"initContainers": [{"name": "side", "image": "x", "restartPolicy": "Always"}],
            "containers": [{"name": "c", "image": "y"}]}
    side = container({"running": {}}, 1, name="side", ready=True, started=True,
                     lastState={"terminated": {"exitCode": 1, "finishedAt": ago(700)}})
    status = {"phase": "Running", "conditions": READY, "initContainerStatuses": [side],
              "containerStatuses": [running()]}
    assert cells("", "Pod", pod(status, spec=spec))[1:4] == ["2/2", "Running", "1 (11m ago)"]


def test_pod_terminating_and_node_lost() -> None:
    status = {"phase": "Running", "conditions": READY, "containerStatuses": [running()]}
    assert cells("", "Pod", pod(status, deletionTimestamp=ago(5)))[2] == "Terminating"
    done = {"phase": "Succeeded", "containerStatuses": [COMPLETED]}
    assert cells("", "Pod", pod(done, deletionTimestamp=ago(5)))[2] == "Completed"
    lost = {"phase": "Running", "reason": "NodeLost"}
    assert cells("", "Pod", pod(lost, deletionTimestamp=ago(5)))[2] == "Unknown"


def test_pod_completed_with_a_running_container_is_running_or_not_ready() -> None:
    spec = {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]}
    finished = container({"terminated": {"exitCode": 0, "reason": "Completed"}}, name="a")
    obj = pod({"phase": "Running", "conditions": READY, "containerStatuses": [finished, running("b")]},
              spec=spec)
    assert cells("", "Pod", obj)[1:3] == ["1/2", "Running"]
    obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert cells("", "Pod", obj)[1:3] == ["1/2", "NotReady"]


def test_pod_wide_cells_and_row_conditions() -> None:
    status = {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
              "conditions": [*READY, {"type": "example.com/lb", "status": "True"}],
              "containerStatuses": [running()]}
    spec = {"containers": [{"name": "c", "image": "x"}], "nodeName": "n1",
            "readinessGates": [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/other"}]}
    assert cells("", "Pod", pod(status, spec=spec)) == [
        "p", "1/1", "Running", "0", "5m", "10.0.0.5", "n1", "<none>", "1/2"]
    bare = printers.build_table(kind("", "Pod"), [pod({"phase": "Succeeded"})], now=NOW)["rows"][0]
    assert bare["cells"][5:] == ["<none>", "<none>", "<none>", "<none>"]
    assert bare["conditions"] == [{"type": "Completed", "status": "True", "reason": "Succeeded",
                                   "message": "The pod has completed successfully."}]


# --------------------------------------------------------------------------- workloads


def template(*containers: tuple[str, str], **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": n, "image": i} for n, i in containers], **spec}}


def test_deployment() -> None:
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web", 7200),
              "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                       "template": template(("nginx", "nginx:1.27"), ("side", "busybox"))},
              "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2, "replicas": 3}}
    assert cells("apps", "Deployment", deploy) == [
        "web", "2/3", 3, 2, "120m", "nginx,side", "nginx:1.27,busybox", "app=web"]
    assert [c["name"] for c in printers.columns_for(kind("apps", "Deployment"))] == [
        "Name", "Ready", "Up-to-date", "Available", "Age", "Containers", "Images", "Selector"]


def test_replicaset_statefulset_daemonset() -> None:
    tpl = template(("c", "img"), nodeSelector={"os": "linux"})
    selector = {"matchLabels": {"a": "b"}}
    rs = {"metadata": meta("rs"), "spec": {"replicas": 2, "selector": selector, "template": tpl},
          "status": {"replicas": 2, "readyReplicas": 1}}
    assert cells("apps", "ReplicaSet", rs) == ["rs", 2, 2, 1, "5m", "c", "img", "a=b"]
    sts = {"metadata": meta("db"), "spec": {"replicas": 3, "template": tpl}, "status": {"readyReplicas": 3}}
    assert cells("apps", "StatefulSet", sts) == ["db", "3/3", "5m", "c", "img"]
    ds = {"metadata": meta("ds"), "spec": {"selector": selector, "template": tpl},
          "status": {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1,
                     "updatedNumberScheduled": 2, "numberAvailable": 1}}
    assert cells("apps", "DaemonSet", ds) == ["ds", 2, 2, 1, 2, 1, "os=linux", "5m", "c", "img", "a=b"]


def job(conditions: list[str], *, start: float | None = None, end: float | None = None,
        **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"succeeded": 1 if "Complete" in conditions else 0,
                              "conditions": [{"type": c, "status": "True"} for c in conditions]}
    if start is not None:
        status["startTime"] = ago(start)
    if end is not None:
        status["completionTime"] = ago(end)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("pi", 600),
            "spec": {"template": template(("pi", "perl")),
                     "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}}, **spec},
            "status": status}


@pytest.mark.parametrize(("obj", "expected"), [
    (job(["SuccessCriteriaMet", "Complete"], start=300, end=290, completions=1, parallelism=1),
     ["Complete", "1/1", "10s"]),
    (job([], start=150, completions=1, parallelism=1), ["Running", "0/1", "2m30s"]),
    (job(["Suspended"], completions=3, parallelism=1), ["Suspended", "0/3", ""]),
    (job(["FailureTarget", "Failed"], start=100, end=40, completions=1), ["Failed", "0/1", "60s"]),
    (job(["FailureTarget"], start=100, completions=1), ["FailureTarget", "0/1", "100s"]),
    (job(["SuccessCriteriaMet"], start=100, completions=1), ["SuccessCriteriaMet", "0/1", "100s"]),
    (job([], start=30, parallelism=3), ["Running", "0/1 of 3", "30s"]),
    (job([], start=30), ["Running", "0/1", "30s"]),
])
def test_job_status_completions_duration(obj: dict[str, Any], expected: list[str]) -> None:
    row = cells("batch", "Job", obj)
    assert row[1:4] == expected
    assert row[4:] == ["10m", "pi", "perl", "batch.kubernetes.io/controller-uid=u"]


def test_terminating_job() -> None:
    obj = job([], start=30)
    obj["metadata"]["deletionTimestamp"] = ago(1)
    assert cells("batch", "Job", obj)[1] == "Terminating"


def test_cronjob_and_pdb() -> None:
    cj = {"metadata": meta("nightly"), "status": {"active": [{"name": "x"}]},
          "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template(("c", "i"))}}}}
    assert cells("batch", "CronJob", cj) == [
        "nightly", "0 3 * * *", "<none>", "<unset>", 1, "<none>", "5m", "c", "i", "<none>"]
    pdb = {"metadata": meta("pdb"), "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}}
    assert cells("policy", "PodDisruptionBudget", pdb) == ["pdb", "50%", "N/A", 1, "5m"]


# --------------------------------------------------------------------------- core kinds

DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
LB_STATUS = {"loadBalancer": {"ingress": [{"ip": "5.6.7.8"}, {"hostname": "lb.example.com"}]}}


@pytest.mark.parametrize(("spec", "status", "expected"), [
    ({"type": "ClusterIP", "clusterIPs": ["10.96.0.10"], "ports": DNS_PORTS, "selector": {"k8s-app": "dns"}},
     {}, ["ClusterIP", "10.96.0.10", "<none>", "53/UDP,53/TCP", "5m", "k8s-app=dns"]),
    ({"type": "NodePort", "clusterIPs": ["10.96.1.1"], "ports": [{"port": 80, "nodePort": 30080}]},
     {}, ["NodePort", "10.96.1.1", "<none>", "80:30080/TCP", "5m", "<none>"]),
    ({"type": "LoadBalancer", "clusterIPs": ["10.96.1.2"], "ports": [{"port": 443, "nodePort": 31443}]},
     {}, ["LoadBalancer", "10.96.1.2", "<pending>", "443:31443/TCP", "5m", "<none>"]),
    ({"type": "LoadBalancer", "clusterIPs": ["10.96.1.2"], "externalIPs": ["1.2.3.4"]}, LB_STATUS,
     ["LoadBalancer", "10.96.1.2", "5.6.7.8,lb.example.com,1.2.3.4", "<none>", "5m", "<none>"]),
    ({"type": "ExternalName", "externalName": "db.example.com"}, {},
     ["ExternalName", "<none>", "db.example.com", "<none>", "5m", "<none>"]),
    ({"type": "ClusterIP", "clusterIPs": ["None"], "externalIPs": ["1.1.1.1", "2.2.2.2"]}, {},
     ["ClusterIP", "None", "1.1.1.1,2.2.2.2", "<none>", "5m", "<none>"]),
])
def test_services(spec: dict[str, Any], status: dict[str, Any], expected: list[str]) -> None:
    assert cells("", "Service", {"metadata": meta("svc"), "spec": spec, "status": status})[1:] == expected


def test_node() -> None:
    labels = {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "worker",
              "node-role.kubernetes.io/": "ignored"}
    info = {"kubeletVersion": "v1.37.1", "osImage": "Debian GNU/Linux 12 (bookworm)",
            "kernelVersion": "6.1.0-18-amd64", "containerRuntimeVersion": ""}
    node = {"metadata": {"name": "n1", "creationTimestamp": ago(86400 * 3), "labels": labels},
            "spec": {"unschedulable": True},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "192.168.1.5"},
                                     {"type": "Hostname", "address": "n1"}],
                       "nodeInfo": info}}
    assert cells("", "Node", node) == [
        "n1", "Ready,SchedulingDisabled", "control-plane,worker", "3d", "v1.37.1", "192.168.1.5", "<none>",
        "Debian GNU/Linux 12 (bookworm)", "6.1.0-18-amd64", "<unknown>"]
    fresh = {"metadata": {"name": "n2", "creationTimestamp": ago(5)}, "status": {}}
    assert cells("", "Node", fresh)[1:3] == ["Unknown", "<none>"]
    not_ready = {"metadata": {"name": "n3"},
                 "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert cells("", "Node", not_ready)[1] == "NotReady"


def test_events_core_and_events_k8s_io() -> None:
    core = {"metadata": meta("web.17a", 120), "type": "Warning", "reason": "BackOff",
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{c}"},
            "message": "Back-off restarting failed container\n",
            "source": {"component": "kubelet", "host": "n1"},
            "firstTimestamp": ago(600), "lastTimestamp": ago(90), "count": 7}
    assert cells("", "Event", core) == [
        "90s", "Warning", "BackOff", "pod/web", "spec.containers{c}", "kubelet, n1",
        "Back-off restarting failed container", "10m", 7, "web.17a"]
    new = {"metadata": meta("x.1", 30), "type": "Normal", "reason": "Scheduled", "note": "assigned",
           "regarding": {"kind": "Pod", "name": "web"}, "eventTime": "2025-06-01T11:59:40.000000Z",
           "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-n1"}
    assert cells("events.k8s.io", "Event", new) == [
        "20s", "Normal", "Scheduled", "pod/web", "", "default-scheduler, default-scheduler-n1", "assigned",
        "20s", 1, "x.1"]
    series = dict(new, series={"count": 4, "lastObservedTime": "2025-06-01T11:59:55.000000Z"})
    assert cells("events.k8s.io", "Event", series)[0] == "5s"
    assert cells("events.k8s.io", "Event", series)[8] == 4
    no_name = {"metadata": meta("n.1"), "involvedObject": {"kind": "Node"}, "count": 1}
    assert cells("", "Event", no_name)[3] == "node"


def test_small_core_kinds() -> None:
    namespace = {"metadata": meta("ns", 90), "status": {"phase": "Active"}}
    assert cells("", "Namespace", namespace) == ["ns", "Active", "90s"]
    cm = {"metadata": meta("cm"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}
    assert cells("", "ConfigMap", cm) == ["cm", 3, "5m"]
    assert cells("", "ConfigMap", {"metadata": meta("empty")}) == ["empty", 0, "5m"]
    secret = {"metadata": meta("s"), "type": "Opaque", "data": {"k": "dg=="}}
    assert cells("", "Secret", secret) == ["s", "Opaque", 1, "5m"]
    assert cells("", "ServiceAccount", {"metadata": meta("default")}) == ["default", 0, "5m"]
    quota = {"metadata": meta("q"),
             "status": {"hard": {"pods": "10", "limits.cpu": "2", "requests.cpu": "1"},
                        "used": {"pods": "3", "limits.cpu": "500m"}}}
    assert cells("", "ResourceQuota", quota) == [
        "q", "pods: 3/10, requests.cpu: 0/1", "limits.cpu: 500m/2", "5m"]
    subset = {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]}
    eps = {"metadata": meta("svc"), "subsets": [subset]}
    assert cells("", "Endpoints", eps) == ["svc", "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more...", "5m"]
    assert cells("", "Endpoints", {"metadata": meta("none")})[1] == "<none>"


def test_pvc_and_pv() -> None:
    pending = {"metadata": meta("data"), "status": {"phase": "Pending"},
               "spec": {"storageClassName": "standard", "volumeMode": "Filesystem",
                        "resources": {"requests": {"storage": "1Gi"}}}}
    assert cells("", "PersistentVolumeClaim", pending) == [
        "data", "Pending", "", "", "", "standard", "<unset>", "5m", "Filesystem"]
    bound = {"metadata": meta("data"), "spec": {"volumeName": "pv-1", "storageClassName": "standard"},
             "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany", "ReadWriteOnce"]}}
    assert cells("", "PersistentVolumeClaim", bound)[1:5] == ["Bound", "pv-1", "1Gi", "RWO,RWX"]
    pv = {"metadata": {"name": "pv-1", "creationTimestamp": ago(300)}, "status": {"phase": "Bound"},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                   "persistentVolumeReclaimPolicy": "Delete",
                   "claimRef": {"namespace": "default", "name": "data"}}}
    assert cells("", "PersistentVolume", pv) == [
        "pv-1", "1Gi", "RWO", "Delete", "Bound", "default/data", "", "<unset>", "", "5m", "<unset>"]


def test_cluster_kinds() -> None:
    pc = {"metadata": {"name": "high", "creationTimestamp": ago(60)}, "value": 1000, "globalDefault": False,
          "preemptionPolicy": "PreemptLowerPriority"}
    assert cells("scheduling.k8s.io", "PriorityClass", pc) == [
        "high", 1000, False, "60s", "PreemptLowerPriority"]
    lease = {"metadata": meta("n1"), "spec": {"holderIdentity": "n1"}}
    assert cells("coordination.k8s.io", "Lease", lease) == ["n1", "n1", "5m"]
    assert cells("coordination.k8s.io", "Lease", {"metadata": meta("free"), "spec": {}}) == ["free", "", "5m"]
    binding = {"metadata": meta("rb"), "roleRef": {"kind": "ClusterRole", "name": "view"},
               "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "devs"},
                            {"kind": "ServiceAccount", "name": "ci", "namespace": "build"},
                            {"kind": "User", "name": "bob"}]}
    assert cells("rbac.authorization.k8s.io", "RoleBinding", binding) == [
        "rb", "ClusterRole/view", "5m", "alice, bob", "devs", "build/ci"]


def test_kinds_without_a_printer_get_name_and_created_at() -> None:
    role_kind = kind("rbac.authorization.k8s.io", "Role")
    role = {"metadata": {"name": "reader", "namespace": "default",
                         "creationTimestamp": "2025-05-01T10:20:30Z"}}
    table = printers.build_table(role_kind, [role], now=NOW)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Created At"]
    assert table["columnDefinitions"][1]["type"] == "date"
    assert table["rows"][0]["cells"] == ["reader", "2025-05-01T10:20:30Z"]
    limit = {"metadata": {"name": "l", "creationTimestamp": "2025-05-01T12:20:30+02:00"}}
    assert cells("", "LimitRange", limit) == ["l", "2025-05-01T10:20:30Z"]
    # Go's default convertor builds rows on a nil slice: an empty list is sent as null.
    assert printers.build_table(role_kind, [], now=NOW)["rows"] is None
    assert printers.build_table(kind("", "Pod"), [], now=NOW)["rows"] == []


def test_custom_resource_definitions_print_scope_versions_and_established() -> None:
    versions = [{"name": "v1beta1", "served": True, "storage": False},
                {"name": "v1", "served": True, "storage": True},
                {"name": "v1alpha1", "served": False, "storage": False}]
    crd = {"metadata": {"name": "widgets.example.com", "creationTimestamp": "2025-05-31T12:00:00Z"},
           "spec": {"group": "example.com", "scope": "Namespaced", "versions": versions,
                    "names": {"kind": "Widget", "shortNames": ["wd", "wdg"]}},
           "status": {"conditions": [{"type": "Established", "status": "True"}]}}
    assert cells("apiextensions.k8s.io", "CustomResourceDefinition", crd) == [
        "widgets.example.com", "Namespaced", "v1(storage),v1beta1", "2025-05-31T12:00:00Z", "example.com",
        "Widget", "wd,wdg", True]


# --------------------------------------------------------------------------- custom resources


WIDGET = kinds.KindInfo(
    group="example.com", version="v1", kind="Widget", plural="widgets", singular="widget", namespaced=True,
    custom=True, printer_columns=(
        kinds.PrinterColumn(name="Color", type="string", json_path=".spec.color"),
        kinds.PrinterColumn(name="Size", type="integer", json_path=".spec.size", description="How big"),
        kinds.PrinterColumn(name="Ratio", type="number", json_path=".spec.ratio", priority=1),
        kinds.PrinterColumn(name="Shiny", type="boolean", json_path=".spec.shiny"),
        kinds.PrinterColumn(name="Ready", type="string",
                            json_path='.status.conditions[?(@.type=="Ready")].status'),
        kinds.PrinterColumn(name="Tags", type="string", json_path=".spec.tags"),
        kinds.PrinterColumn(name="Seen", type="date", json_path=".status.lastSeen"),
        kinds.PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ))


def test_custom_resource_columns() -> None:
    definitions = printers.columns_for(WIDGET)
    assert definitions[0]["name"] == "Name" and definitions[0]["format"] == "name"
    assert definitions[1] == {
        "name": "Color", "type": "string", "format": "", "priority": 0,
        "description": "Custom resource definition column (in JSONPath format): .spec.color"}
    assert definitions[2]["description"] == "How big"
    assert definitions[3]["priority"] == 1
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta("w1", 3600),
              "spec": {"color": "red", "size": 3.0, "ratio": 2, "shiny": True, "tags": ["a", "b"]},
              "status": {"conditions": [{"type": "Ready", "status": "True"}], "lastSeen": ago(30)}}
    assert printers.build_table(WIDGET, [widget], now=NOW)["rows"][0]["cells"] == [
        "w1", "red", 3, 2.0, True, "True", '["a","b"]', "30s", "60m"]
    odd = {"metadata": meta("w2"), "spec": {"size": "big", "shiny": "yes", "color": 7},
           "status": {"lastSeen": "yesterday"}}
    assert printers.build_table(WIDGET, [odd], now=NOW)["rows"][0]["cells"] == [
        "w2", "7", None, None, None, None, None, "<invalid>", "5m"]


def test_custom_resource_without_columns_gets_age() -> None:
    for columns in (None, ()):
        info = dataclasses.replace(WIDGET, printer_columns=columns)
        table = printers.build_table(info, [{"metadata": meta("w")}], now=NOW)
        definitions = table["columnDefinitions"]
        assert [(c["name"], c["type"]) for c in definitions] == [("Name", "string"), ("Age", "date")]
        assert definitions[1]["description"].startswith("CreationTimestamp is a timestamp")
        assert table["rows"][0]["cells"] == ["w", "5m"]


# --------------------------------------------------------------------------- the Table envelope


def test_table_envelope_and_include_object() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"},
           "metadata": {"name": "cm", "namespace": "default", "resourceVersion": "42",
                        "creationTimestamp": ago(60), "labels": {"app": "x"}}}
    cm = kind("", "ConfigMap")
    table = printers.build_table(cm, [obj], now=NOW)
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {"resourceVersion": "42"}
    assert table["rows"][0]["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                          "metadata": obj["metadata"]}
    assert "conditions" not in table["rows"][0]
    assert printers.build_table(cm, [obj], include_object="Object", now=NOW)["rows"][0]["object"] == obj
    assert printers.build_table(cm, [obj], include_object="None", now=NOW)["rows"][0]["object"] is None
    list_meta = {"resourceVersion": "50", "continue": "tok", "remainingItemCount": 3}
    listed = printers.build_table(cm, [obj, obj], now=NOW, table_version="v1beta1", list_meta=list_meta)
    assert listed["apiVersion"] == "meta.k8s.io/v1beta1"
    assert listed["metadata"] == list_meta
    assert listed["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    assert printers.build_table(cm, [obj], now=NOW, list_meta={})["metadata"] == {}
    watch_event = printers.build_table(cm, [obj], now=NOW, no_headers=True)
    assert watch_event["columnDefinitions"] is None and len(watch_event["rows"]) == 1


def test_every_column_is_sent_with_all_fields() -> None:
    for definition in printers.columns_for(kind("", "Pod")):
        assert set(definition) == {"name", "type", "format", "description", "priority"}
    names = [(c["name"], c["priority"]) for c in printers.columns_for(kind("", "Pod"))]
    assert names == [("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0), ("IP", 1),
                     ("Node", 1), ("Nominated Node", 1), ("Readiness Gates", 1)]


def test_include_object_validation() -> None:
    assert printers.validate_include_object(None) == "Metadata"
    assert printers.validate_include_object("") == "Metadata"
    assert printers.validate_include_object("Object") == "Object"
    with pytest.raises(errors.StatusError) as caught:
        printers.validate_include_object("All")
    assert caught.value.code == 400
    assert caught.value.message == (
        'Unable to convert to Table as requested: includeObject: Unsupported value: "All": '
        'supported values: "", "Metadata", "None", "Object"')


TABLE_V1 = "application/json;as=Table;v=v1;g=meta.k8s.io"
TABLE_V1BETA1 = "application/json;as=Table;v=v1beta1;g=meta.k8s.io"


@pytest.mark.parametrize(("accept", "version"), [
    (f"{TABLE_V1},{TABLE_V1BETA1},application/json", "v1"),  # what kubectl sends
    (TABLE_V1BETA1, "v1beta1"),
    ("application/json; as=Table; v=v1; g=meta.k8s.io", "v1"),
    ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", None),
    (f"application/json;as=Table;v=v2;g=meta.k8s.io,{TABLE_V1}", "v1"),
    ("application/json", None),
    ("application/json, */*", None),
    (f"application/json,{TABLE_V1}", None),
    (f"application/json;q=0.5,{TABLE_V1}", "v1"),
    ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json", None),
    ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io", "v1"),
    ("", None),
])
def test_accept_negotiation(accept: str, version: str | None) -> None:
    assert printers.negotiate_table(accept) == version
    assert printers.parse_accept_table(accept) is (version is not None)


# --------------------------------------------------------------------------- what kubectl prints


DISCOVERY_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _resource(info: kinds.KindInfo) -> dict[str, Any]:
    return {"resource": info.plural, "singularResource": info.singular, "verbs": ["get", "list"],
            "scope": "Namespaced" if info.namespaced else "Cluster",
            "responseKind": {"group": info.group, "version": info.version, "kind": info.kind}}


def _discovery(infos: list[kinds.KindInfo], core: bool) -> dict[str, Any]:
    groups: dict[str, list[kinds.KindInfo]] = {}
    for info in infos:
        if (info.group == "") == core:
            groups.setdefault(info.group, []).append(info)
    items = [{"metadata": {"name": group},
              "versions": [{"version": "v1", "freshness": "Current",
                            "resources": [_resource(i) for i in members]}]}
             for group, members in groups.items()]
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
            "items": items}


class FakeCluster:
    """Just enough of an API server for `kubectl get`: aggregated discovery and Table lists."""

    def __init__(self, objects: dict[kinds.KindInfo, list[dict[str, Any]]]) -> None:
        self.objects = objects

    async def handle(self, request: web.Request) -> web.Response:
        infos = list(self.objects)
        if request.path in ("/api", "/apis"):
            body = _discovery(infos, core=request.path == "/api")
            return web.Response(body=orjson.dumps(body), headers={"Content-Type": DISCOVERY_TYPE})
        plural = request.path.rstrip("/").rsplit("/", 1)[-1]
        info = next(i for i in infos if i.plural == plural)
        assert printers.parse_accept_table(request.headers.get("Accept", ""))
        table = printers.build_table(info, self.objects[info], now=NOW, list_meta={"resourceVersion": "9"})
        return web.Response(body=orjson.dumps(table), content_type="application/json")


async def kubectl(port: int, home: Path, *args: str) -> str:
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": os.devnull}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "-s", f"http://127.0.0.1:{port}", "--cache-dir", str(home / "cache"), *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _fake_objects() -> dict[kinds.KindInfo, list[dict[str, Any]]]:
    crash = pod({"phase": "Running", "containerStatuses": [BACKOFF]})
    crash["metadata"].update(name="crash", labels={"app": "crash"})
    web_pod = pod({"phase": "Running", "podIP": "10.0.0.5", "conditions": READY,
                   "containerStatuses": [running(restarts=5, finished=120)]},
                  spec={"containers": [{"name": "c", "image": "nginx"}], "nodeName": "n1"})
    web_pod["metadata"]["name"] = "web"
    deploy = {"metadata": meta("web", 7200),
              "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                       "template": template(("nginx", "nginx"))},
              "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}
    widget = {"metadata": meta("w1", 3600),
              "spec": {"color": "red", "size": 3, "ratio": 0.5, "shiny": True, "tags": ["a"]},
              "status": {"conditions": [{"type": "Ready", "status": "True"}], "lastSeen": ago(30)}}
    jobs = [job(["Complete"], start=300, end=290, completions=1), job(["Suspended"], completions=2)]
    jobs[1]["metadata"]["name"] = "later"
    return {kind("", "Pod"): [web_pod, crash], kind("apps", "Deployment"): [deploy],
            kind("batch", "Job"): jobs, WIDGET: [widget]}


@pytest.fixture
async def cluster_port() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", FakeCluster(_fake_objects()).handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    yield server.sockets[0].getsockname()[1]
    await runner.cleanup()


async def test_kubectl_prints_pods_like_a_real_cluster(cluster_port: int, tmp_path: Path) -> None:
    assert await kubectl(cluster_port, tmp_path, "get", "pods") == (
        "NAME    READY   STATUS             RESTARTS      AGE\n"
        "web     1/1     Running            5 (2m ago)    5m\n"
        "crash   0/1     CrashLoopBackOff   3 (30s ago)   5m\n")
    wide = await kubectl(cluster_port, tmp_path, "get", "pods", "-o", "wide")
    assert wide.splitlines() == [
        "NAME    READY   STATUS             RESTARTS      AGE   IP         NODE     NOMINATED NODE   "
        "READINESS GATES",
        "web     1/1     Running            5 (2m ago)    5m    10.0.0.5   n1       <none>           <none>",
        "crash   0/1     CrashLoopBackOff   3 (30s ago)   5m    <none>     <none>   <none>           <none>"]
    assert await kubectl(cluster_port, tmp_path, "get", "pods", "-A", "--show-labels", "--no-headers") == (
        "default   web     1/1   Running            5 (2m ago)    5m    <none>\n"
        "default   crash   0/1   CrashLoopBackOff   3 (30s ago)   5m    app=crash\n")


async def test_kubectl_prints_workloads_and_custom_resources(cluster_port: int, tmp_path: Path) -> None:
    assert await kubectl(cluster_port, tmp_path, "get", "deployments", "-o", "wide") == (
        "NAME   READY   UP-TO-DATE   AVAILABLE   AGE    CONTAINERS   IMAGES   SELECTOR\n"
        "web    2/3     3            2           120m   nginx        nginx    app=web\n")
    assert await kubectl(cluster_port, tmp_path, "get", "jobs") == (
        "NAME    STATUS      COMPLETIONS   DURATION   AGE\n"
        "pi      Complete    1/1           10s        10m\n"
        "later   Suspended   0/2                      10m\n")
    assert await kubectl(cluster_port, tmp_path, "get", "widgets") == (
        "NAME   COLOR   SIZE   SHINY   READY   TAGS    SEEN   AGE\n"
        'w1     red     3      true    True    ["a"]   30s    60m\n')
