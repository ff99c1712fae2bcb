"""Resource quantities and what a pod asks of a node, the way the kube-scheduler counts them.

Why: the resource-fit filter and the least-allocated score compare a pod's requests with a
node's `status.allocatable`, both written as Kubernetes quantities ("500m", "1.5Gi", "2e3").
Amounts are plain ints here: CPU in millicores, everything else in whole units (bytes for
memory), rounded up like Go's `Quantity.MilliValue()` / `Value()`.
Used by `scheduling.cache`, `scheduling.predicates` and `scheduling.scoring`.
"""

from __future__ import annotations

import decimal
from typing import Any

from socialweb_computer.api import quantity

Object = dict[str, Any]
Resources = dict[str, int]

CPU, MEMORY, EPHEMERAL = "cpu", "memory", "ephemeral-storage"
# What the scoring plugins assume for a container that requests nothing (upstream's
# DefaultMilliCPURequest / DefaultMemoryRequest), so empty pods still spread.
DEFAULT_MILLI_CPU = 100
DEFAULT_MEMORY = 200 * 1024 * 1024

def amount(name: str, value: object) -> int:
    """A quantity as the scheduler's integer: millicores for cpu, rounded-up units otherwise."""
    return quantity.milli_value(value) if name == CPU else quantity.int_value(value)


def amounts(quantities: Object | None) -> Resources:
    """A ResourceList as integers; unparseable entries count as zero (validation is not ours)."""
    out: Resources = {}
    for name, value in (quantities or {}).items():
        try:
            out[name] = amount(name, value)
        except (quantity.QuantityError, decimal.InvalidOperation):
            continue
    return out


def add(into: Resources, other: Resources, sign: int = 1) -> None:
    for name, value in other.items():
        into[name] = into.get(name, 0) + sign * value


def _container_requests(container: Object) -> Resources:
    # The apiserver defaults a request to its limit when only the limit is given.
    res = container.get("resources") or {}
    requests = amounts(res.get("limits"))
    requests.update(amounts(res.get("requests")))
    return requests


def _max_into(into: Resources, other: Resources) -> None:
    for name, value in other.items():
        if value > into.get(name, 0):
            into[name] = value


def pod_requests(spec: Object) -> Resources:
    """What a pod reserves on its node: the containers' sum (with restartable init containers,
    i.e. sidecars) or the largest init container step, whichever is larger, plus overhead;
    pod-level `spec.resources` replaces the cpu/memory figures it names."""
    total: Resources = {}
    for c in spec.get("containers") or []:
        add(total, _container_requests(c))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or []:
        requests = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            add(sidecars, requests)
            step = dict(sidecars)
        else:
            step = dict(sidecars)
            add(step, requests)
        _max_into(init_peak, step)
    add(total, sidecars)
    _max_into(total, init_peak)
    pod_level = amounts((spec.get("resources") or {}).get("requests"))
    for name in (CPU, MEMORY):
        if name in pod_level:
            total[name] = pod_level[name]
    add(total, amounts(spec.get("overhead")))
    return {k: v for k, v in total.items() if v}


def nonzero_requests(spec: Object) -> tuple[int, int]:
    """(millicores, bytes) for scoring: a container that names no cpu or memory request counts
    as the scheduler's defaults, so pods without requests still spread across nodes."""
    cpu = memory = 0
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        requested = {**amounts(res.get("limits")), **amounts(res.get("requests"))}
        named = set(res.get("requests") or {}) | set(res.get("limits") or {})
        cpu += requested.get(CPU, 0) if CPU in named else DEFAULT_MILLI_CPU
        memory += requested.get(MEMORY, 0) if MEMORY in named else DEFAULT_MEMORY
    pod_level = amounts((spec.get("resources") or {}).get("requests"))
    cpu = pod_level.get(CPU, cpu)
    memory = pod_level.get(MEMORY, memory)
    overhead = amounts(spec.get("overhead"))
    return cpu + overhead.get(CPU, 0), memory + overhead.get(MEMORY, 0)


def host_ports(spec: Object) -> list[tuple[str, str, int]]:
    """(hostIP, protocol, hostPort) of every container port that claims a host port."""
    out = []
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for port in c.get("ports") or []:
            number = port.get("hostPort") or 0
            if isinstance(number, int) and number > 0:
                ip = port.get("hostIP") or "0.0.0.0"
                out.append((ip, port.get("protocol") or "TCP", number))
    return out


def ports_conflict(wanted: list[tuple[str, str, int]], used: dict[tuple[str, str, int], int]) -> bool:
    """A wildcard host IP (0.0.0.0) conflicts with every address on the same protocol and port."""
    for ip, protocol, port in wanted:
        for (used_ip, used_protocol, used_port), count in used.items():
            if count <= 0 or used_port != port or used_protocol != protocol:
                continue
            if ip == used_ip or "0.0.0.0" in (ip, used_ip):
                return True
    return False

