"""Built-in objects checked the way their Go types decode them (apiserver.typecheck), and the
per-field rules of upstream validation (strategies.fields, strategies.cron): the messages
clients see, checked directly."""

from __future__ import annotations

import pytest

from socialweb_computer.apiserver import typecheck
from socialweb_computer.apiserver.strategies import cron, fields

POD = "io.k8s.api.core.v1.Pod"
DEPLOYMENT = "io.k8s.api.apps.v1.Deployment"
CONFIGMAP = "io.k8s.api.core.v1.ConfigMap"
SERVICE = "io.k8s.api.core.v1.Service"


def pod(**spec: object) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}], **spec}}


@pytest.mark.parametrize(("definition", "obj", "message"), [
    (CONFIGMAP, {"data": {"a": 1}},
     "json: cannot unmarshal number into Go struct field ConfigMap.data of type string"),
    (CONFIGMAP, {"data": "x"},
     "json: cannot unmarshal string into Go struct field ConfigMap.data of type map[string]string"),
    (POD, pod(readinessGates=[1]),
     "json: cannot unmarshal number into Go struct field PodSpec.spec.readinessGates of type "
     "v1.PodReadinessGate"),
    (DEPLOYMENT, {"spec": {"replicas": "x"}},
     "json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"),
    (DEPLOYMENT, {"spec": {"replicas": 9223372036854775808}},
     "json: cannot unmarshal number 9223372036854775808 into Go struct field DeploymentSpec.spec.replicas "
     "of type int32"),
    (DEPLOYMENT, {"spec": {"replicas": 2147483648}},
     "json: cannot unmarshal number 2147483648 into Go struct field DeploymentSpec.spec.replicas "
     "of type int32"),
    (DEPLOYMENT, {"spec": {"replicas": 1.5}},
     "json: cannot unmarshal number 1.5 into Go struct field DeploymentSpec.spec.replicas of type int32"),
    (SERVICE, {"spec": {"ports": [{"port": 80, "targetPort": True}]}},
     "json: cannot unmarshal bool into Go struct field ServicePort.spec.ports.targetPort of type int32"),
    (POD, {"spec": "x"}, "json: cannot unmarshal string into Go struct field Pod.spec of type v1.PodSpec"),
    (POD, {"metadata": {"labels": {"a": 1}}},
     "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"),
    (POD, pod(containers=[{"name": "c", "resources": {"limits": {"cpu": "1x"}}}]),
     "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
    ("io.k8s.api.core.v1.Secret", {"data": {"a": "!!"}}, "illegal base64 data at input byte 0"),
    (POD, {"metadata": {"creationTimestamp": "garbage"}},
     'parsing time "garbage" as "2006-01-02T15:04:05Z07:00": cannot parse "garbage" as "2006"'),
    ("io.k8s.api.rbac.v1.RoleBinding", {"subjects": ["oops"]},
     "json: cannot unmarshal string into Go struct field RoleBinding.subjects of type v1.Subject"),
    (POD, pod(hostNetwork="yes"),
     "json: cannot unmarshal string into Go struct field PodSpec.spec.hostNetwork of type bool"),
])
def test_the_first_type_error_in_gos_words(definition: str, obj: dict, message: str) -> None:
    assert typecheck.first_error(obj, definition) == message


@pytest.mark.parametrize("obj", [
    pod(),
    pod(containers=[{"name": "c", "image": "x", "resources": {"limits": {"cpu": 1, "memory": "1.5Gi"},
                                                            "requests": {"cpu": "500m", "memory": "1e3"}}}]),
    {"spec": {"ports": [{"port": 80, "targetPort": "http"}, {"port": 81, "targetPort": 8081}]}},
    {"spec": {"replicas": None, "template": None}},  # nulls are never type errors
    {"metadata": {"creationTimestamp": "2026-01-02T03:04:05Z", "annotations": {"a": "b"}}},
])
def test_well_typed_objects_pass(obj: dict) -> None:
    definition = SERVICE if "ports" in obj.get("spec", {}) else DEPLOYMENT if "replicas" in obj.get(
        "spec", {}) else POD
    assert typecheck.first_error(obj, definition) is None


def test_the_first_error_in_document_order_wins() -> None:
    obj = {"spec": {"hostNetwork": 1, "containers": "x"}}
    assert "PodSpec.spec.hostNetwork" in typecheck.first_error(obj, POD)  # type: ignore[operator]


def test_free_form_fields_take_anything() -> None:
    revision = {"data": {"anything": [1, {"x": True}]}, "revision": 1}
    assert typecheck.first_error(revision, "io.k8s.api.apps.v1.ControllerRevision") is None


def test_nulls_go_would_not_write_back_are_dropped() -> None:
    deployment = {"spec": {"replicas": None, "selector": None, "template": {"spec": {"containers": [
        {"name": "c", "image": None}]}}}}
    assert typecheck.first_error(deployment, DEPLOYMENT, drop_nulls=True) is None
    # replicas and image are omitempty; selector is a pointer without omitempty: Go writes null.
    assert deployment == {"spec": {"selector": None, "template": {"spec": {"containers": [{"name": "c"}]}}}}
    slice_ = {"endpoints": None, "ports": None, "addressType": "IPv4"}
    assert typecheck.first_error(slice_, "io.k8s.api.discovery.v1.EndpointSlice", drop_nulls=True) is None
    assert slice_ == {"endpoints": None, "ports": None, "addressType": "IPv4"}


def test_required_fields_of_the_desired_state() -> None:
    obj = {"spec": {"containers": [{"image": "x"}], "readinessGates": [{}],
                    "containers_ok": True}, "status": {"containerStatuses": [{}]}}
    assert typecheck.missing_required(obj, POD) == ["spec.containers[0].name",
                                                    "spec.readinessGates[0].conditionType"]
    # Booleans and numbers are their zero value when absent; an HTTP header may be empty.
    crd = {"spec": {"group": "g", "names": {"plural": "ws", "kind": "W"}, "scope": "Namespaced",
                    "versions": [{"name": "v1"}]}}
    assert typecheck.missing_required(
        crd, "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition") == []


@pytest.mark.parametrize(("obj", "definition", "expected"), [
    ({"spec": {"ports": [{"port": 70000}]}}, SERVICE,
     [("spec.ports[0].port", "Invalid value: 70000: must be between 1 and 65535, inclusive")]),
    ({"spec": {"ports": [{"port": 80, "targetPort": "Not_A_Name"}]}}, SERVICE,
     [("spec.ports[0].targetPort",
       'Invalid value: "Not_A_Name": must contain only alpha-numeric characters (a-z, 0-9), '
       "and hyphens (-)")]),
    ({"spec": {"ports": [{"port": 80}, {"port": 81}]}}, SERVICE,
     [("spec.ports[0].name", "Required value"), ("spec.ports[1].name", "Required value")]),
    ({"spec": {"ports": [{"port": 80, "protocol": "ICMP"}]}}, SERVICE,
     [("spec.ports[0].protocol", 'Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"')]),
    (pod(dnsPolicy="Weird"), POD,
     [("spec.dnsPolicy", 'Unsupported value: "Weird": supported values: "ClusterFirst", '
                         '"ClusterFirstWithHostNet", "Default", "None"')]),
    (pod(containers=[{"name": "c", "image": "x", "ports": [{"containerPort": 0}],
                      "volumeMounts": [{"name": "data", "mountPath": "/d"}]}]), POD,
     [("spec.containers[0].volumeMounts[0].name", 'Not found: "data"'),
      ("spec.containers[0].ports[0].containerPort",
       "Invalid value: 0: must be between 1 and 65535, inclusive")]),
    ({"spec": {"minReadySeconds": -1, "strategy": {"type": "Sideways"}, "selector": {}, "template": {}}},
     DEPLOYMENT,
     [("spec.minReadySeconds", "Invalid value: -1: must be greater than or equal to 0"),
      ("spec.strategy.type",
       'Unsupported value: "Sideways": supported values: "Recreate", "RollingUpdate"')]),
    ({"data": {"big": "x" * (1024 * 1024 + 1)}}, CONFIGMAP,
     [("data", "Too long: may not be more than 1048576 bytes")]),
])
def test_field_rules(obj: dict, definition: str, expected: list[tuple[str, str]]) -> None:
    assert [(c.field, c.message) for c in fields.causes(obj, definition)] == expected


@pytest.mark.parametrize(("schedule", "error"), [
    ("*/5 * * * *", None),
    ("0 3 * * mon-fri", None),
    ("@hourly", None),
    ("@every 1h30m", None),
    ("garbage", "expected exactly 5 fields, found 1: [garbage]"),
    ("61 * * * *", "end of range (61) above maximum (59): 61"),
    ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
    ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1"),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
    ("x * * * *", 'failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax'),
    ("@often", "unrecognized descriptor: @often"),
    ("", "empty spec string"),
])
def test_cron_schedules_parse_like_robfig_cron(schedule: str, error: str | None) -> None:
    assert cron.schedule_error(schedule) == error
