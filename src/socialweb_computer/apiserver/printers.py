"""Server-side Tables: what `kubectl get` prints, computed the way kube-apiserver computes it.

Why it exists: kubectl asks for `application/json;as=Table;v=v1;g=meta.k8s.io` and prints the
columns and cells the server sends, so every column name, cell string and age here is what a
user sees. The rules follow kubernetes' `pkg/printers/internalversion` (built-in kinds, with
`Wide: true`: the server always sends every column and kubectl hides priority > 0 ones), the
apiextensions table convertors (CustomResourceDefinitions themselves, and custom resources
through `additionalPrinterColumns`), and `rest.defaultTableConvertor` (Name, Created At) for
kinds without a printer.

Who calls it: the resource handlers (`parse_accept_table`, `negotiate_table`, `build_table`,
`validate_include_object`) and anything that needs Kubernetes' age strings (`human_duration`).

Columns are data: `TABLES` maps (group, kind) to a `Printer`, a tuple of `Column`s, each with its
definition and a cell function. `build_table` never branches on kind.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import jsonpath, kinds, schemas, selectors

log = logging.getLogger(__name__)

Object = dict[str, Any]

# --------------------------------------------------------------------------- time


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: about 2-3 significant figures ("5m", "3h12m", "2y41d")."""
    whole = math.trunc(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 60 * 2:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if rest == 0 else f"{hours // 24 // 365}y{rest}d"
    return f"{hours // 24 // 365}y"


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (metav1.Time or MicroTime) as an aware datetime; None when unset.

    Raises ValueError for a string that is not RFC 3339.
    """
    if value is None or value == "" or value == "null":
        return None
    if not isinstance(value, str) or len(value) < 20 or value[10] != "T":
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    return moment


def since(value: Any, now: datetime) -> str:
    """translateTimestampSince: the age of a timestamp, `<unknown>` when it is unset."""
    try:
        moment = parse_time(value)
    except ValueError:
        moment = None
    if moment is None:
        return "<unknown>"
    return human_duration((now - moment).total_seconds())


def _rfc3339(value: Any) -> str:
    """Time.UTC().Format(time.RFC3339); the zero time for an unset timestamp."""
    try:
        moment = parse_time(value)
    except ValueError:
        moment = None
    if moment is None:
        return "0001-01-01T00:00:00Z"
    m = moment.astimezone(UTC)
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}Z"


# --------------------------------------------------------------------------- rows and columns

NAME_DOC = ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "name")
CREATED_DOC = ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "creationTimestamp")


@functools.cache
def _doc(definition: str, prop: str) -> str:
    """A field's description, as the Go types' SwaggerDoc() gives it (same source as OpenAPI)."""
    schema = schemas.definitions().get(definition) or {}
    field = (schema.get("properties") or {}).get(prop) or {}
    return str(field.get("description") or "")


@dataclasses.dataclass
class Row:
    """One object being printed, with the clock and a scratch memo for cells that share work."""

    obj: Object
    now: datetime
    memo: dict[str, Any] = dataclasses.field(default_factory=dict)

    def get(self, *path: str | int, default: Any = None) -> Any:
        value: Any = self.obj
        for key in path:
            if isinstance(key, int):
                if not isinstance(value, list) or key >= len(value):
                    return default
            elif not isinstance(value, Mapping):
                return default
            value = value[key] if isinstance(key, int) else value.get(key)
            if value is None:
                return default
        return value

    def text(self, *path: str | int) -> str:
        value = self.get(*path)
        return value if isinstance(value, str) else ""

    def int(self, *path: str | int, default: int = 0) -> int:
        value = self.get(*path)
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    def list(self, *path: str | int) -> list[Any]:
        value = self.get(*path)
        return value if isinstance(value, list) else []

    def map(self, *path: str | int) -> dict[str, Any]:
        value = self.get(*path)
        return value if isinstance(value, dict) else {}

    @property
    def name(self) -> str:
        return self.text("metadata", "name")

    @property
    def age(self) -> str:
        return since(self.get("metadata", "creationTimestamp"), self.now)

    def age_of(self, *path: str | int) -> str:
        return since(self.get(*path), self.now)


Cell = Callable[[Row], Any]
Doc = str | tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Column:
    """A column definition as the server sends it, plus how to compute its cell."""

    name: str
    cell: Cell
    type: str = "string"
    format: str = ""
    description: Doc = ""
    priority: int = 0

    def definition(self) -> dict[str, Any]:
        doc = self.description if isinstance(self.description, str) else _doc(*self.description)
        return {"name": self.name, "type": self.type, "format": self.format, "description": doc,
                "priority": self.priority}


@dataclasses.dataclass(frozen=True)
class Printer:
    """A kind's table: columns, optional row conditions, optional list order."""

    columns: tuple[Column, ...]
    conditions: Callable[[Row], list[dict[str, str]]] | None = None
    order: Callable[[list[Object]], list[Object]] | None = None
    # Go's default convertor appends rows to a nil slice (an empty list is `"rows": null`).
    rows_when_empty: list[Any] | None = dataclasses.field(default_factory=list)


NAME = Column("Name", lambda r: r.name, format="name", description=NAME_DOC)
AGE = Column("Age", lambda r: r.age, description=CREATED_DOC)


def _col(name: str, cell: Cell, doc: Doc = "", *, type: str = "string", priority: int = 0,
         format: str = "") -> Column:
    return Column(name, cell, type=type, format=format, description=doc, priority=priority)


def _wide(name: str, cell: Cell, doc: Doc = "", *, type: str = "string") -> Column:
    return _col(name, cell, doc, type=type, priority=1)


def _none(value: str) -> str:
    return value or "<none>"


def _unset(value: str) -> str:
    return value or "<unset>"


def _bool_ptr(value: Any) -> str:
    """printBoolPtr: "True"/"False", `<unset>` for a missing pointer."""
    if value is None:
        return "<unset>"
    return "True" if value else "False"


def _int_or_na(value: Any) -> str:
    """An optional IntOrString (PDB bounds): its String(), or N/A when unset."""
    if value is None:
        return "N/A"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _quantity(value: Any) -> str:
    """A resource.Quantity as stored (the server keeps quantities in canonical form)."""
    if value is None:
        return "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _containers(template_spec: Mapping[str, Any] | None) -> tuple[str, str]:
    """layoutContainerCells: container names and images, comma-joined."""
    containers = (template_spec or {}).get("containers") or []
    return (",".join(str(c.get("name", "")) for c in containers),
            ",".join(str(c.get("image", "")) for c in containers))


def _template_columns(*path: str, doc_selector: Doc | None = None,
                      selector: Cell | None = None) -> tuple[Column, ...]:
    """The wide Containers, Images (and Selector) columns of workload kinds."""
    cols = (
        _wide("Containers", lambda r: _containers(r.map(*path))[0],
              "Names of each container in the template."),
        _wide("Images", lambda r: _containers(r.map(*path))[1],
              "Images referenced by each container in the template."),
    )
    if selector is None:
        return cols
    return (*cols, _wide("Selector", selector, doc_selector or ""))


def _label_selector_cell(*path: str) -> Cell:
    return lambda r: selectors.format_label_selector(r.get(*path))


def _condition_true(row: Row, kind: str, *path: str) -> bool:
    for cond in row.list(*path):
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond.get("status") == "True"
    return False


def _core(kind: str, prop: str) -> tuple[str, str]:
    return (f"io.k8s.api.core.v1.{kind}", prop)


def _api(group_version: str, kind: str, prop: str) -> tuple[str, str]:
    return (f"io.k8s.api.{group_version}.{kind}", prop)


# --------------------------------------------------------------------------- pods


def _restartable(container: Mapping[str, Any] | None) -> bool:
    """A sidecar: an init container with restartPolicy Always."""
    return isinstance(container, Mapping) and container.get("restartPolicy") == "Always"


def _finished(status: Mapping[str, Any]) -> datetime | None:
    terminated = ((status.get("lastState") or {}).get("terminated"))
    if not isinstance(terminated, Mapping):
        return None
    try:
        return parse_time(terminated.get("finishedAt"))
    except ValueError:
        return None


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if b is None:
        return a
    return b if a is None or a < b else a


def _terminated_reason(terminated: Mapping[str, Any], prefix: str = "") -> str:
    if terminated.get("reason"):
        return prefix + str(terminated["reason"])
    if terminated.get("signal"):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{terminated.get('exitCode') or 0}"


@dataclasses.dataclass
class PodSummary:
    ready: str
    status: str
    restarts: str


def pod_summary(row: Row) -> PodSummary:
    """printPod's READY, STATUS and RESTARTS, computed together as the real printer does."""
    cached = row.memo.get("pod")
    if isinstance(cached, PodSummary):
        return cached
    spec, status = row.map("spec"), row.map("status")
    total = len(spec.get("containers") or [])
    ready = restarts = restartable_restarts = 0
    last: datetime | None = None
    last_restartable: datetime | None = None
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or "") or phase
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    init_specs = {c.get("name"): c for c in spec.get("initContainers") or []}
    total += sum(1 for c in spec.get("initContainers") or [] if _restartable(c))

    initializing = False
    for i, cs in enumerate(status.get("initContainerStatuses") or []):
        count = int(cs.get("restartCount") or 0)
        restarts += count
        last = _later(last, _finished(cs))
        restartable = _restartable(init_specs.get(cs.get("name")))
        if restartable:
            restartable_restarts += count
            last_restartable = _later(last_restartable, _finished(cs))
        state = cs.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and int(terminated.get("exitCode") or 0) == 0:
            continue
        if restartable and cs.get("started") is True:
            ready += 1 if cs.get("ready") else 0
            continue
        if terminated is not None:
            reason = _terminated_reason(terminated, "Init:")
        elif waiting is not None and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = "Init:" + str(waiting["reason"])
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break

    if not initializing or _condition_true(row, "Initialized", "status", "conditions"):
        restarts, last = restartable_restarts, last_restartable
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            restarts += int(cs.get("restartCount") or 0)
            last = _later(last, _finished(cs))
            state = cs.get("state") or {}
            terminated, waiting = state.get("terminated"), state.get("waiting")
            if waiting is not None and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated is not None:
                reason = _terminated_reason(terminated)
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _condition_true(row, "Ready", "status", "conditions") else "NotReady"

    if row.get("metadata", "deletionTimestamp") is not None:
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Failed", "Succeeded"):
            reason = "Terminating"

    shown = str(restarts)
    if restarts and last is not None:
        shown = f"{restarts} ({human_duration((row.now - last).total_seconds())} ago)"
    summary = PodSummary(f"{ready}/{total}", reason, shown)
    row.memo["pod"] = summary
    return summary


def pod_ip(obj: Mapping[str, Any]) -> str:
    """The pod's first IP (a v1 status with only `podIP` converts to `podIPs: [podIP]`)."""
    status = obj.get("status") or {}
    ips = status.get("podIPs") or []
    if ips and isinstance(ips[0], Mapping):
        return str(ips[0].get("ip") or "")
    return str(status.get("podIP") or "")


def _readiness_gates(r: Row) -> str:
    gates = r.list("spec", "readinessGates")
    if not gates:
        return "<none>"
    conditions = r.list("status", "conditions")
    true = 0
    for gate in gates:
        for cond in conditions:
            if cond.get("type") == gate.get("conditionType"):
                true += cond.get("status") == "True"
                break
    return f"{true}/{len(gates)}"


def _pod_conditions(r: Row) -> list[dict[str, str]]:
    phase = r.text("status", "phase")
    if phase == "Succeeded":
        return [{"type": "Completed", "status": "True", "reason": "Succeeded",
                 "message": "The pod has completed successfully."}]
    if phase == "Failed":
        return [{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]
    return []


POD = Printer((
    NAME,
    _col("Ready", lambda r: pod_summary(r).ready,
         "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", lambda r: pod_summary(r).status, "The aggregate status of the containers in this pod."),
    _col("Restarts", lambda r: pod_summary(r).restarts,
         "The number of times the containers in this pod have been restarted and when the last container "
         "in this pod has restarted."),
    AGE,
    _wide("IP", lambda r: _none(pod_ip(r.obj)), _core("PodStatus", "podIP")),
    _wide("Node", lambda r: _none(r.text("spec", "nodeName")), _core("PodSpec", "nodeName")),
    _wide("Nominated Node", lambda r: _none(r.text("status", "nominatedNodeName")),
          _core("PodStatus", "nominatedNodeName")),
    _wide("Readiness Gates", _readiness_gates, _core("PodSpec", "readinessGates")),
), conditions=_pod_conditions)


# --------------------------------------------------------------------------- workloads


def _replicas(r: Row, default: int = 1) -> int:
    # Defaulting sets spec.replicas on create; an unset value is what the default would be.
    return r.int("spec", "replicas", default=default)


def _deployment_selector(r: Row) -> str:
    try:
        return str(selectors.from_label_selector_object(r.get("spec", "selector")))
    except selectors.SelectorError:
        return "<invalid>"


def _job_status(r: Row) -> str:
    checks: Sequence[tuple[str, Callable[[Row], bool]]] = (
        ("Complete", lambda r: _condition_true(r, "Complete", "status", "conditions")),
        ("Failed", lambda r: _condition_true(r, "Failed", "status", "conditions")),
        ("Terminating", lambda r: r.get("metadata", "deletionTimestamp") is not None),
        ("Suspended", lambda r: _condition_true(r, "Suspended", "status", "conditions")),
        ("FailureTarget", lambda r: _condition_true(r, "FailureTarget", "status", "conditions")),
        ("SuccessCriteriaMet", lambda r: _condition_true(r, "SuccessCriteriaMet", "status", "conditions")),
    )
    return next((status for status, check in checks if check(r)), "Running")


def _job_completions(r: Row) -> str:
    succeeded = r.int("status", "succeeded")
    completions = r.get("spec", "completions")
    if isinstance(completions, int):
        return f"{succeeded}/{completions}"
    parallelism = r.int("spec", "parallelism")
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def _job_duration(r: Row) -> str:
    try:
        start = parse_time(r.get("status", "startTime"))
        end = parse_time(r.get("status", "completionTime"))
    except ValueError:
        return ""
    if start is None:
        return ""
    return human_duration(((end or r.now) - start).total_seconds())


def _cronjob_last_schedule(r: Row) -> str:
    return "<none>" if r.get("status", "lastScheduleTime") is None else r.age_of("status", "lastScheduleTime")


def _controller_name(r: Row) -> str:
    for ref in r.list("metadata", "ownerReferences"):
        if ref.get("controller") is True:
            group = str(ref.get("apiVersion") or "").rpartition("/")[0]
            kind = str(ref.get("kind") or "")
            group_kind = f"{kind}.{group}" if group else kind
            name = str(ref.get("name") or "")
            return f"{group_kind.lower()}/{name}" if group_kind else name
    return "<none>"


REPLICA_SET = Printer((
    NAME,
    _col("Desired", _replicas, _api("apps.v1", "ReplicaSetSpec", "replicas"), type="integer"),
    _col("Current", lambda r: r.int("status", "replicas"), _api("apps.v1", "ReplicaSetStatus", "replicas"),
         type="integer"),
    _col("Ready", lambda r: r.int("status", "readyReplicas"),
         _api("apps.v1", "ReplicaSetStatus", "readyReplicas"), type="integer"),
    AGE,
    *_template_columns("spec", "template", "spec", selector=_label_selector_cell("spec", "selector"),
                       doc_selector=_api("apps.v1", "ReplicaSetSpec", "selector")),
))

REPLICATION_CONTROLLER = Printer((
    NAME,
    _col("Desired", _replicas, _core("ReplicationControllerSpec", "replicas"), type="integer"),
    _col("Current", lambda r: r.int("status", "replicas"), _core("ReplicationControllerStatus", "replicas"),
         type="integer"),
    _col("Ready", lambda r: r.int("status", "readyReplicas"),
         _core("ReplicationControllerStatus", "readyReplicas"), type="integer"),
    AGE,
    *_template_columns("spec", "template", "spec",
                       selector=lambda r: selectors.format_labels(r.map("spec", "selector")),
                       doc_selector=_core("ReplicationControllerSpec", "selector")),
))

DEPLOYMENT = Printer((
    NAME,
    _col("Ready", lambda r: f"{r.int('status', 'readyReplicas')}/{_replicas(r)}",
         "Number of the pod with ready state"),
    _col("Up-to-date", lambda r: r.int("status", "updatedReplicas"),
         _api("apps.v1", "DeploymentStatus", "updatedReplicas")),
    _col("Available", lambda r: r.int("status", "availableReplicas"),
         _api("apps.v1", "DeploymentStatus", "availableReplicas")),
    AGE,
    *_template_columns("spec", "template", "spec", selector=_deployment_selector,
                       doc_selector=_api("apps.v1", "DeploymentSpec", "selector")),
))

STATEFUL_SET = Printer((
    NAME,
    _col("Ready", lambda r: f"{r.int('status', 'readyReplicas')}/{_replicas(r)}",
         "Number of the pod with ready state"),
    AGE,
    *_template_columns("spec", "template", "spec"),
))

_DS = "DaemonSetStatus"
DAEMON_SET = Printer((
    NAME,
    _col("Desired", lambda r: r.int("status", "desiredNumberScheduled"),
         _api("apps.v1", _DS, "desiredNumberScheduled"), type="integer"),
    _col("Current", lambda r: r.int("status", "currentNumberScheduled"),
         _api("apps.v1", _DS, "currentNumberScheduled"), type="integer"),
    _col("Ready", lambda r: r.int("status", "numberReady"), _api("apps.v1", _DS, "numberReady"),
         type="integer"),
    _col("Up-to-date", lambda r: r.int("status", "updatedNumberScheduled"),
         _api("apps.v1", _DS, "updatedNumberScheduled"), type="integer"),
    _col("Available", lambda r: r.int("status", "numberAvailable"), _api("apps.v1", _DS, "numberAvailable"),
         type="integer"),
    _col("Node Selector",
         lambda r: selectors.format_labels(r.map("spec", "template", "spec", "nodeSelector")),
         _core("PodSpec", "nodeSelector")),
    AGE,
    *_template_columns("spec", "template", "spec", selector=_label_selector_cell("spec", "selector"),
                       doc_selector=_api("apps.v1", "DaemonSetSpec", "selector")),
))

JOB = Printer((
    NAME,
    _col("Status", _job_status, "Status of the job."),
    _col("Completions", _job_completions, _api("batch.v1", "JobStatus", "succeeded")),
    _col("Duration", _job_duration, "Time required to complete the job."),
    AGE,
    *_template_columns("spec", "template", "spec", selector=_label_selector_cell("spec", "selector"),
                       doc_selector=_api("batch.v1", "JobSpec", "selector")),
))

CRON_JOB = Printer((
    NAME,
    _col("Schedule", lambda r: r.text("spec", "schedule"), _api("batch.v1", "CronJobSpec", "schedule")),
    _col("Timezone", lambda r: _none(r.text("spec", "timeZone")),
         _api("batch.v1", "CronJobSpec", "timeZone")),
    _col("Suspend", lambda r: _bool_ptr(r.get("spec", "suspend")), _api("batch.v1", "CronJobSpec", "suspend"),
         type="boolean"),
    _col("Active", lambda r: len(r.list("status", "active")), _api("batch.v1", "CronJobStatus", "active"),
         type="integer"),
    _col("Last Schedule", _cronjob_last_schedule, _api("batch.v1", "CronJobStatus", "lastScheduleTime")),
    AGE,
    *_template_columns("spec", "jobTemplate", "spec", "template", "spec",
                       selector=_label_selector_cell("spec", "jobTemplate", "spec", "selector"),
                       doc_selector=_api("batch.v1", "JobSpec", "selector")),
))

CONTROLLER_REVISION = Printer((
    NAME,
    _col("Controller", _controller_name, "Controller of the object"),
    _col("Revision", lambda r: r.int("revision"), _api("apps.v1", "ControllerRevision", "revision")),
    AGE,
))

POD_DISRUPTION_BUDGET = Printer((
    NAME,
    _col("Min Available", lambda r: _int_or_na(r.get("spec", "minAvailable")),
         "The minimum number of pods that must be available."),
    _col("Max Unavailable", lambda r: _int_or_na(r.get("spec", "maxUnavailable")),
         "The maximum number of pods that may be unavailable."),
    _col("Allowed Disruptions", lambda r: r.int("status", "disruptionsAllowed"),
         "Calculated number of pods that may be disrupted at this time.", type="integer"),
    AGE,
))

POD_TEMPLATE = Printer((
    NAME,
    _col("Containers", lambda r: _containers(r.map("template", "spec"))[0],
         "Names of each container in the template."),
    _col("Images", lambda r: _containers(r.map("template", "spec"))[1],
         "Images referenced by each container in the template."),
    _col("Pod Labels", lambda r: selectors.format_labels(r.map("template", "metadata", "labels")),
         "The labels for the pod template."),
))


# --------------------------------------------------------------------------- networking


def _lb_ingress(r: Row, *path: str) -> str:
    """The load balancer's IPs or hostnames, sorted and de-duplicated (wide: never clipped)."""
    seen = set()
    for ingress in r.list(*path):
        value = ingress.get("ip") or ingress.get("hostname")
        if value:
            seen.add(str(value))
    return ",".join(sorted(seen))


def _service_external_ip(r: Row) -> str:
    external = [str(ip) for ip in r.list("spec", "externalIPs")]
    kind = r.text("spec", "type")
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if kind == "LoadBalancer":
        lb = _lb_ingress(r, "status", "loadBalancer", "ingress")
        if external:
            return ",".join([*(lb.split(",") if lb else []), *external])
        return lb or "<pending>"
    if kind == "ExternalName":
        return r.text("spec", "externalName")
    return "<unknown>"


def _cluster_ip(r: Row) -> str:
    # Objects written before dual-stack carry only clusterIP; the server's copy always has both.
    return str(r.get("spec", "clusterIPs", 0) or r.text("spec", "clusterIP") or "<none>")


def _service_ports(r: Row) -> str:
    pieces = []
    for port in r.list("spec", "ports"):
        protocol = port.get("protocol") or "TCP"
        node_port = port.get("nodePort") or 0
        if node_port > 0:
            pieces.append(f"{port.get('port', 0)}:{node_port}/{protocol}")
        else:
            pieces.append(f"{port.get('port', 0)}/{protocol}")
    return ",".join(pieces) or "<none>"


def _join_host_port(host: str, port: Any) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _format_endpoints(r: Row) -> str:
    subsets = r.list("subsets")
    if not subsets:
        return "<none>"
    shown: list[str] = []
    more, count, limit = False, 0, 3
    for subset in subsets:
        addresses = subset.get("addresses") or []
        ports = subset.get("ports") or []
        if not ports:  # headless services without ports
            count += len(addresses)
            for address in addresses:
                if len(shown) == limit:
                    more = True
                    break
                shown.append(str(address.get("ip", "")))
            continue
        for port in ports:
            count += len(addresses)
            for address in addresses:
                if len(shown) == limit:
                    more = True
                    break
                shown.append(_join_host_port(str(address.get("ip", "")), port.get("port", 0)))
    text = ",".join(shown)
    return f"{text} + {count - limit} more..." if more else text


def _list_with_more(items: Iterable[str], limit: int = 3) -> str:
    values = list(items)
    text = ",".join(values[:limit])
    if len(values) > limit:
        return f"{text} + {len(values) - limit} more..."
    return text or "<unset>"


def _slice_ports(r: Row) -> str:
    def one(port: Mapping[str, Any]) -> str:
        if port.get("port") is not None:
            return str(port["port"])
        if port.get("name") is not None:
            return str(port["name"])
        return "*"

    return _list_with_more(one(p) for p in r.list("ports"))


def _slice_endpoints(r: Row) -> str:
    return _list_with_more(str(a) for e in r.list("endpoints") for a in (e.get("addresses") or []))


def _ingress_hosts(r: Row) -> str:
    rules = r.list("spec", "rules")
    hosts: list[str] = []
    more = False
    for rule in rules:
        if len(hosts) == 3:
            more = True
        if not more and rule.get("host"):
            hosts.append(str(rule["host"]))
    if not hosts:
        return "*"
    text = ",".join(hosts)
    return f"{text} + {len(rules) - 3} more..." if more else text


def _ingress_class_parameters(r: Row) -> str:
    params = r.map("spec", "parameters")
    if not params:
        return "<none>"
    text = str(params.get("kind", ""))
    if params.get("apiGroup") is not None:
        text += "." + str(params["apiGroup"])
    return f"{text}/{params.get('name', '')}"


def _default_marked(r: Row, *annotations: str) -> str:
    notes = r.map("metadata", "annotations")
    return r.name + (" (default)" if any(notes.get(a) == "true" for a in annotations) else "")


def _ip_parent(r: Row) -> str:
    ref = r.map("spec", "parentRef")
    if not ref:
        return "<none>"
    group, resource = str(ref.get("group") or ""), str(ref.get("resource") or "")
    text = (f"{resource}.{group}" if group else resource).lower()
    if ref.get("namespace"):
        text += "/" + str(ref["namespace"])
    return f"{text}/{ref.get('name', '')}"


SERVICE = Printer((
    NAME,
    _col("Type", lambda r: r.text("spec", "type"), _core("ServiceSpec", "type")),
    _col("Cluster-IP", _cluster_ip, _core("ServiceSpec", "clusterIP")),
    _col("External-IP", _service_external_ip, _core("ServiceSpec", "externalIPs")),
    _col("Port(s)", _service_ports, _core("ServiceSpec", "ports")),
    AGE,
    _wide("Selector", lambda r: selectors.format_labels(r.map("spec", "selector")),
          _core("ServiceSpec", "selector")),
))

ENDPOINTS = Printer((NAME, _col("Endpoints", _format_endpoints, _core("Endpoints", "subsets")), AGE))

ENDPOINT_SLICE = Printer((
    NAME,
    _col("AddressType", lambda r: r.text("addressType"),
         _api("discovery.v1", "EndpointSlice", "addressType")),
    _col("Ports", _slice_ports, _api("discovery.v1", "EndpointSlice", "ports")),
    _col("Endpoints", _slice_endpoints, _api("discovery.v1", "EndpointSlice", "endpoints")),
    AGE,
))

INGRESS = Printer((
    NAME,
    _col("Class", lambda r: _none(r.text("spec", "ingressClassName")),
         "The name of the IngressClass resource that should be used for additional configuration"),
    _col("Hosts", _ingress_hosts, "Hosts that incoming requests are matched against before the ingress rule"),
    _col("Address", lambda r: _lb_ingress(r, "status", "loadBalancer", "ingress"),
         "Address is a list containing ingress points for the load-balancer"),
    _col("Ports", lambda r: "80, 443" if r.list("spec", "tls") else "80",
         "Ports of TLS configurations that open"),
    AGE,
))

INGRESS_CLASS = Printer((
    _col("Name", lambda r: _default_marked(r, "ingressclass.kubernetes.io/is-default-class"), NAME_DOC,
         format="name"),
    _col("Controller", lambda r: r.text("spec", "controller"),
         "Controller that is responsible for handling this class"),
    _col("Parameters", _ingress_class_parameters, "A reference to a resource with additional parameters"),
    AGE,
))

NETWORK_POLICY = Printer((
    NAME,
    _col("Pod-Selector", lambda r: selectors.format_label_selector(r.map("spec", "podSelector")),
         _api("networking.v1", "NetworkPolicySpec", "podSelector")),
    AGE,
))

SERVICE_CIDR = Printer((
    NAME,
    _col("CIDRs", lambda r: ",".join(str(c) for c in r.list("spec", "cidrs")),
         _api("networking.v1", "ServiceCIDRSpec", "cidrs")),
    AGE,
))

IP_ADDRESS = Printer((
    NAME, _col("ParentRef", _ip_parent, _api("networking.v1", "IPAddressSpec", "parentRef"))))


# --------------------------------------------------------------------------- cluster, config, storage


def _node_status(r: Row) -> str:
    status = []
    for cond in r.list("status", "conditions"):
        if cond.get("type") == "Ready":
            status = ["Ready" if cond.get("status") == "True" else "NotReady"]
    status = status or ["Unknown"]
    if r.get("spec", "unschedulable") is True:
        status.append("SchedulingDisabled")
    return ",".join(status)


def _node_roles(r: Row) -> str:
    roles = set()
    for key, value in r.map("metadata", "labels").items():
        if key.startswith("node-role.kubernetes.io/") and key.removeprefix("node-role.kubernetes.io/"):
            roles.add(key.removeprefix("node-role.kubernetes.io/"))
        elif key == "kubernetes.io/role" and value:
            roles.add(str(value))
    return ",".join(sorted(roles)) or "<none>"


def _node_address(kind: str) -> Cell:
    def cell(r: Row) -> str:
        for address in r.list("status", "addresses"):
            if address.get("type") == kind:
                return str(address.get("address", ""))
        return "<none>"

    return cell


def _node_info(field: str) -> Cell:
    return lambda r: r.text("status", "nodeInfo", field) or "<unknown>"


NODE = Printer((
    NAME,
    _col("Status", _node_status, "The status of the node"),
    _col("Roles", _node_roles, "The roles of the node"),
    AGE,
    _col("Version", lambda r: r.text("status", "nodeInfo", "kubeletVersion"),
         _core("NodeSystemInfo", "kubeletVersion")),
    _wide("Internal-IP", _node_address("InternalIP"), _core("NodeStatus", "addresses")),
    _wide("External-IP", _node_address("ExternalIP"), _core("NodeStatus", "addresses")),
    _wide("OS-Image", _node_info("osImage"), _core("NodeSystemInfo", "osImage")),
    _wide("Kernel-Version", _node_info("kernelVersion"), _core("NodeSystemInfo", "kernelVersion")),
    _wide("Container-Runtime", _node_info("containerRuntimeVersion"),
          _core("NodeSystemInfo", "containerRuntimeVersion")),
))


@dataclasses.dataclass(frozen=True)
class _EventView:
    """Where an event's fields live: core/v1 names, or their events.k8s.io/v1 equivalents."""

    involved: str = "involvedObject"
    message: str = "message"
    source: str = "source"
    first: str = "firstTimestamp"
    last: str = "lastTimestamp"
    count: str = "count"
    controller: str = "reportingComponent"


_CORE_EVENT = _EventView()
_EVENTS_V1 = _EventView("regarding", "note", "deprecatedSource", "deprecatedFirstTimestamp",
                        "deprecatedLastTimestamp", "deprecatedCount", "reportingController")


def _event_cells(view: _EventView) -> dict[str, Cell]:
    def first(r: Row) -> str:
        if r.get(view.first) is None:
            return r.age_of("eventTime")
        return r.age_of(view.first)

    def last(r: Row) -> str:
        if r.get("series") is not None:
            return r.age_of("series", "lastObservedTime")
        return first(r) if r.get(view.last) is None else r.age_of(view.last)

    def count(r: Row) -> int:
        if r.get("series") is not None:
            return r.int("series", "count")
        return r.int(view.count) or 1  # singleton events of the new API carry no count

    def target(r: Row) -> str:
        kind, name = r.text(view.involved, "kind").lower(), r.text(view.involved, "name")
        return f"{kind}/{name}" if name else kind

    def source(r: Row) -> str:
        component = r.text(view.source, "component") or r.text(view.controller)
        instance = r.text(view.source, "host") or r.text("reportingInstance")
        return f"{component}, {instance}" if instance else component

    return {"first": first, "last": last, "count": count, "target": target, "source": source,
            "fieldPath": lambda r: r.text(view.involved, "fieldPath"),
            "message": lambda r: r.text(view.message).strip()}


def _event_printer(view: _EventView) -> Printer:
    cells = _event_cells(view)
    return Printer((
        _col("Last Seen", cells["last"], _core("Event", "lastTimestamp")),
        _col("Type", lambda r: r.text("type"), _core("Event", "type")),
        _col("Reason", lambda r: r.text("reason"), _core("Event", "reason")),
        _col("Object", cells["target"], _core("Event", "involvedObject")),
        _wide("Subobject", cells["fieldPath"], _core("ObjectReference", "fieldPath")),
        _wide("Source", cells["source"], _core("Event", "source")),
        _col("Message", cells["message"], _core("Event", "message")),
        _wide("First Seen", cells["first"], _core("Event", "firstTimestamp")),
        _wide("Count", cells["count"], _core("Event", "count")),
        _col("Name", lambda r: r.name, NAME_DOC, priority=1, format="name"),
    ))


def _quota_column(limits: bool) -> Cell:
    def cell(r: Row) -> str:
        hard, used = r.map("status", "hard"), r.map("status", "used")
        parts = []
        for name in sorted(hard):
            pieces = name.split(".")
            if (len(pieces) > 1 and pieces[0] == "limits") == limits:
                parts.append(f"{name}: {_quantity(used.get(name))}/{_quantity(hard[name])}")
        return ", ".join(parts)

    return cell


_ACCESS_MODES = (("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"),
                 ("ReadWriteOncePod", "RWOP"))


def _access_modes(modes: Iterable[Any]) -> str:
    present = set(modes)
    return ",".join(short for mode, short in _ACCESS_MODES if mode in present)


def _storage_class(r: Row) -> str:
    return (r.text("metadata", "annotations", "volume.beta.kubernetes.io/storage-class")
            or r.text("spec", "storageClassName"))


def _phase_or_terminating(r: Row) -> str:
    return "Terminating" if r.get("metadata", "deletionTimestamp") is not None else r.text("status", "phase")


def _pvc_bound(r: Row, cell: Callable[[Row], str]) -> str:
    return cell(r) if r.text("spec", "volumeName") else ""


def _component_condition(field: str) -> Cell:
    def cell(r: Row) -> str:
        for cond in r.list("conditions"):
            if cond.get("type") == "Healthy":
                if field == "status":
                    return "Healthy" if cond.get("status") == "True" else "Unhealthy"
                return str(cond.get(field) or "")
        return "Unknown" if field == "status" else ""

    return cell


NAMESPACE = Printer((
    NAME, _col("Status", lambda r: r.text("status", "phase"), "The status of the namespace"), AGE))

SECRET = Printer((
    NAME,
    _col("Type", lambda r: r.text("type"), _core("Secret", "type")),
    _col("Data", lambda r: len(r.map("data")), _core("Secret", "data")),
    AGE,
))

CONFIG_MAP = Printer((
    NAME,
    _col("Data", lambda r: len(r.map("data")) + len(r.map("binaryData")), _core("ConfigMap", "data")),
    AGE,
))

SERVICE_ACCOUNT = Printer((
    NAME, _col("Secrets", lambda r: len(r.list("secrets")), _core("ServiceAccount", "secrets")), AGE))

RESOURCE_QUOTA = Printer((
    NAME,
    _col("Request", _quota_column(False),
         "Request represents a minimum amount of cpu/memory that a container may consume."),
    _col("Limit", _quota_column(True), "Limits control the maximum amount of cpu/memory that a container may "
         "use independent of contention on the node."),
    AGE,
))

PERSISTENT_VOLUME = Printer((
    NAME,
    _col("Capacity", lambda r: _quantity(r.get("spec", "capacity", "storage")),
         _core("PersistentVolumeSpec", "capacity")),
    _col("Access Modes", lambda r: _access_modes(r.list("spec", "accessModes")),
         _core("PersistentVolumeSpec", "accessModes")),
    _col("Reclaim Policy", lambda r: r.text("spec", "persistentVolumeReclaimPolicy"),
         _core("PersistentVolumeSpec", "persistentVolumeReclaimPolicy")),
    _col("Status", _phase_or_terminating, _core("PersistentVolumeStatus", "phase")),
    _col("Claim", lambda r: (f"{r.text('spec', 'claimRef', 'namespace')}/{r.text('spec', 'claimRef', 'name')}"
                             if r.get("spec", "claimRef") is not None else ""),
         _core("PersistentVolumeSpec", "claimRef")),
    _col("StorageClass", _storage_class, "StorageClass of the pv"),
    _col("VolumeAttributesClass", lambda r: _unset(r.text("spec", "volumeAttributesClassName")),
         "VolumeAttributesClass of the pv"),
    _col("Reason", lambda r: r.text("status", "reason"), _core("PersistentVolumeStatus", "reason")),
    AGE,
    _wide("VolumeMode", lambda r: _unset(r.text("spec", "volumeMode")),
          _core("PersistentVolumeSpec", "volumeMode")),
))

PERSISTENT_VOLUME_CLAIM = Printer((
    NAME,
    _col("Status", _phase_or_terminating, _core("PersistentVolumeClaimStatus", "phase")),
    _col("Volume", lambda r: r.text("spec", "volumeName"), _core("PersistentVolumeClaimSpec", "volumeName")),
    _col("Capacity", lambda r: _pvc_bound(r, lambda r: _quantity(r.get("status", "capacity", "storage"))),
         _core("PersistentVolumeClaimStatus", "capacity")),
    _col("Access Modes", lambda r: _pvc_bound(r, lambda r: _access_modes(r.list("status", "accessModes"))),
         _core("PersistentVolumeClaimStatus", "accessModes")),
    _col("StorageClass", _storage_class, "StorageClass of the pvc"),
    _col("VolumeAttributesClass", lambda r: _unset(r.text("spec", "volumeAttributesClassName")),
         "VolumeAttributesClass of the pvc"),
    AGE,
    _wide("VolumeMode", lambda r: _unset(r.text("spec", "volumeMode")),
          _core("PersistentVolumeClaimSpec", "volumeMode")),
))

COMPONENT_STATUS = Printer((
    NAME,
    _col("Status", _component_condition("status"), "Status of the component conditions"),
    _col("Message", _component_condition("message"), "Message of the component conditions"),
    _col("Error", _component_condition("error"), "Error of the component conditions"),
))

_SC = "storage.v1"
STORAGE_CLASS = Printer((
    _col("Name", lambda r: _default_marked(r, "storageclass.kubernetes.io/is-default-class",
                                           "storageclass.beta.kubernetes.io/is-default-class"),
         NAME_DOC, format="name"),
    _col("Provisioner", lambda r: r.text("provisioner"), _api(_SC, "StorageClass", "provisioner")),
    _col("ReclaimPolicy", lambda r: r.text("reclaimPolicy") or "Delete",
         _api(_SC, "StorageClass", "reclaimPolicy")),
    _col("VolumeBindingMode", lambda r: r.text("volumeBindingMode") or "Immediate",
         _api(_SC, "StorageClass", "volumeBindingMode")),
    _col("AllowVolumeExpansion", lambda r: r.get("allowVolumeExpansion") is True,
         _api(_SC, "StorageClass", "allowVolumeExpansion")),
    AGE,
))

VOLUME_ATTRIBUTES_CLASS = Printer((
    _col("Name", lambda r: _default_marked(r, "storage.kubernetes.io/is-default-class"), NAME_DOC,
         format="name"),
    _col("DriverName", lambda r: r.text("driverName"), _api(_SC, "VolumeAttributesClass", "driverName")),
    AGE,
))

VOLUME_ATTACHMENT = Printer((
    NAME,
    _col("Attacher", lambda r: r.text("spec", "attacher"), _api(_SC, "VolumeAttachmentSpec", "attacher"),
         format="name"),
    _col("PV", lambda r: r.text("spec", "source", "persistentVolumeName"),
         _api(_SC, "VolumeAttachmentSource", "persistentVolumeName")),
    _col("Node", lambda r: r.text("spec", "nodeName"), _api(_SC, "VolumeAttachmentSpec", "nodeName")),
    _col("Attached", lambda r: r.get("status", "attached") is True,
         _api(_SC, "VolumeAttachmentStatus", "attached"),
         type="boolean"),
    AGE,
))

CSI_NODE = Printer((
    NAME,
    _col("Drivers", lambda r: len(r.list("spec", "drivers")),
         "Drivers indicates the number of CSI drivers registered on the node", type="integer"),
    AGE,
))


def _token_requests(r: Row) -> str:
    requests = r.get("spec", "tokenRequests")
    if requests is None:
        return "<unset>"
    return ",".join(str(t.get("audience", "")) for t in requests)


_CSI = "CSIDriverSpec"
CSI_DRIVER = Printer((
    NAME,
    _col("AttachRequired", lambda r: r.get("spec", "attachRequired", default=True) is True,
         _api(_SC, _CSI, "attachRequired"), type="boolean"),
    _col("PodInfoOnMount", lambda r: r.get("spec", "podInfoOnMount") is True,
         _api(_SC, _CSI, "podInfoOnMount"),
         type="boolean"),
    _col("StorageCapacity", lambda r: r.get("spec", "storageCapacity") is True,
         _api(_SC, _CSI, "storageCapacity"),
         type="boolean"),
    _col("TokenRequests", _token_requests, _api(_SC, _CSI, "tokenRequests")),
    _col("RequiresRepublish", lambda r: r.get("spec", "requiresRepublish") is True,
         _api(_SC, _CSI, "requiresRepublish"), type="boolean"),
    _col("Modes", lambda r: ",".join(str(m) for m in r.list("spec", "volumeLifecycleModes")) or "<none>",
         _api(_SC, _CSI, "volumeLifecycleModes")),
    AGE,
))

CSI_STORAGE_CAPACITY = Printer((
    NAME,
    _col("StorageClassName", lambda r: r.text("storageClassName"),
         _api(_SC, "CSIStorageCapacity", "storageClassName")),
    _col("Capacity", lambda r: "<unset>" if r.get("capacity") is None else _quantity(r.get("capacity")),
         _api(_SC, "CSIStorageCapacity", "capacity")),
))


# --------------------------------------------------------------------------- rbac, policy, admission, apis


def _subjects(kind: str) -> Cell:
    def cell(r: Row) -> str:
        names = []
        for subject in r.list("subjects"):
            if subject.get("kind") == kind:
                if kind == "ServiceAccount":
                    names.append(f"{subject.get('namespace', '')}/{subject.get('name', '')}")
                else:
                    names.append(str(subject.get("name", "")))
        return ", ".join(names)

    return cell


def _binding_printer(what: str) -> Printer:
    return Printer((
        NAME,
        _col("Role", lambda r: f"{r.text('roleRef', 'kind')}/{r.text('roleRef', 'name')}",
             _api("rbac.v1", what, "roleRef")),
        AGE,
        _wide("Users", _subjects("User"), f"Users in the {what[0].lower()}{what[1:]}"),
        _wide("Groups", _subjects("Group"), f"Groups in the {what[0].lower()}{what[1:]}"),
        _wide("ServiceAccounts", _subjects("ServiceAccount"),
              f"ServiceAccounts in the {what[0].lower()}{what[1:]}"),
    ))


def _csr_condition(r: Row) -> str:
    kinds_seen = {c.get("type") for c in r.list("status", "conditions")}
    status = "Denied" if "Denied" in kinds_seen else "Approved" if "Approved" in kinds_seen else "Pending"
    if "Failed" in kinds_seen:
        status += ",Failed"
    if r.get("status", "certificate"):
        status += ",Issued"
    return status


def _csr_duration(r: Row) -> str:
    seconds = r.get("spec", "expirationSeconds")
    return "<none>" if seconds is None else human_duration(float(seconds))


_CSR = "certificates.v1"
CERTIFICATE_SIGNING_REQUEST = Printer((
    NAME,
    AGE,
    _col("SignerName", lambda r: _none(r.text("spec", "signerName")),
         _api(_CSR, "CertificateSigningRequestSpec", "signerName")),
    _col("Requestor", lambda r: r.text("spec", "username"),
         _api(_CSR, "CertificateSigningRequestSpec", "request")),
    _col("RequestedDuration", _csr_duration,
         _api(_CSR, "CertificateSigningRequestSpec", "expirationSeconds")),
    _col("Condition", _csr_condition, _api(_CSR, "CertificateSigningRequestStatus", "conditions")),
))

CLUSTER_TRUST_BUNDLE = Printer((
    NAME,
    _col("SignerName", lambda r: _none(r.text("spec", "signerName")),
         _api("certificates.v1beta1", "ClusterTrustBundleSpec", "signerName")),
))

PRIORITY_CLASS = Printer((
    NAME,
    _col("Value", lambda r: r.int("value"), _api("scheduling.v1", "PriorityClass", "value"), type="integer"),
    _col("Global-Default", lambda r: r.get("globalDefault") is True,
         _api("scheduling.v1", "PriorityClass", "globalDefault"), type="boolean"),
    AGE,
    _col("PreemptionPolicy", lambda r: r.text("preemptionPolicy"),
         _api("scheduling.v1", "PriorityClass", "preemptionPolicy")),
))

RUNTIME_CLASS = Printer((NAME, _col("Handler", lambda r: r.text("handler"), ""), AGE))

LEASE = Printer((
    NAME, _col("Holder", lambda r: r.text("spec", "holderIdentity"),
               _api("coordination.v1", "LeaseSpec", "holderIdentity")), AGE))

LEASE_CANDIDATE = Printer((
    NAME,
    _col("LeaseName", lambda r: r.text("spec", "leaseName"),
         _api("coordination.v1beta1", "LeaseCandidateSpec", "leaseName")),
    _col("BinaryVersion", lambda r: r.text("spec", "binaryVersion"), ""),
    _col("EmulationVersion", lambda r: r.text("spec", "emulationVersion"), ""),
    AGE,
))

WEBHOOKS = Printer((
    NAME,
    _col("Webhooks", lambda r: len(r.list("webhooks")),
         "Webhooks indicates the number of webhooks registered in this configuration", type="integer"),
    AGE,
))


def _param_kind(r: Row) -> str:
    kind = r.map("spec", "paramKind")
    return f"{kind.get('apiVersion', '')}/{kind.get('kind', '')}" if kind else "<unset>"


def _go_selector_string(selector: Mapping[str, Any]) -> str:
    """The generated String() of a metav1.LabelSelector (what a binding's paramRef prints)."""
    labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    label_text = "".join(f"{k}: {labels[k]}," for k in sorted(labels))
    expr_text = "".join(f"LabelSelectorRequirement{{Key:{e.get('key', '')},Operator:{e.get('operator', '')},"
                        f"Values:[{' '.join(e.get('values') or [])}],}}," for e in exprs)
    return (f"&LabelSelector{{MatchLabels:map[string]string{{{label_text}}},"
            f"MatchExpressions:[]LabelSelectorRequirement{{{expr_text}}},}}")


def _param_ref(r: Row) -> str:
    ref = r.map("spec", "paramRef")
    if not ref:
        return "<unset>"
    if ref.get("name"):
        return f"{ref.get('namespace') or '*'}/{ref['name']}"
    if ref.get("selector") is not None:
        return _go_selector_string(ref["selector"])
    return "<unset>"


def _policy_printer(count_name: str, field: str, doc: str) -> Printer:
    return Printer((
        NAME,
        _col(count_name, lambda r: len(r.list("spec", field)), doc, type="integer"),
        _col("ParamKind", _param_kind,
             "ParamKind specifies the kind of resources used to parameterize this policy"),
        AGE,
    ))


POLICY_BINDING = Printer((
    NAME,
    _col("PolicyName", lambda r: r.text("spec", "policyName"),
         "PolicyName indicates the policy definition which the policy binding binded to"),
    _col("ParamRef", _param_ref, "ParamRef indicates the param resource which sets the configration param"),
    AGE,
))


def _apiservice_service(r: Row) -> str:
    service = r.get("spec", "service")
    if not isinstance(service, dict):
        return "Local"
    return f"{service.get('namespace', '')}/{service.get('name', '')}"


def _apiservice_available(r: Row) -> str:
    for cond in r.list("status", "conditions"):
        if cond.get("type") == "Available":
            status = str(cond.get("status", ""))
            return status if status == "True" else f"{status} ({cond.get('reason', '')})"
    return "Unknown"


# kube-aggregator's table convertor.
API_SERVICE = Printer((
    NAME,
    _col("Service", _apiservice_service, "The reference to the service that hosts this API endpoint."),
    _col("Available", _apiservice_available, "Whether this service is available."),
    AGE,
))


def _flow_schemas_in_order(items: list[Object]) -> list[Object]:
    return sorted(items, key=lambda o: ((o.get("spec") or {}).get("matchingPrecedence") or 0,
                                        (o.get("metadata") or {}).get("name") or ""))


def _dangling(r: Row) -> str:
    for cond in r.list("status", "conditions"):
        if cond.get("type") == "Dangling":
            return str(cond.get("status", ""))
    return "?"


_FC = "flowcontrol.v1"
FLOW_SCHEMA = Printer((
    NAME,
    _col("PriorityLevel", lambda r: r.text("spec", "priorityLevelConfiguration", "name"),
         _api(_FC, "PriorityLevelConfigurationReference", "name")),
    _col("MatchingPrecedence", lambda r: r.int("spec", "matchingPrecedence"),
         _api(_FC, "FlowSchemaSpec", "matchingPrecedence")),
    _col("DistinguisherMethod", lambda r: r.text("spec", "distinguisherMethod", "type") or "<none>",
         _api(_FC, "FlowSchemaSpec", "distinguisherMethod")),
    AGE,
    _col("MissingPL", _dangling, "references a broken or non-existent PriorityLevelConfiguration"),
), order=_flow_schemas_in_order)


def _limited(*path: str) -> Cell:
    def cell(r: Row) -> Any:
        if r.get("spec", "limited") is None:
            return "<none>"
        if path[0] != "nominalConcurrencyShares" and r.get("spec", "limited", "limitResponse",
                "queuing") is None:
            return "<none>"
        full = path if path[0] == "nominalConcurrencyShares" else ("limitResponse", "queuing", *path)
        return r.int("spec", "limited", *full)

    return cell


PRIORITY_LEVEL = Printer((
    NAME,
    _col("Type", lambda r: r.text("spec", "type"), _api(_FC, "PriorityLevelConfigurationSpec", "type")),
    _col("NominalConcurrencyShares", _limited("nominalConcurrencyShares"),
         _api(_FC, "LimitedPriorityLevelConfiguration", "nominalConcurrencyShares")),
    _col("Queues", _limited("queues"), _api(_FC, "QueuingConfiguration", "queues")),
    _col("HandSize", _limited("handSize"), _api(_FC, "QueuingConfiguration", "handSize")),
    _col("QueueLengthLimit", _limited("queueLengthLimit"),
         _api(_FC, "QueuingConfiguration", "queueLengthLimit")),
    AGE,
))


def _crd_versions(r: Row) -> str:
    versions = [str(v.get("name", "")) + ("(storage)" if v.get("storage") else "")
                for v in r.list("spec", "versions") if v.get("served")]
    return ",".join(sorted(versions))


CUSTOM_RESOURCE_DEFINITION = Printer((
    NAME,
    _col("Scope", lambda r: r.text("spec", "scope"), "Cluster/Namespaced"),
    _col("Versions", _crd_versions, "Served versions"),
    _col("Created At", lambda r: _rfc3339(r.get("metadata", "creationTimestamp")), CREATED_DOC, type="date"),
    _wide("Group", lambda r: r.text("spec", "group"), "API group"),
    _wide("Kind", lambda r: r.text("spec", "names", "kind"), "CustomResource kind"),
    _wide("ShortNames", lambda r: ",".join(str(s) for s in r.list("spec", "names", "shortNames")),
          "Short names"),
    _wide("Established", lambda r: _condition_true(r, "Established", "status", "conditions"),
          "Established status",
          type="boolean"),
))


# --------------------------------------------------------------------------- autoscaling


def _hpa_metric(spec: Mapping[str, Any], status: Mapping[str, Any] | None) -> str:
    kind = spec.get("type")
    source = {"External": "external", "Pods": "pods", "Object": "object", "Resource": "resource",
              "ContainerResource": "containerResource"}.get(str(kind))
    if source is None:
        return "<unknown type>"
    target = (spec.get(source) or {}).get("target") or {}
    current = ((status or {}).get(source) or {}).get("current") if status and status.get(source) else None
    has_status = status is not None and status.get(source) is not None

    def quantity(holder: Mapping[str, Any] | None, field: str) -> str:
        value = (holder or {}).get(field)
        return "<nil>" if value is None else _quantity(value)

    if source == "pods":
        now = quantity(current, "averageValue") if has_status else "<unknown>"
        return f"{now}/{quantity(target, 'averageValue')}"
    if source in ("external", "object"):
        if target.get("averageValue") is not None:
            now = quantity(current,
                           "averageValue") if has_status and (current or {}).get("averageValue") is not None \
                else "<unknown>"
            return f"{now}/{quantity(target, 'averageValue')} (avg)"
        return f"{quantity(current, 'value') if has_status else '<unknown>'}/{quantity(target, 'value')}"
    name = str((spec.get(source) or {}).get("name", ""))
    if target.get("averageValue") is not None:
        return f"{name}: {quantity(current, 'averageValue') if has_status else '<unknown>'}/" \
               f"{quantity(target, 'averageValue')}"
    now = "<unknown>"
    if has_status and (current or {}).get("averageUtilization") is not None:
        now = f"{current['averageUtilization']}%"  # type: ignore[index]
    goal = f"{target['averageUtilization']}%" if target.get("averageUtilization") is not None else "<auto>"
    return f"{name}: {now}/{goal}"


def _hpa_targets(r: Row) -> str:
    specs, statuses = r.list("spec", "metrics"), r.list("status", "currentMetrics")
    if not specs:
        return "<none>"
    shown = [_hpa_metric(spec, statuses[i] if i < len(statuses) else None) for i, spec in enumerate(specs)]
    if len(shown) > 2:
        return f"{', '.join(shown[:2])} + {len(shown) - 2} more..."
    return ", ".join(shown)


_HPA = "autoscaling.v2"
HORIZONTAL_POD_AUTOSCALER = Printer((
    NAME,
    _col("Reference",
         lambda r: f"{r.text('spec', 'scaleTargetRef', 'kind')}/{r.text('spec', 'scaleTargetRef', 'name')}",
         _api(_HPA, "HorizontalPodAutoscalerSpec", "scaleTargetRef")),
    _col("Targets", _hpa_targets, _api(_HPA, "HorizontalPodAutoscalerSpec", "metrics")),
    _col("MinPods",
         lambda r: "<unset>" if r.get("spec", "minReplicas") is None else str(r.int("spec", "minReplicas")),
         _api(_HPA, "HorizontalPodAutoscalerSpec", "minReplicas")),
    _col("MaxPods", lambda r: r.int("spec", "maxReplicas"),
         _api(_HPA, "HorizontalPodAutoscalerSpec", "maxReplicas")),
    _col("Replicas", lambda r: r.int("status", "currentReplicas"),
         _api(_HPA, "HorizontalPodAutoscalerStatus", "currentReplicas")),
    AGE,
))


# --------------------------------------------------------------------------- dynamic resource allocation


def _claim_state(r: Row) -> str:
    states = []
    deleted = r.get("metadata", "deletionTimestamp") is not None
    if deleted:
        states.append("deleted")
    if r.get("status", "allocation") is None:
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if r.list("status", "reservedFor"):
            states.append("reserved")
    return ",".join(states)


RESOURCE_CLAIM = Printer((
    NAME, _col("State", _claim_state,
               "A summary of the current state (allocated, pending, reserved, etc.)."), AGE))
NAME_AND_AGE = Printer((NAME, AGE))
RESOURCE_SLICE = Printer((
    NAME,
    _col("Node", lambda r: r.text("spec", "nodeName"), _api("resource.v1", "ResourceSliceSpec", "nodeName")),
    _col("Driver", lambda r: r.text("spec", "driver"), _api("resource.v1", "ResourceSliceSpec", "driver")),
    _col("Pool", lambda r: r.text("spec", "pool", "name"), _api("resource.v1", "ResourcePool", "name")),
    AGE,
))


# --------------------------------------------------------------------------- the table of tables

TABLES: dict[tuple[str, str], Printer] = {
    ("", "Pod"): POD,
    ("", "PodTemplate"): POD_TEMPLATE,
    ("", "ReplicationController"): REPLICATION_CONTROLLER,
    ("", "Service"): SERVICE,
    ("", "Endpoints"): ENDPOINTS,
    ("", "Node"): NODE,
    ("", "Event"): _event_printer(_CORE_EVENT),
    ("", "Namespace"): NAMESPACE,
    ("", "Secret"): SECRET,
    ("", "ServiceAccount"): SERVICE_ACCOUNT,
    ("", "PersistentVolume"): PERSISTENT_VOLUME,
    ("", "PersistentVolumeClaim"): PERSISTENT_VOLUME_CLAIM,
    ("", "ComponentStatus"): COMPONENT_STATUS,
    ("", "ConfigMap"): CONFIG_MAP,
    ("", "ResourceQuota"): RESOURCE_QUOTA,
    ("events.k8s.io", "Event"): _event_printer(_EVENTS_V1),
    ("apps", "Deployment"): DEPLOYMENT,
    ("apps", "ReplicaSet"): REPLICA_SET,
    ("apps", "StatefulSet"): STATEFUL_SET,
    ("apps", "DaemonSet"): DAEMON_SET,
    ("apps", "ControllerRevision"): CONTROLLER_REVISION,
    ("batch", "Job"): JOB,
    ("batch", "CronJob"): CRON_JOB,
    ("policy", "PodDisruptionBudget"): POD_DISRUPTION_BUDGET,
    ("autoscaling", "HorizontalPodAutoscaler"): HORIZONTAL_POD_AUTOSCALER,
    ("networking.k8s.io", "Ingress"): INGRESS,
    ("networking.k8s.io", "IngressClass"): INGRESS_CLASS,
    ("networking.k8s.io", "NetworkPolicy"): NETWORK_POLICY,
    ("networking.k8s.io", "ServiceCIDR"): SERVICE_CIDR,
    ("networking.k8s.io", "IPAddress"): IP_ADDRESS,
    ("discovery.k8s.io", "EndpointSlice"): ENDPOINT_SLICE,
    ("rbac.authorization.k8s.io", "RoleBinding"): _binding_printer("RoleBinding"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): _binding_printer("ClusterRoleBinding"),
    ("certificates.k8s.io", "CertificateSigningRequest"): CERTIFICATE_SIGNING_REQUEST,
    ("certificates.k8s.io", "ClusterTrustBundle"): CLUSTER_TRUST_BUNDLE,
    ("coordination.k8s.io", "Lease"): LEASE,
    ("coordination.k8s.io", "LeaseCandidate"): LEASE_CANDIDATE,
    ("storage.k8s.io", "StorageClass"): STORAGE_CLASS,
    ("storage.k8s.io", "VolumeAttributesClass"): VOLUME_ATTRIBUTES_CLASS,
    ("storage.k8s.io", "VolumeAttachment"): VOLUME_ATTACHMENT,
    ("storage.k8s.io", "CSINode"): CSI_NODE,
    ("storage.k8s.io", "CSIDriver"): CSI_DRIVER,
    ("storage.k8s.io", "CSIStorageCapacity"): CSI_STORAGE_CAPACITY,
    ("scheduling.k8s.io", "PriorityClass"): PRIORITY_CLASS,
    ("node.k8s.io", "RuntimeClass"): RUNTIME_CLASS,
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"): WEBHOOKS,
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"): WEBHOOKS,
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"): _policy_printer(
        "Validations", "validations", "Validations indicates the number of validation rules defined in this "
        "configuration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"): POLICY_BINDING,
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicy"): _policy_printer(
        "Mutations", "mutations",
        "Mutation indicates the number of mutations rules defined in this configuration"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicyBinding"): POLICY_BINDING,
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"): FLOW_SCHEMA,
    ("apiregistration.k8s.io", "APIService"): API_SERVICE,
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"): PRIORITY_LEVEL,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): CUSTOM_RESOURCE_DEFINITION,
    ("resource.k8s.io", "DeviceClass"): NAME_AND_AGE,
    ("resource.k8s.io", "ResourceClaim"): RESOURCE_CLAIM,
    ("resource.k8s.io", "ResourceClaimTemplate"): NAME_AND_AGE,
    ("resource.k8s.io", "ResourceSlice"): RESOURCE_SLICE,
}

# rest.defaultTableConvertor: every kind without a printer (Role, ClusterRole, LimitRange, ...).
DEFAULT = Printer((
    NAME,
    _col("Created At", lambda r: _rfc3339(r.get("metadata", "creationTimestamp")), CREATED_DOC, type="date"),
), rows_when_empty=None)


# --------------------------------------------------------------------------- custom resources

# apiextensions serves this column when a version declares no additionalPrinterColumns.
_DEFAULT_CUSTOM_COLUMNS = (
    kinds.PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),)


def _json_cell(column: kinds.PrinterColumn) -> Cell:
    """cellForJSONValue: first jsonpath result, typed by the column."""
    def cell(r: Row) -> Any:
        try:
            found = jsonpath.find_results(column.json_path, r.obj, allow_missing_keys=True)
        except jsonpath.JSONPathError:
            return None
        if not found or not found[0]:
            return None
        value = found[0][0]
        if column.type == "string":
            return jsonpath.format_text(value)
        return _typed(column.type, value, r.now)

    return cell


def _typed(column_type: str, value: Any, now: datetime) -> Any:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if column_type == "integer" and number:
        return int(value)
    if column_type == "number" and number:
        return float(value)
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if column_type == "date" and isinstance(value, str):
        try:
            moment = parse_time(value)
        except ValueError:
            return "<invalid>"
        return "<unknown>" if moment is None else human_duration((now - moment).total_seconds())
    return None


@functools.lru_cache(maxsize=256)
def _custom_printer(kind_info: kinds.KindInfo) -> Printer:
    declared = tuple(kind_info.printer_columns or ()) or _DEFAULT_CUSTOM_COLUMNS
    columns = [NAME]
    for column in declared:
        description: Doc = column.description or (
            CREATED_DOC if column is _DEFAULT_CUSTOM_COLUMNS[0]
            else f"Custom resource definition column (in JSONPath format): {column.json_path}")
        columns.append(Column(column.name, _json_cell(column), type=column.type, format=column.format,
                              description=description, priority=column.priority))
    return Printer(tuple(columns))


def printer_for(kind_info: kinds.KindInfo) -> Printer:
    """The kind's table: custom resources by their printer columns, built-ins by `TABLES`."""
    key = (kind_info.group, kind_info.kind)
    if kind_info.custom or (kind_info.printer_columns is not None and key not in TABLES):
        return _custom_printer(kind_info)
    return TABLES.get(key, DEFAULT)


def columns_for(kind_info: kinds.KindInfo) -> list[dict[str, Any]]:
    """Column definitions exactly as the server sends them (every column, wide ones included)."""
    return [column.definition() for column in printer_for(kind_info).columns]


# --------------------------------------------------------------------------- tables

INCLUDE_OBJECT_VALUES = ("", "Metadata", "None", "Object")


def validate_include_object(value: str | None) -> str:
    """The `includeObject` query parameter (default Metadata); anything else is a 400."""
    if value is None or value == "":
        return "Metadata"
    if value not in INCLUDE_OBJECT_VALUES:
        supported = ", ".join(f'"{v}"' for v in INCLUDE_OBJECT_VALUES)
        raise errors.bad_request("Unable to convert to Table as requested: includeObject: Unsupported value: "
                                 f'"{value}": supported values: {supported}')
    return value


def _row_object(obj: Object, include_object: str, api_version: str) -> Any:
    if include_object == "None":
        return None
    if include_object == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": obj.get("metadata") or {}}


def _table_meta(objects: Sequence[Object], list_meta: Mapping[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if list_meta is not None:
        for key in ("resourceVersion", "continue", "remainingItemCount"):
            if list_meta.get(key) not in (None, ""):
                meta[key] = list_meta[key]
    elif len(objects) == 1:
        rv = (objects[0].get("metadata") or {}).get("resourceVersion")
        if rv:
            meta["resourceVersion"] = rv
    return meta


UNKNOWN = "<unknown>"


def _guarded(fallback: Any, compute: Callable[..., Any], *args: Any) -> Any:
    """One object the printer cannot read (stored before validation caught its shape) shows
    `<unknown>` in its cells; it never turns a whole `kubectl get` into a 500."""
    try:
        return compute(*args)
    except Exception:  # any shape a printer did not expect
        log.debug("printer failed on an object", exc_info=True)
        return fallback


def build_table(kind_info: kinds.KindInfo, objects: list[Object], *, include_object: str = "Metadata",
                now: datetime | None = None, list_meta: dict[str, Any] | None = None,
                no_headers: bool = False, table_version: str = "v1") -> dict[str, Any]:
    """A meta.k8s.io Table of `objects` (a list's items, or the one object of a GET/watch event).

    `list_meta` is the list's metadata (resourceVersion, continue, remainingItemCount); without
    it a single object's resourceVersion is used. `no_headers` leaves out the column definitions,
    as a real server does for every watch event after the first. `table_version` is the Table
    group version negotiated from Accept ("v1" or "v1beta1").
    """
    include = validate_include_object(include_object)
    moment = now or datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    printer = printer_for(kind_info)
    api_version = f"meta.k8s.io/{table_version}"
    ordered = _guarded(objects, printer.order, list(objects)) if printer.order else objects
    rows: list[dict[str, Any]] = []
    for obj in ordered:
        row = Row(obj, moment)
        entry: dict[str, Any] = {"cells": [_guarded(UNKNOWN, column.cell, row) for column in printer.columns]}
        conditions = _guarded([], printer.conditions, row) if printer.conditions else []
        if conditions:
            entry["conditions"] = conditions
        entry["object"] = _row_object(obj, include, api_version)
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": _table_meta(objects, list_meta),
        "columnDefinitions": None if no_headers else [c.definition() for c in printer.columns],
        "rows": rows if rows else printer.rows_when_empty,
    }


# --------------------------------------------------------------------------- content negotiation

_TABLE_VERSIONS = ("v1", "v1beta1")
_SERIALIZABLE = ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf")


@dataclasses.dataclass(frozen=True)
class _Clause:
    media_type: str
    params: dict[str, str]
    q: float


def _parse_accept(accept: str) -> list[_Clause]:
    clauses = []
    for raw in accept.split(","):
        parts = [p.strip() for p in raw.split(";")]
        if not parts[0]:
            continue
        params: dict[str, str] = {}
        for part in parts[1:]:
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 1.0
        clauses.append(_Clause(parts[0].lower(), params, q))
    return sorted(clauses, key=lambda c: -c.q)


def negotiate_table(accept: str) -> str | None:
    """The Table version ("v1"/"v1beta1") the client asks for, or None for a plain object.

    The first acceptable clause (by quality, then order) wins, as the server's negotiation
    does; a Table clause for an unknown group or version is skipped, not an error.
    """
    for clause in _parse_accept(accept):
        if clause.q <= 0:
            continue
        wants_table = clause.params.get("as") == "Table"
        if wants_table:
            if (clause.media_type in _SERIALIZABLE and clause.params.get("g") == "meta.k8s.io"
                    and clause.params.get("v") in _TABLE_VERSIONS):
                return clause.params["v"]
            continue
        if clause.params.get("as"):
            continue  # another conversion (PartialObjectMetadata...): not ours to decide here
        if clause.media_type in (*_SERIALIZABLE, "application/*", "*/*", "application/x-yaml", "text/yaml"):
            return None
    return None


def parse_accept_table(accept: str) -> bool:
    """True when the Accept header asks for a meta.k8s.io Table (v1 or v1beta1) first."""
    return negotiate_table(accept) is not None


