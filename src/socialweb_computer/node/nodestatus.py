"""The Node object a node agent registers and the status it keeps current, as a kubelet does.

Capacity comes from the node's size (its vCPUs, memory and root filesystem are what the
bidder gave it); allocatable subtracts a kubelet's default hard eviction thresholds
(memory.available<100Mi, nodefs.available<10%), so that the scheduler never packs a node
to the point where the agent would have to evict. The pressure conditions come from real
measurements (`Measurements`), read from the node's own cgroup or /proc and its disk.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
from pathlib import Path
from typing import Any

from socialweb_computer.node import config as config_mod

Object = dict[str, Any]
MEMORY_EVICTION_BYTES = 100 << 20
DISK_EVICTION_FRACTION = 0.10
PID_PRESSURE_FRACTION = 0.90
MAX_REPORTED_IMAGES = 50
KUBELET_PORT = 10250

# (type, reason and message when fine, reason and message under pressure).
PRESSURE_CONDITIONS = (
    (
        "MemoryPressure",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available",
    ),
    (
        "DiskPressure",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
        "KubeletHasDiskPressure",
        "kubelet has disk pressure",
    ),
    (
        "PIDPressure",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
        "KubeletHasInsufficientPID",
        "kubelet has insufficient PID available",
    ),
)


@dataclasses.dataclass(frozen=True)
class Measurements:
    memory_available: int  # bytes
    disk_available: int
    disk_capacity: int
    pids_used: int
    pids_limit: int
    runtime_ready: bool
    network_ready: bool
    runtime_message: str = ""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity_ki(num_bytes: int) -> str:
    return f"{num_bytes // 1024}Ki"


def capacity(size: config_mod.Size) -> dict[str, str]:
    return {
        "cpu": str(size.vcpu),
        "memory": quantity_ki(size.mem_mib << 20),
        "ephemeral-storage": quantity_ki(size.rootfs_mib << 20),
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": str(size.max_pods),
    }


def allocatable(size: config_mod.Size) -> dict[str, str]:
    memory = max(0, (size.mem_mib << 20) - MEMORY_EVICTION_BYTES)
    disk = int((size.rootfs_mib << 20) * (1 - DISK_EVICTION_FRACTION))
    return {**capacity(size), "memory": quantity_ki(memory), "ephemeral-storage": str(disk)}


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "Linux"


def node_info(runtime_version: str, machine_id: str) -> Object:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return {
        "machineID": machine_id,
        "systemUUID": machine_id,
        "bootID": _read("/proc/sys/kernel/random/boot_id"),
        "kernelVersion": platform.release(),
        "osImage": os_image(),
        "containerRuntimeVersion": runtime_version,
        "kubeletVersion": config_mod.KUBELET_VERSION,
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": arch,
    }


def labels(config: config_mod.NodeConfig) -> dict[str, str]:
    arch = node_info("", "")["architecture"]
    return {
        "beta.kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "kubernetes.io/hostname": config.name,
        "kubernetes.io/os": "linux",
        **config.labels,
    }


def _condition(
    type_: str, status: str, reason: str, message: str, previous: Object | None, now: str
) -> Object:
    transition = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {
        "type": type_,
        "status": status,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition or now,
        "reason": reason,
        "message": message,
    }


def conditions(measured: Measurements, previous: list[Object]) -> list[Object]:
    now = _now()
    before = {c.get("type"): c for c in previous}
    pressure = {
        "MemoryPressure": measured.memory_available < MEMORY_EVICTION_BYTES,
        "DiskPressure": measured.disk_capacity > 0
        and measured.disk_available < measured.disk_capacity * DISK_EVICTION_FRACTION,
        "PIDPressure": measured.pids_limit > 0
        and measured.pids_used > measured.pids_limit * PID_PRESSURE_FRACTION,
    }
    out = []
    for type_, ok_reason, ok_message, bad_reason, bad_message in PRESSURE_CONDITIONS:
        bad = pressure[type_]
        out.append(
            _condition(
                type_,
                "True" if bad else "False",
                bad_reason if bad else ok_reason,
                bad_message if bad else ok_message,
                before.get(type_),
                now,
            )
        )
    if measured.runtime_ready and measured.network_ready:
        ready = _condition(
            "Ready", "True", "KubeletReady", "kubelet is posting ready status", before.get("Ready"), now
        )
    else:
        ready = _condition(
            "Ready", "False", "KubeletNotReady", measured.runtime_message, before.get("Ready"), now
        )
    out.append(ready)
    return out


def images(listed: list[Any]) -> list[Object]:
    """Node.status.images from CRI ListImages: biggest first, names are tags then digests."""
    entries = []
    for image in listed:
        names = list(image.repo_digests) + list(image.repo_tags)
        if names:
            entries.append({"names": names, "sizeBytes": int(image.size)})
    entries.sort(key=lambda e: -e["sizeBytes"])
    return entries[:MAX_REPORTED_IMAGES]


def status(
    config: config_mod.NodeConfig,
    measured: Measurements,
    info: Object,
    listed_images: list[Any],
    previous: Object | None,
) -> Object:
    previous = previous or {}
    return {
        "capacity": capacity(config.size),
        "allocatable": allocatable(config.size),
        "conditions": conditions(measured, previous.get("conditions") or []),
        "addresses": [
            {"type": "InternalIP", "address": config.internal_ip},
            {"type": "Hostname", "address": config.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": config.agent_port or KUBELET_PORT}},
        "nodeInfo": info,
        "images": images(listed_images),
    }


def node_object(config: config_mod.NodeConfig, node_status: Object) -> Object:
    spec: Object = {"podCIDR": config.pod_cidr, "podCIDRs": [config.pod_cidr]}
    if config.taints:
        spec["taints"] = config.taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.name,
            "labels": labels(config),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": node_status,
    }


def machine_id(state_file: Path) -> str:
    """A stable id per node (its directory), as /etc/machine-id is per machine."""
    try:
        return state_file.read_text().strip()
    except OSError:
        value = os.urandom(16).hex()
        state_file.write_text(value + "\n")
        return value


def comparable(node_status: Object) -> Object:
    """A status without heartbeat times: what decides whether it changed."""
    return {
        **node_status,
        "conditions": [
            {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
            for c in node_status.get("conditions") or []
        ],
    }
