"""A Pod's status from what the runtime holds and what the worker knows (a pure function).

This is the part of a kubelet that `kubectl get pods`, `describe`, controllers and GitLab
Runner read, so it follows upstream closely:
- each container's state comes from its newest instance and `lastState` from the one
  before; a container that will be (re)started shows the waiting reason of its last sync
  failure (`ErrImagePull`, `CrashLoopBackOff`, `CreateContainerConfigError`, ...) with
  `lastState` the instance that ended; `restartCount` is the newest instance's attempt;
- phase as upstream's getPhase: Pending while initializing or waiting, Running while any
  container runs (or will be restarted), Succeeded/Failed when all have ended for good;
- conditions PodReadyToStartContainers, Initialized, ContainersReady and Ready (with
  readiness gates), keeping the conditions others own (PodScheduled, DisruptionTarget,
  readiness-gate types).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from socialweb_computer.node import pleg, podspec

Object = dict[str, Any]
OURS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclasses.dataclass
class WorkerView:
    """What the pod worker knows beyond the runtime's state."""

    waiting: dict[str, tuple[str, str]]  # container → (reason, message) of its last failed start
    ready: dict[str, bool]  # readiness probe results (container id → ready)
    started: dict[str, bool]  # startup probe results (container id → started)
    has_readiness: set[str]  # containers with a readiness probe
    has_startup: set[str]
    pod_ip: str
    host_ip: str
    start_time: str
    sandbox_ready: bool
    terminal: tuple[str, str, str] | None = None  # (phase, reason, message) decided by the worker
    termination_messages: dict[str, str] = dataclasses.field(default_factory=dict)  # container id → message


def rfc3339(nanos: int) -> str:
    if nanos <= 0:
        return ""
    return datetime.datetime.fromtimestamp(nanos / 1e9, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminated(instance: pleg.Instance, message: str) -> Object:
    state: Object = {
        "exitCode": instance.exit_code,
        "reason": instance.reason or ("Completed" if instance.exit_code == 0 else "Error"),
        "startedAt": rfc3339(instance.started_at) or None,
        "finishedAt": rfc3339(instance.finished_at) or None,
        "containerID": f"containerd://{instance.id}",
    }
    text = message or instance.message
    if text:
        state["message"] = text
    return {"terminated": state}


def is_sidecar(container: Object) -> bool:
    return container.get("restartPolicy") == "Always"


def will_restart(pod: Object, container: Object, instance: pleg.Instance | None, *, init: bool) -> bool:
    """Upstream's ShouldContainerBeRestarted, for a container whose newest instance is `instance`."""
    if instance is None or not instance.exited:
        return instance is None
    if init and is_sidecar(container):
        return True
    policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
    if init:
        return instance.exit_code != 0 and policy != "Never"
    if policy == "Never":
        return False
    return policy == "Always" or instance.exit_code != 0


def container_status(
    pod: Object,
    container: Object,
    record: pleg.PodRecord,
    view: WorkerView,
    *,
    init: bool,
    image_of: dict[str, str],
) -> Object:
    name = container["name"]
    instances = record.of(name)
    current = instances[0] if instances else None
    previous = instances[1] if len(instances) > 1 else None
    status: Object = {
        "name": name,
        "image": container.get("image", ""),
        "imageID": "",
        "ready": False,
        "restartCount": current.attempt if current else 0,
        "started": False,
        "state": {},
        "lastState": {},
    }
    if current is not None:
        status["image"] = current.image or status["image"]
        status["imageID"] = current.image_ref
        status["containerID"] = f"containerd://{current.id}"
    if previous is not None and previous.exited:
        status["lastState"] = _terminated(previous, view.termination_messages.get(previous.id, ""))
    waiting = view.waiting.get(name)
    if current is not None and current.running:
        started = view.started.get(current.id, name not in view.has_startup)
        status["state"] = {"running": {"startedAt": rfc3339(current.started_at)}}
        status["started"] = started
        ready = started and view.ready.get(current.id, name not in view.has_readiness)
        # Plain init containers are never "ready"; sidecars and regular containers are.
        status["ready"] = bool(ready) and (not init or is_sidecar(container))
    elif (
        current is not None
        and current.exited
        and not (waiting and will_restart(pod, container, current, init=init))
    ):
        status["state"] = _terminated(current, view.termination_messages.get(current.id, ""))
    else:
        if current is not None and current.exited:
            status["lastState"] = _terminated(current, view.termination_messages.get(current.id, ""))
        initializing = not init and _initializing(pod, record, view)
        reason, message = waiting or (("PodInitializing", "") if initializing else ("ContainerCreating", ""))
        status["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    if not status["imageID"] and name in image_of:
        status["image"] = image_of[name]
    return status


def _init_done(pod: Object, record: pleg.PodRecord, view: WorkerView) -> tuple[bool, list[str]]:
    """Whether initialization is complete, and the init containers still incomplete."""
    spec = pod.get("spec") or {}
    incomplete = []
    for container in spec.get("initContainers") or []:
        instances = record.of(container["name"])
        current = instances[0] if instances else None
        if is_sidecar(container):
            started = (
                current is not None
                and current.running
                and view.started.get(current.id, container["name"] not in view.has_startup)
            )
            if not started and not _main_started(pod, record):
                incomplete.append(container["name"])
        elif not (current is not None and current.exited and current.exit_code == 0) and not _main_started(
            pod, record
        ):
            incomplete.append(container["name"])
    return not incomplete, incomplete


def _main_started(pod: Object, record: pleg.PodRecord) -> bool:
    return any(record.of(c["name"]) for c in (pod.get("spec") or {}).get("containers") or [])


def _initializing(pod: Object, record: pleg.PodRecord, view: WorkerView) -> bool:
    done, _ = _init_done(pod, record, view)
    return not done


def phase(
    pod: Object, init_statuses: list[Object], statuses: list[Object], record: pleg.PodRecord, view: WorkerView
) -> str:
    if view.terminal is not None:
        return view.terminal[0]
    spec = pod.get("spec") or {}
    policy = spec.get("restartPolicy", "Always")
    init_specs = {c["name"]: c for c in spec.get("initContainers") or []}
    pending_init = failed_init = 0
    for status in init_statuses:
        container = init_specs[status["name"]]
        state = status["state"]
        if is_sidecar(container):
            if not status.get("started"):
                pending_init += 1
            continue
        if "terminated" in state:
            if state["terminated"]["exitCode"] != 0:
                failed_init += 1
        elif "waiting" in state and status["lastState"].get("terminated", {}).get("exitCode", 0) != 0:
            failed_init += 1
        else:
            pending_init += 1
    if _main_started(pod, record):
        pending_init = 0
    if failed_init and policy == "Never":
        return "Failed"
    running = waiting = stopped = succeeded = 0
    for status in statuses:
        state = status["state"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if state["terminated"]["exitCode"] == 0:
                succeeded += 1
        elif status["lastState"].get("terminated"):
            stopped += 1
        else:
            waiting += 1
    if pending_init or failed_init:
        return "Pending"
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if any("terminated" not in s["state"] for s in statuses):
            return "Running"  # ended, but some will be restarted
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def _condition(
    type_: str, status: bool, reason: str = "", message: str = "", previous: dict[str, Object] | None = None
) -> Object:
    value = "True" if status else "False"
    before = (previous or {}).get(type_)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    transition = before.get("lastTransitionTime") if before and before.get("status") == value else now
    out: Object = {"type": type_, "status": value, "lastProbeTime": None, "lastTransitionTime": transition}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def conditions(
    pod: Object,
    phase_: str,
    init_statuses: list[Object],
    statuses: list[Object],
    record: pleg.PodRecord,
    view: WorkerView,
) -> list[Object]:
    current = list((pod.get("status") or {}).get("conditions") or [])
    previous = {c.get("type", ""): c for c in current}
    terminal = phase_ in ("Succeeded", "Failed")
    init_done, incomplete = _init_done(pod, record, view)
    ours = [_condition("PodReadyToStartContainers", view.sandbox_ready, previous=previous)]
    if terminal and init_done:
        ours.append(
            _condition(
                "Initialized", True, "PodCompleted" if phase_ == "Succeeded" else "", previous=previous
            )
        )
    elif init_done:
        ours.append(_condition("Initialized", True, previous=previous))
    else:
        ours.append(
            _condition(
                "Initialized",
                False,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(incomplete)}]",
                previous,
            )
        )
    spec_inits = {c["name"]: c for c in (pod.get("spec") or {}).get("initContainers") or []}
    unready = [s["name"] for s in init_statuses if is_sidecar(spec_inits[s["name"]]) and not s["ready"]]
    unready += [s["name"] for s in statuses if not s["ready"]]
    if terminal:
        containers_ready = _condition("ContainersReady", False, "PodCompleted", previous=previous)
        ready = _condition("Ready", False, "PodCompleted", previous=previous)
    elif not init_done:
        message = f"containers with incomplete status: [{' '.join(incomplete)}]"
        containers_ready = _condition("ContainersReady", False, "ContainersNotInitialized", message, previous)
        ready = _condition("Ready", False, "ContainersNotInitialized", message, previous)
    elif unready:
        message = f"containers with unready status: [{' '.join(unready)}]"
        containers_ready = _condition("ContainersReady", False, "ContainersNotReady", message, previous)
        ready = _condition("Ready", False, "ContainersNotReady", message, previous)
    else:
        containers_ready = _condition("ContainersReady", True, previous=previous)
        ready = _readiness_gates(pod, previous)
    ours += [ready, containers_ready]
    others = [c for c in current if c.get("type") not in OURS]
    order = {
        "PodReadyToStartContainers": 0,
        "Initialized": 1,
        "Ready": 2,
        "ContainersReady": 3,
        "PodScheduled": 4,
    }
    return sorted(ours + others, key=lambda c: order.get(c.get("type", ""), 5))


def _readiness_gates(pod: Object, previous: dict[str, Object]) -> Object:
    for gate in (pod.get("spec") or {}).get("readinessGates") or []:
        kind = gate.get("conditionType", "")
        condition = previous.get(kind)
        if condition is None:
            return _condition(
                "Ready",
                False,
                "ReadinessGatesNotReady",
                f'corresponding condition of pod readiness gate "{kind}" does not exist.',
                previous,
            )
        if condition.get("status") != "True":
            return _condition(
                "Ready",
                False,
                "ReadinessGatesNotReady",
                f'the status of pod readiness gate "{kind}" is not "True", but {condition.get("status", "")}',
                previous,
            )
    return _condition("Ready", True, previous=previous)


def pod_status(pod: Object, record: pleg.PodRecord, view: WorkerView, image_of: dict[str, str]) -> Object:
    spec = pod.get("spec") or {}
    init_statuses = [
        container_status(pod, c, record, view, init=True, image_of=image_of)
        for c in spec.get("initContainers") or []
    ]
    statuses = [
        container_status(pod, c, record, view, init=False, image_of=image_of)
        for c in spec.get("containers") or []
    ]
    ephemeral = [
        container_status(pod, c, record, view, init=False, image_of=image_of)
        for c in spec.get("ephemeralContainers") or []
        if record.of(c["name"]) or c["name"] in view.waiting
    ]
    phase_ = phase(pod, init_statuses, statuses, record, view)
    status: Object = {
        "phase": phase_,
        "conditions": conditions(pod, phase_, init_statuses, statuses, record, view),
        "hostIP": view.host_ip,
        "hostIPs": [{"ip": view.host_ip}] if view.host_ip else [],
        "startTime": view.start_time,
        "containerStatuses": statuses,
        "qosClass": podspec.qos_class(pod),
    }
    if view.pod_ip:
        status["podIP"] = view.pod_ip
        status["podIPs"] = [{"ip": view.pod_ip}]
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    if ephemeral:
        status["ephemeralContainerStatuses"] = ephemeral
    if view.terminal is not None and view.terminal[1]:
        status["reason"] = view.terminal[1]
        status["message"] = view.terminal[2]
    return status
