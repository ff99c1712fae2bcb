"""From a Pod's spec to what CRI is asked: sandbox and container configs, as a kubelet builds them.

Pure functions of the pod, the node's settings and what has been resolved (environment,
volume paths, image user): QoS class and cgroup placement, cgroup limits (cpu shares,
CFS quota, memory limit, OOM score), security context, DNS (`dnsPolicy`/`dnsConfig`), the
managed `/etc/hosts` (hostAliases, hostname and subdomain), mounts with `subPath`, and the
labels and annotations a kubelet writes so that a restarted agent recognises its containers.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from socialweb_computer.api import quantity
from socialweb_computer.node import pleg
from socialweb_computer.node.cri.generated import api_pb2 as api

Object = dict[str, Any]
RESTART_COUNT = "io.kubernetes.container.restartCount"
TERMINATION_MESSAGE_PATH = "io.kubernetes.container.terminationMessagePath"
TERMINATION_MESSAGE_POLICY = "io.kubernetes.container.terminationMessagePolicy"
POD_GRACE = "io.kubernetes.pod.terminationGracePeriod"
CPU_PERIOD = 100_000
MIN_SHARES = 2
MIN_QUOTA = 1000
MAX_HOSTNAME = 63
PROTOCOLS = {"TCP": api.TCP, "UDP": api.UDP, "SCTP": api.SCTP}
PROPAGATION = {
    "None": api.PROPAGATION_PRIVATE,
    "HostToContainer": api.PROPAGATION_HOST_TO_CONTAINER,
    "Bidirectional": api.PROPAGATION_BIDIRECTIONAL,
}


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    name: str
    cgroup_root: str
    logs_dir: Path
    memory_capacity: int
    resolv_conf: str
    cluster_dns: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"


def all_containers(pod: Object) -> list[Object]:
    spec = pod.get("spec") or {}
    return [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]


def _resources(container: Object) -> tuple[dict[str, Any], dict[str, Any]]:
    res = container.get("resources") or {}
    limits = res.get("limits") or {}
    requests = {**limits, **(res.get("requests") or {})}  # a request defaults to its limit
    return requests, limits


def qos_class(pod: Object) -> str:
    """Guaranteed, Burstable or BestEffort, from cpu and memory requests and limits."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    any_set, guaranteed = False, True
    for container in containers:
        requests, limits = _resources(container)
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            if name not in limits or quantity.parse_quantity(
                requests.get(name, "0")
            ) != quantity.parse_quantity(limits[name]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_cgroup(settings: NodeSettings, pod: Object) -> str:
    qos = qos_class(pod)
    middle = "" if qos == "Guaranteed" else qos.lower() + "/"
    return f"{settings.cgroup_root.rstrip('/')}/kubepods/{middle}pod{pod['metadata']['uid']}"


def oom_score_adj(pod: Object, container: Object, memory_capacity: int) -> int:
    qos = qos_class(pod)
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    requests, _ = _resources(container)
    request = quantity.int_value(requests.get("memory", "0"))
    score = 1000 - (1000 * request) // max(memory_capacity, 1)
    return int(min(max(score, 2), 999))


def container_resources(pod: Object, container: Object, memory_capacity: int) -> api.LinuxContainerResources:
    requests, limits = _resources(container)
    cpu_request = quantity.milli_value(requests["cpu"]) if "cpu" in requests else 0
    shares = max(MIN_SHARES, cpu_request * 1024 // 1000) if cpu_request else MIN_SHARES
    out = api.LinuxContainerResources(
        cpu_shares=shares, oom_score_adj=oom_score_adj(pod, container, memory_capacity)
    )
    if "cpu" in limits:
        out.cpu_period = CPU_PERIOD
        out.cpu_quota = max(MIN_QUOTA, math.ceil(quantity.milli_value(limits["cpu"]) * CPU_PERIOD / 1000))
    if "memory" in limits:
        out.memory_limit_in_bytes = quantity.int_value(limits["memory"])
    return out


# ---------------------------------------------------------------- DNS and hosts


def read_resolv_conf(path: str) -> tuple[list[str], list[str], list[str]]:
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    try:
        text = Path(path).read_text()
    except OSError:
        return servers, searches, options
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) > 1:
            servers.append(fields[1])
        elif fields[0] in ("search", "domain"):
            searches = fields[1:]
        elif fields[0] == "options":
            options.extend(fields[1:])
    return servers, searches, options


def effective_dns_policy(pod: Object, settings: NodeSettings) -> tuple[str, bool]:
    """(policy, fell back): ClusterFirst without a cluster DNS falls back to Default, as upstream."""
    spec = pod.get("spec") or {}
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        return "Default", False
    if policy == "ClusterFirstWithHostNet":
        policy = "ClusterFirst"
    if policy == "ClusterFirst" and not settings.cluster_dns:
        return "Default", True
    return policy, False


def dns_config(pod: Object, settings: NodeSettings) -> api.DNSConfig:
    spec = pod.get("spec") or {}
    policy, _ = effective_dns_policy(pod, settings)
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    if policy == "Default":
        servers, searches, options = read_resolv_conf(settings.resolv_conf)
    elif policy == "ClusterFirst":
        namespace = pod["metadata"].get("namespace", "default")
        domain = settings.cluster_domain
        servers = list(settings.cluster_dns)
        _, host_searches, _ = read_resolv_conf(settings.resolv_conf)
        searches = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain, *host_searches]
        options = ["ndots:5"]
    extra = spec.get("dnsConfig") or {}
    servers += [s for s in extra.get("nameservers") or [] if s not in servers]
    searches += [s for s in extra.get("searches") or [] if s not in searches]
    merged = {o.split(":", 1)[0]: o for o in options}
    for option in extra.get("options") or []:
        name = option.get("name", "")
        merged[name] = f"{name}:{option['value']}" if option.get("value") is not None else name
    return api.DNSConfig(servers=servers[:3], searches=searches[:32], options=list(merged.values()))


def hostname(pod: Object, settings: NodeSettings) -> tuple[str, str]:
    """(hostname, fully qualified name or "")."""
    spec = pod.get("spec") or {}
    name = (spec.get("hostname") or pod["metadata"]["name"])[:MAX_HOSTNAME].rstrip("-.")
    fqdn = ""
    if spec.get("subdomain"):
        namespace = pod["metadata"].get("namespace", "default")
        fqdn = f"{name}.{spec['subdomain']}.{namespace}.svc.{settings.cluster_domain}"
    if spec.get("setHostnameAsFQDN") and fqdn:
        return fqdn[:64], fqdn
    return name, fqdn


def etc_hosts(pod: Object, settings: NodeSettings, pod_ips: list[str]) -> str:
    spec = pod.get("spec") or {}
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
    ]
    name, fqdn = hostname(pod, settings)
    short = name.split(".", 1)[0]
    for ip in pod_ips:
        lines.append(f"{ip}\t{fqdn}\t{short}" if fqdn else f"{ip}\t{short}")
    aliases = spec.get("hostAliases") or []
    if aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        for alias in aliases:
            lines.append(f"{alias.get('ip', '')}\t" + "\t".join(alias.get("hostnames") or []))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- sandbox and containers


def _namespace_options(pod: Object, *, container: bool) -> api.NamespaceOption:
    spec = pod.get("spec") or {}
    pid = (
        api.NODE
        if spec.get("hostPID")
        else (api.POD if spec.get("shareProcessNamespace") or not container else api.CONTAINER)
    )
    return api.NamespaceOption(
        network=api.NODE if spec.get("hostNetwork") else api.POD,
        pid=pid,
        ipc=api.NODE if spec.get("hostIPC") else api.POD,
    )


def _seccomp(context: Object) -> api.SecurityProfile | None:
    profile = context.get("seccompProfile")
    if not profile:
        return None
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return api.SecurityProfile(profile_type=api.SecurityProfile.RuntimeDefault)
    if kind == "Localhost":
        return api.SecurityProfile(
            profile_type=api.SecurityProfile.Localhost, localhost_ref=profile.get("localhostProfile", "")
        )
    return api.SecurityProfile(profile_type=api.SecurityProfile.Unconfined)


def sandbox_config(pod: Object, settings: NodeSettings, attempt: int) -> api.PodSandboxConfig:
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    context = spec.get("securityContext") or {}
    host, _ = hostname(pod, settings)
    ports = []
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                ports.append(
                    api.PortMapping(
                        protocol=PROTOCOLS.get(port.get("protocol", "TCP"), api.TCP),
                        container_port=int(port["containerPort"]),
                        host_port=int(port["hostPort"]),
                        host_ip=port.get("hostIP", ""),
                    )
                )
    security = api.LinuxSandboxSecurityContext(
        namespace_options=_namespace_options(pod, container=False),
        privileged=any(((c.get("securityContext") or {}).get("privileged")) for c in all_containers(pod)),
        supplemental_groups=[int(g) for g in context.get("supplementalGroups") or []],
    )
    if context.get("runAsUser") is not None:
        security.run_as_user.value = int(context["runAsUser"])
    if context.get("runAsGroup") is not None:
        security.run_as_group.value = int(context["runAsGroup"])
    seccomp = _seccomp(context)
    if seccomp is not None:
        security.seccomp.CopyFrom(seccomp)
    return api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(
            name=meta["name"], uid=meta["uid"], namespace=meta.get("namespace", ""), attempt=attempt
        ),
        hostname="" if spec.get("hostNetwork") else host,
        log_directory=str(pod_log_dir(settings, pod)),
        dns_config=dns_config(pod, settings),
        port_mappings=ports,
        labels={
            **(meta.get("labels") or {}),
            pleg.POD_NAME: meta["name"],
            pleg.POD_NAMESPACE: meta.get("namespace", ""),
            pleg.POD_UID: meta["uid"],
        },
        annotations=dict(meta.get("annotations") or {}),
        linux=api.LinuxPodSandboxConfig(
            cgroup_parent=pod_cgroup(settings, pod),
            security_context=security,
            sysctls={s.get("name", ""): str(s.get("value", "")) for s in context.get("sysctls") or []},
        ),
    )


def pod_log_dir(settings: NodeSettings, pod: Object) -> Path:
    meta = pod["metadata"]
    return settings.logs_dir / f"{meta.get('namespace', '')}_{meta['name']}_{meta['uid']}"


class RunAsRootError(ValueError):
    pass


def verify_run_as_non_root(pod: Object, container: Object, image_uid: int | None, image_user: str) -> None:
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    if not non_root:
        return
    meta = pod["metadata"]
    where = (
        f'(pod: "{meta["name"]}_{meta.get("namespace", "")}({meta["uid"]})", container: {container["name"]})'
    )
    uid = context.get("runAsUser", pod_context.get("runAsUser"))
    if uid is not None:
        if int(uid) == 0:
            raise RunAsRootError(f"container's runAsUser breaks non-root policy {where}")
        return
    if image_uid is None and image_user:
        raise RunAsRootError(
            f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
            f"cannot verify user is non-root {where}"
        )
    if not image_uid:
        raise RunAsRootError(f"container has runAsNonRoot and image will run as root {where}")


def container_security(
    pod: Object, container: Object, *, target_id: str = ""
) -> api.LinuxContainerSecurityContext:
    """`target_id`: the container whose PID namespace an ephemeral container joins (targetContainerName)."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}
    namespaces = _namespace_options(pod, container=True)
    if target_id:
        namespaces.pid, namespaces.target_id = api.TARGET, target_id
    out = api.LinuxContainerSecurityContext(
        namespace_options=namespaces,
        privileged=bool(context.get("privileged")),
        readonly_rootfs=bool(context.get("readOnlyRootFilesystem")),
        no_new_privs=context.get("allowPrivilegeEscalation") is False,
        supplemental_groups=[int(g) for g in pod_context.get("supplementalGroups") or []]
        + ([int(pod_context["fsGroup"])] if pod_context.get("fsGroup") is not None else []),
    )
    capabilities = context.get("capabilities") or {}
    if capabilities:
        out.capabilities.CopyFrom(
            api.Capability(
                add_capabilities=list(capabilities.get("add") or []),
                drop_capabilities=list(capabilities.get("drop") or []),
            )
        )
    for field, key in (("run_as_user", "runAsUser"), ("run_as_group", "runAsGroup")):
        value = context.get(key, pod_context.get(key))
        if value is not None:
            getattr(out, field).value = int(value)
    seccomp = _seccomp(context) or _seccomp(pod_context)
    if seccomp is not None:
        out.seccomp.CopyFrom(seccomp)
    return out


def mounts(container: Object, volume_paths: dict[str, Path], env: dict[str, str]) -> list[api.Mount]:
    from socialweb_computer.node import envvars

    out = []
    for mount in container.get("volumeMounts") or []:
        source = volume_paths.get(mount.get("name", ""))
        if source is None:
            raise KeyError(mount.get("name", ""))
        sub_path = mount.get("subPath") or envvars.expand(mount.get("subPathExpr") or "", env)
        host = source / sub_path if sub_path else source
        if sub_path and not host.exists():
            host.mkdir(parents=True, mode=0o777)
        out.append(
            api.Mount(
                container_path=mount.get("mountPath", ""),
                host_path=str(host),
                readonly=bool(mount.get("readOnly")),
                propagation=PROPAGATION.get(mount.get("mountPropagation") or "None", api.PROPAGATION_PRIVATE),
            )
        )
    return out


def container_labels(pod: Object, container: Object) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        pleg.CONTAINER_NAME: container["name"],
        pleg.POD_NAME: meta["name"],
        pleg.POD_NAMESPACE: meta.get("namespace", ""),
        pleg.POD_UID: meta["uid"],
    }


def container_annotations(pod: Object, container: Object, attempt: int) -> dict[str, str]:
    return {
        RESTART_COUNT: str(attempt),
        TERMINATION_MESSAGE_PATH: container.get("terminationMessagePath", "/dev/termination-log"),
        TERMINATION_MESSAGE_POLICY: container.get("terminationMessagePolicy", "File"),
        POD_GRACE: str((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)),
    }
