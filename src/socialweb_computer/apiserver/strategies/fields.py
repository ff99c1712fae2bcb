"""Per-field rules of upstream validation, as data: enums, ranges, port numbers and names.

Why: the built-in OpenAPI definitions say a port is an int32 and a restart policy a string,
but not that a port lies in 1-65535 or which policies exist; upstream's hand-written
validation (pkg/apis/*/validation) does, and clients see its messages (`spec.ports[0].port:
Invalid value: 70000: must be between 1 and 65535, inclusive`). The rules here are keyed by
the Go struct and its JSON field, so they apply wherever that struct appears (a Pod's
containers and a Deployment's template's containers alike) without a code path per kind.

Who calls it: `store.Store._validate` for every built-in kind, after the strategy's own
checks (a field the strategy already reported is not reported twice).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from socialweb_computer.api import gofmt
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver import schemas, typecheck

Check = Callable[[Any, str], list[Cause]]

CORE = "io.k8s.api.core.v1."
APPS = "io.k8s.api.apps.v1."
BATCH = "io.k8s.api.batch.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
INT32_MAX = 2**31 - 1


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return gofmt.quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {_shown(value)}: {detail}", path)


def one_of(*allowed: str) -> Check:
    """field.NotSupported for a set value outside `allowed` (empty means "unset": defaulted)."""
    listed = ", ".join(gofmt.quote(v) for v in sorted(allowed))

    def check(value: Any, path: str) -> list[Cause]:
        if not isinstance(value, str) or not value or value in allowed:
            return []
        return [Cause("FieldValueNotSupported", f"Unsupported value: {gofmt.quote(value)}: supported values: "
                                                f"{listed}", path)]
    return check


def invalid_unless(allowed: Iterable[str], detail: str) -> Check:
    values = frozenset(allowed)

    def check(value: Any, path: str) -> list[Cause]:
        if not isinstance(value, str) or not value or value in values:
            return []
        return [_invalid(path, value, detail)]
    return check


def between(low: int, high: int, *, zero_is_unset: bool = False) -> Check:
    """validation.InclusiveRangeError."""
    def check(value: Any, path: str) -> list[Cause]:
        if not isinstance(value, int) or isinstance(value, bool) or (zero_is_unset and value == 0):
            return []
        if low <= value <= high:
            return []
        return [_invalid(path, value, f"must be between {low} and {high}, inclusive")]
    return check


def non_negative(value: Any, path: str) -> list[Cause]:
    """ValidateNonnegativeField."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return [_invalid(path, value, "must be greater than or equal to 0")]
    return []


PORT = between(1, 65535)
OPTIONAL_PORT = between(1, 65535, zero_is_unset=True)
_PORT_NAME_CHARS = re.compile(r"^[-a-z0-9]+$")
_HAS_LETTER = re.compile(r"[a-z]")


def port_name_errors(name: str) -> list[str]:
    """validation.IsValidPortName (an IANA_SVC_NAME)."""
    problems = []
    if len(name) > 15:
        problems.append("must be no more than 15 characters")
    if not _PORT_NAME_CHARS.match(name):
        problems.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in name:
        problems.append("must not contain consecutive hyphens")
    if name and not _HAS_LETTER.search(name):
        problems.append("must contain at least one letter (a-z)")
    if name.startswith("-") or name.endswith("-"):
        problems.append("must not begin or end with a hyphen")
    return problems


def port_or_name(value: Any, path: str) -> list[Cause]:
    """An IntOrString naming a port: 1-65535, or an IANA service name."""
    if isinstance(value, str):
        return [_invalid(path, value, problem) for problem in port_name_errors(value)]
    return PORT(value, path)


def port_name(value: Any, path: str) -> list[Cause]:
    if not isinstance(value, str) or not value:
        return []
    return [_invalid(path, value, problem) for problem in port_name_errors(value)]


def int_or_percent(value: Any, path: str) -> list[Cause]:
    """maxSurge/maxUnavailable/minAvailable: a non-negative int, or a percentage."""
    if isinstance(value, str):
        if not re.fullmatch(r"[0-9]+%", value):
            return [_invalid(path, value, "a valid percent string must be a numeric string followed by an "
                                          "ending '%' (e.g. '1%',  or '93%', regex used for validation is "
                                          "'[0-9]+%')")]
        return []
    return non_negative(value, path)


PROTOCOLS = one_of("SCTP", "TCP", "UDP")
TAINT_EFFECTS = one_of("NoExecute", "NoSchedule", "PreferNoSchedule")

# (Go struct, JSON field) → the check upstream's validation applies to that field.
RULES: dict[tuple[str, str], Check] = {
    (CORE + "PodSpec", "dnsPolicy"): one_of("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"),
    (CORE + "PodSpec", "activeDeadlineSeconds"): between(1, INT32_MAX),
    (CORE + "Container", "imagePullPolicy"): one_of("Always", "IfNotPresent", "Never"),
    (CORE + "Container", "terminationMessagePolicy"): one_of("FallbackToLogsOnError", "File"),
    (CORE + "EphemeralContainer", "imagePullPolicy"): one_of("Always", "IfNotPresent", "Never"),
    (CORE + "ContainerPort", "containerPort"): PORT,
    (CORE + "ContainerPort", "hostPort"): OPTIONAL_PORT,
    (CORE + "ContainerPort", "protocol"): PROTOCOLS,
    (CORE + "ContainerPort", "name"): port_name,
    (CORE + "HTTPGetAction", "port"): port_or_name,
    (CORE + "HTTPGetAction", "scheme"): one_of("HTTP", "HTTPS"),
    (CORE + "TCPSocketAction", "port"): port_or_name,
    (CORE + "GRPCAction", "port"): PORT,
    (CORE + "Probe", "initialDelaySeconds"): non_negative,
    (CORE + "Probe", "timeoutSeconds"): non_negative,
    (CORE + "Probe", "periodSeconds"): non_negative,
    (CORE + "Probe", "successThreshold"): non_negative,
    (CORE + "Probe", "failureThreshold"): non_negative,
    (CORE + "Toleration", "operator"): one_of("Equal", "Exists"),
    (CORE + "Toleration", "effect"): TAINT_EFFECTS,
    (CORE + "Taint", "effect"): TAINT_EFFECTS,
    (CORE + "NodeSelectorRequirement", "operator"): one_of("DoesNotExist", "Exists", "Gt", "In", "Lt",
                                                           "NotIn"),
    (CORE + "TopologySpreadConstraint", "whenUnsatisfiable"): one_of("DoNotSchedule", "ScheduleAnyway"),
    (CORE + "ServicePort", "port"): PORT,
    (CORE + "ServicePort", "targetPort"): port_or_name,
    (CORE + "ServicePort", "nodePort"): OPTIONAL_PORT,
    (CORE + "ServicePort", "protocol"): PROTOCOLS,
    (CORE + "ServiceSpec", "sessionAffinity"): one_of("ClientIP", "None"),
    (CORE + "ServiceSpec", "externalTrafficPolicy"): one_of("Cluster", "Local"),
    (CORE + "ServiceSpec", "internalTrafficPolicy"): one_of("Cluster", "Local"),
    (CORE + "ServiceSpec", "ipFamilyPolicy"): one_of("PreferDualStack", "RequireDualStack", "SingleStack"),
    (META + "LabelSelectorRequirement", "operator"): invalid_unless(
        ("DoesNotExist", "Exists", "In", "NotIn"), "not a valid selector operator"),
    (APPS + "DeploymentSpec", "minReadySeconds"): non_negative,
    (APPS + "DeploymentSpec", "revisionHistoryLimit"): non_negative,
    (APPS + "DeploymentSpec", "progressDeadlineSeconds"): non_negative,
    (APPS + "DeploymentStrategy", "type"): one_of("Recreate", "RollingUpdate"),
    (APPS + "RollingUpdateDeployment", "maxSurge"): int_or_percent,
    (APPS + "RollingUpdateDeployment", "maxUnavailable"): int_or_percent,
    (APPS + "ReplicaSetSpec", "minReadySeconds"): non_negative,
    (APPS + "StatefulSetSpec", "minReadySeconds"): non_negative,
    (APPS + "StatefulSetSpec", "revisionHistoryLimit"): non_negative,
    (APPS + "StatefulSetSpec", "podManagementPolicy"): one_of("OrderedReady", "Parallel"),
    (APPS + "StatefulSetUpdateStrategy", "type"): one_of("OnDelete", "RollingUpdate"),
    (APPS + "RollingUpdateStatefulSetStrategy", "partition"): non_negative,
    (APPS + "RollingUpdateStatefulSetStrategy", "maxUnavailable"): int_or_percent,
    (APPS + "DaemonSetSpec", "minReadySeconds"): non_negative,
    (APPS + "DaemonSetSpec", "revisionHistoryLimit"): non_negative,
    (APPS + "DaemonSetUpdateStrategy", "type"): one_of("OnDelete", "RollingUpdate"),
    (APPS + "RollingUpdateDaemonSet", "maxSurge"): int_or_percent,
    (APPS + "RollingUpdateDaemonSet", "maxUnavailable"): int_or_percent,
    (BATCH + "CronJobSpec", "concurrencyPolicy"): one_of("Allow", "Forbid", "Replace"),
    (BATCH + "CronJobSpec", "startingDeadlineSeconds"): non_negative,
    (BATCH + "CronJobSpec", "successfulJobsHistoryLimit"): non_negative,
    (BATCH + "CronJobSpec", "failedJobsHistoryLimit"): non_negative,
    ("io.k8s.api.policy.v1.PodDisruptionBudgetSpec", "minAvailable"): int_or_percent,
    ("io.k8s.api.policy.v1.PodDisruptionBudgetSpec", "maxUnavailable"): int_or_percent,
}

# Structs with a rule that looks at several fields at once.
StructCheck = Callable[[dict[str, Any], str], list[Cause]]


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _service_ports(spec: dict[str, Any], path: str) -> list[Cause]:
    """ValidateService: every port needs a name once there are several; names are unique."""
    ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
    causes: list[Cause] = []
    seen: set[str] = set()
    for i, port in enumerate(ports):
        where = f"{_child(path, 'ports')}[{i}].name"
        name = port.get("name") or ""
        if len(ports) > 1 and not name:
            causes.append(Cause("FieldValueRequired", "Required value", where))
        elif name in seen:
            causes.append(Cause("FieldValueDuplicate", f"Duplicate value: {gofmt.quote(name)}", where))
        seen.add(name)
    if spec.get("type") == "ExternalName" and not spec.get("externalName"):
        causes.append(Cause("FieldValueRequired", "Required value", _child(path, "externalName")))
    return causes


def _pod_volumes(spec: dict[str, Any], path: str) -> list[Cause]:
    """Volume names are unique, and every volumeMount names one of them."""
    causes: list[Cause] = []
    names: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name") if isinstance(volume, dict) else None
        if isinstance(name, str) and name:
            if name in names:
                causes.append(Cause("FieldValueDuplicate", f"Duplicate value: {gofmt.quote(name)}",
                                    f"{_child(path, 'volumes')}[{i}].name"))
            names.add(name)
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            mounts = container.get("volumeMounts") if isinstance(container, dict) else None
            for j, mount in enumerate(mounts or []):
                name = mount.get("name") if isinstance(mount, dict) else None
                if isinstance(name, str) and name and name not in names:
                    causes.append(Cause("FieldValueNotFound", f"Not found: {gofmt.quote(name)}",
                                        f"{_child(path, group)}[{i}].volumeMounts[{j}].name"))
    return causes


def _data_size(base64_data: bool) -> StructCheck:
    """ConfigMaps and Secrets hold at most 1 MiB of data (ValidateConfigMap / ValidateSecret)."""
    def check(obj: dict[str, Any], path: str) -> list[Cause]:
        total = 0
        for key in ("data", "binaryData", "stringData"):
            encoded = key == "binaryData" or (key == "data" and base64_data)
            for k, v in (obj.get(key) or {}).items():
                if isinstance(v, str):
                    total += len(k) + (len(v) * 3 // 4 if encoded else len(v.encode()))
        if total > MAX_DATA_BYTES:
            return [Cause("FieldValueTooLong", f"Too long: may not be more than {MAX_DATA_BYTES} bytes",
                          _child(path, "data"))]
        return []
    return check


MAX_DATA_BYTES = 1024 * 1024


def _network_policy_port(port: dict[str, Any], path: str) -> list[Cause]:
    """ValidateNetworkPolicyPort: a port number (with an endPort not below it) or a port name."""
    number, end = port.get("port"), port.get("endPort")
    end_path = _child(path, "endPort")
    found: list[Cause] = []
    if isinstance(number, int) and not isinstance(number, bool):
        found.extend(PORT(number, _child(path, "port")))
        if isinstance(end, int):
            if end < number:
                found.append(_invalid(end_path, number, "must be greater than or equal to `port`"))
            found.extend(PORT(end, end_path))
    elif isinstance(number, str):
        if end is not None:
            found.append(_invalid(end_path, end, "may not be specified when `port` is non-numeric"))
        found.extend(_invalid(_child(path, "port"), number, problem) for problem in port_name_errors(number))
    elif end is not None:
        found.append(_invalid(end_path, end, "may not be specified when `port` is not specified"))
    return found


STRUCT_RULES: dict[str, StructCheck] = {
    CORE + "ServiceSpec": _service_ports,
    CORE + "PodSpec": _pod_volumes,
    CORE + "ConfigMap": _data_size(base64_data=False),
    CORE + "Secret": _data_size(base64_data=True),
    "io.k8s.api.networking.v1.NetworkPolicyPort": _network_policy_port,
}


def causes(obj: dict[str, Any], definition: str) -> list[Cause]:
    """Every rule's findings for `obj` (a built-in object of the type `definition` names): the
    required fields of its desired state (typecheck.missing_fields), then the rules above.
    One walk over the object's structs does both."""
    found: list[Cause] = []
    defs = schemas.definitions()
    for name, value, path in typecheck.structs(obj, definition, defs):
        found.extend(Cause("FieldValueRequired", "Required value", missing)
                     for missing in typecheck.missing_fields(name, value, path, defs))
        whole = STRUCT_RULES.get(name)
        if whole is not None:
            found.extend(whole(value, path))
        for key, item in value.items():
            rule = RULES.get((name, key))
            if rule is not None and item is not None:
                found.extend(rule(item, _child(path, key)))
    return found
