"""The Pod Security Standards as data: upstream's checks, their versions and their wording.

Each check names a level (baseline or restricted), the policy versions its revisions apply
from, and for restricted checks the baseline checks they replace. `evaluate(level, version,
metadata, spec)` runs the checks of a level at a version in upstream's order (baseline IDs
sorted, then restricted IDs sorted) and returns the failures as (reason, detail); the
admission plugin joins them into the exact `violates PodSecurity "restricted:latest": ...`
text kubectl prints. Read from k8s.io/pod-security-admission/policy; no code is shared.
Used by `admission.podsecurity`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

Object = dict[str, Any]
Version = tuple[int, int]
Result = tuple[str, str] | None  # (forbidden reason, forbidden detail) or None when allowed
CheckFn = Callable[[Object, Object], Result]

BASELINE, RESTRICTED, PRIVILEGED = "baseline", "restricted", "privileged"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)
LATEST: Version = (1, 37)  # the newest version any check has a revision for


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _quote(items: list[str] | set[str]) -> str:
    ordered = list(items)
    return '"' + '", "'.join(ordered) + '"' if ordered else ""


def _containers(spec: Object) -> Iterator[Object]:
    """visitContainers: init containers, containers, then ephemeral containers."""
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            if isinstance(container, dict):
                yield container


def _security(container: Object) -> Object:
    context = container.get("securityContext")
    return context if isinstance(context, dict) else {}


def _pod_security(spec: Object) -> Object:
    context = spec.get("securityContext")
    return context if isinstance(context, dict) else {}


def _named(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quote(names)}"


def _windows(spec: Object) -> bool:
    return ((spec.get("os") or {}).get("name")) == "windows"


def _user_namespace(spec: Object) -> bool:
    return spec.get("hostUsers") is False


# ------------------------------------------------------------------ baseline


def privileged(meta: Object, spec: Object) -> Result:
    bad = [c.get("name", "") for c in _containers(spec) if _security(c).get("privileged") is True]
    return ("privileged", f"{_named(bad)} must not set securityContext.privileged=true") if bad else None


def host_namespaces(meta: Object, spec: Object) -> Result:
    used = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f) is True]
    return ("host namespaces", ", ".join(used)) if used else None


def host_path_volumes(meta: Object, spec: Object) -> Result:
    bad = [
        v.get("name", "")
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and v.get("hostPath") is not None
    ]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)}") if bad else None


def host_ports(meta: Object, spec: Object) -> Result:
    bad, ports = [], set()
    for c in _containers(spec):
        used = [p.get("hostPort") for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort")]
        if used:
            bad.append(c.get("name", ""))
            ports.update(str(p) for p in used)
    if not bad:
        return None
    listed = sorted(ports)  # sets.String.List() sorts as strings
    return (
        "hostPort",
        f"{_named(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('hostPort', 'hostPorts', len(listed))} {', '.join(listed)}",
    )


_DEFAULT_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def _added(container: Object) -> list[str]:
    capabilities = _security(container).get("capabilities")
    return [str(c) for c in (capabilities or {}).get("add") or []] if isinstance(capabilities, dict) else []


def capabilities_baseline(meta: Object, spec: Object) -> Result:
    bad, extra = [], set()
    for c in _containers(spec):
        forbidden = [cap for cap in _added(c) if cap not in _DEFAULT_CAPABILITIES]
        if forbidden:
            bad.append(c.get("name", ""))
            extra.update(forbidden)
    if not bad:
        return None
    return (
        "non-default capabilities",
        f"{_named(bad)} must not include {_quote(sorted(extra))} in securityContext.capabilities.add",
    )


def _setters(pod_bad: bool, containers: list[str]) -> list[str]:
    out = ["pod"] if pod_bad else []
    if containers:
        out.append(_named(containers))
    return out


def app_armor_profile(meta: Object, spec: Object) -> Result:
    allowed = ("RuntimeDefault", "Localhost")
    values: set[str] = set()
    pod_profile = _pod_security(spec).get("appArmorProfile")
    pod_bad = isinstance(pod_profile, dict) and pod_profile.get("type") not in allowed
    if pod_bad:
        values.add(str(pod_profile.get("type", "")))  # type: ignore[union-attr]
    containers = []
    for c in _containers(spec):
        profile = _security(c).get("appArmorProfile")
        if isinstance(profile, dict) and profile.get("type") not in allowed:
            containers.append(c.get("name", ""))
            values.add(str(profile.get("type", "")))
    setters = _setters(pod_bad, containers)
    prefix = "container.apparmor.security.beta.kubernetes.io/"
    annotations = sorted(
        f'{k}="{v}"'
        for k, v in ((meta.get("annotations") or {}).items())
        if k.startswith(prefix) and not (not v or v == "runtime/default" or str(v).startswith("localhost/"))
    )
    listed = sorted(values)
    if annotations:
        listed += annotations
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    return (
        _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(listed)),
        f"{' and '.join(setters)} must not set AppArmor profile type to {_quote(listed)}",
    )


def _selinux(allowed_types: set[str]) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        bad_types: set[str] = set()
        flags = {"user": False, "role": False}

        def valid(options: Object) -> bool:
            ok = True
            if str(options.get("type", "")) not in allowed_types:
                ok = False
                bad_types.add(str(options.get("type", "")))
            for field in ("user", "role"):
                if options.get(field):
                    ok, flags[field] = False, True
            return ok

        pod_options = _pod_security(spec).get("seLinuxOptions")
        pod_bad = isinstance(pod_options, dict) and not valid(pod_options)
        containers = [
            c.get("name", "")
            for c in _containers(spec)
            if isinstance(_security(c).get("seLinuxOptions"), dict)
            and not valid(_security(c)["seLinuxOptions"])
        ]
        setters = _setters(pod_bad, containers)
        if not setters:
            return None
        data = []
        if bad_types:
            data.append(f"{_plural('type', 'types', len(bad_types))} {_quote(sorted(bad_types))}")
        data += [f"{field} may not be set" for field in ("user", "role") if flags[field]]
        return (
            "seLinuxOptions",
            f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}",
        )

    return check


def _proc_mount(relax_user_namespaces: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if relax_user_namespaces and _user_namespace(spec):
            return None
        bad, types = [], set()
        for c in _containers(spec):
            mount = _security(c).get("procMount")
            if mount is not None and mount != "Default":
                bad.append(c.get("name", ""))
                types.add(str(mount))
        if not bad:
            return None
        return (
            "procMount",
            f"{_named(bad)} must not set securityContext.procMount to {_quote(sorted(types))}",
        )

    return check


def _valid_seccomp(profile: Any) -> bool:
    return isinstance(profile, dict) and profile.get("type") in ("Localhost", "RuntimeDefault")


def seccomp_annotations(meta: Object, spec: Object) -> Result:
    annotations = meta.get("annotations") or {}

    def valid(value: str) -> bool:
        return value in ("runtime/default", "docker/default") or value.startswith("localhost/")

    forbidden = set()
    pod_key = "seccomp.security.alpha.kubernetes.io/pod"
    if pod_key in annotations and not valid(str(annotations[pod_key])):
        forbidden.add(f'{pod_key}="{annotations[pod_key]}"')
    for c in _containers(spec):
        key = f"container.seccomp.security.alpha.kubernetes.io/{c.get('name', '')}"
        if key in annotations and not valid(str(annotations[key])):
            forbidden.add(f'{key}="{annotations[key]}"')
    if not forbidden:
        return None
    return (
        "seccompProfile",
        f"forbidden {_plural('annotation', 'annotations', len(forbidden))} {', '.join(sorted(forbidden))}",
    )


def _seccomp(required: bool, skip_windows: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if skip_windows and _windows(spec):
            return None
        values: set[str] = set()
        profile = _pod_security(spec).get("seccompProfile")
        pod_set = profile is not None and _valid_seccomp(profile)
        pod_bad = profile is not None and not pod_set
        if pod_bad:
            values.add(str((profile or {}).get("type", "")))
        explicit, implicit = [], []
        for c in _containers(spec):
            own = _security(c).get("seccompProfile")
            if own is not None:
                if not _valid_seccomp(own):
                    explicit.append(c.get("name", ""))
                    values.add(str((own or {}).get("type", "")))
            elif not pod_set:
                implicit.append(c.get("name", ""))
        setters = _setters(pod_bad, explicit)
        if setters:
            return (
                "seccompProfile",
                f"{' and '.join(setters)} must not set securityContext.seccompProfile.type "
                f"to {_quote(sorted(values))}",
            )
        if required and implicit:
            return (
                "seccompProfile",
                f"pod or {_named(implicit)} must set securityContext.seccompProfile.type to "
                '"RuntimeDefault" or "Localhost"',
            )
        return None

    return check


_SYSCTLS_1_0 = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
}
_SYSCTLS_1_27 = _SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
_SYSCTLS_1_29 = _SYSCTLS_1_27 | {
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
_SYSCTLS_1_32 = _SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
_SYSCTLS_1_37 = _SYSCTLS_1_32 | {"net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"}


def _sysctls(allowed: set[str]) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        names = [
            str(s.get("name", "")) for s in _pod_security(spec).get("sysctls") or [] if isinstance(s, dict)
        ]
        forbidden = [n for n in names if n not in allowed]
        return ("forbidden sysctls", ", ".join(forbidden)) if forbidden else None

    return check


def windows_host_process(meta: Object, spec: Object) -> Result:
    def host_process(context: Object) -> bool:
        return (context.get("windowsOptions") or {}).get("hostProcess") is True

    containers = [c.get("name", "") for c in _containers(spec) if host_process(_security(c))]
    setters = _setters(host_process(_pod_security(spec)), containers)
    if not setters:
        return None
    return (
        "hostProcess",
        f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true",
    )


def host_probes_and_lifecycle(meta: Object, spec: Object) -> Result:
    bad: set[str] = set()
    hosts: set[str] = set()

    def hosts_of(handler: Any) -> list[str]:
        if not isinstance(handler, dict):
            return []
        return [str(h) for key in ("httpGet", "tcpSocket") if (h := (handler.get(key) or {}).get("host"))]

    for c in _containers(spec):
        lifecycle = c.get("lifecycle") or {}
        found = [
            h for probe in ("livenessProbe", "readinessProbe", "startupProbe") for h in hosts_of(c.get(probe))
        ]
        found += [h for hook in ("postStart", "preStop") for h in hosts_of(lifecycle.get(hook))]
        if found:
            bad.add(c.get("name", ""))
            hosts.update(found)
    if not bad:
        return None
    names = sorted(bad)
    return (
        "probe or lifecycle host",
        f"{_named(names)} {_plural('uses', 'use', len(names))} "
        f"{_plural('probe or lifecycle host', 'probe or lifecycle hosts', len(hosts))} "
        f"{_quote(sorted(hosts))}",
    )


# ------------------------------------------------------------------ restricted


def _allow_privilege_escalation(skip_windows: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if skip_windows and _windows(spec):
            return None
        bad = [
            c.get("name", "")
            for c in _containers(spec)
            if _security(c).get("allowPrivilegeEscalation") is not False
        ]
        return (
            (
                "allowPrivilegeEscalation != false",
                f"{_named(bad)} must set securityContext.allowPrivilegeEscalation=false",
            )
            if bad
            else None
        )

    return check


def _capabilities_restricted(skip_windows: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if skip_windows and _windows(spec):
            return None
        missing_drop, adding, forbidden = [], [], set()
        for c in _containers(spec):
            capabilities = _security(c).get("capabilities")
            if not isinstance(capabilities, dict):
                missing_drop.append(c.get("name", ""))
                continue
            if "ALL" not in [str(d) for d in capabilities.get("drop") or []]:
                missing_drop.append(c.get("name", ""))
            extra = [str(a) for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
            if extra:
                adding.append(c.get("name", ""))
                forbidden.update(extra)
        details = []
        if missing_drop:
            details.append(f'{_named(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
        if adding:
            details.append(
                f"{_named(adding)} must not include {_quote(sorted(forbidden))} in "
                "securityContext.capabilities.add"
            )
        return ("unrestricted capabilities", "; ".join(details)) if details else None

    return check


def restricted_volumes(meta: Object, spec: Object) -> Result:
    allowed = (
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    )
    restricted = (
        "hostPath",
        "gcePersistentDisk",
        "awsElasticBlockStore",
        "gitRepo",
        "nfs",
        "iscsi",
        "glusterfs",
        "rbd",
        "flexVolume",
        "cinder",
        "cephfs",
        "flocker",
        "fc",
        "azureFile",
        "vsphereVolume",
        "quobyte",
        "azureDisk",
        "photonPersistentDisk",
        "portworxVolume",
        "scaleIO",
        "storageos",
    )
    bad, types = [], set()
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, dict) or any(volume.get(k) is not None for k in allowed):
            continue
        bad.append(volume.get("name", ""))
        types.add(next((k for k in restricted if volume.get(k) is not None), "unknown"))
    if not bad:
        return None
    listed = sorted(types)
    return (
        "restricted volume types",
        f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(listed))} {_quote(listed)}",
    )


def _run_as_non_root(relax_user_namespaces: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if relax_user_namespaces and _user_namespace(spec):
            return None
        pod_value = _pod_security(spec).get("runAsNonRoot")
        pod_bad, pod_true = pod_value is False, pod_value is True
        explicit, implicit = [], []
        for c in _containers(spec):
            own = _security(c).get("runAsNonRoot")
            if own is not None:
                if own is False:
                    explicit.append(c.get("name", ""))
            elif not pod_true:
                implicit.append(c.get("name", ""))
        setters = _setters(pod_bad, explicit)
        if setters:
            return (
                "runAsNonRoot != true",
                f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
            )
        if implicit:
            return (
                "runAsNonRoot != true",
                f"pod or {_named(implicit)} must set securityContext.runAsNonRoot=true",
            )
        return None

    return check


def _run_as_user(relax_user_namespaces: bool) -> CheckFn:
    def check(meta: Object, spec: Object) -> Result:
        if relax_user_namespaces and _user_namespace(spec):
            return None
        pod_bad = _pod_security(spec).get("runAsUser") == 0
        explicit = [c.get("name", "") for c in _containers(spec) if _security(c).get("runAsUser") == 0]
        setters = _setters(pod_bad, explicit)
        return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None

    return check


# ------------------------------------------------------------------ the registry


@dataclasses.dataclass(frozen=True)
class Revision:
    since: Version
    check: CheckFn
    overrides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    level: str
    revisions: tuple[Revision, ...]

    def at(self, version: Version) -> Revision | None:
        applicable = [r for r in self.revisions if r.since <= version]
        return applicable[-1] if applicable else None


CHECKS: tuple[Check, ...] = (
    Check("privileged", BASELINE, (Revision((1, 0), privileged),)),
    Check("hostNamespaces", BASELINE, (Revision((1, 0), host_namespaces),)),
    Check("hostPathVolumes", BASELINE, (Revision((1, 0), host_path_volumes),)),
    Check("hostPorts", BASELINE, (Revision((1, 0), host_ports),)),
    Check("capabilities_baseline", BASELINE, (Revision((1, 0), capabilities_baseline),)),
    Check("appArmorProfile", BASELINE, (Revision((1, 0), app_armor_profile),)),
    Check(
        "seLinuxOptions",
        BASELINE,
        (
            Revision((1, 0), _selinux({"", "container_t", "container_init_t", "container_kvm_t"})),
            Revision(
                (1, 31),
                _selinux({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}),
            ),
        ),
    ),
    Check(
        "procMount", BASELINE, (Revision((1, 0), _proc_mount(False)), Revision((1, 35), _proc_mount(True)))
    ),
    Check(
        "seccompProfile_baseline",
        BASELINE,
        (
            Revision((1, 0), seccomp_annotations),
            Revision((1, 19), _seccomp(required=False, skip_windows=False)),
        ),
    ),
    Check(
        "sysctls",
        BASELINE,
        (
            Revision((1, 0), _sysctls(_SYSCTLS_1_0)),
            Revision((1, 27), _sysctls(_SYSCTLS_1_27)),
            Revision((1, 29), _sysctls(_SYSCTLS_1_29)),
            Revision((1, 32), _sysctls(_SYSCTLS_1_32)),
            Revision((1, 37), _sysctls(_SYSCTLS_1_37)),
        ),
    ),
    Check("windowsHostProcess", BASELINE, (Revision((1, 0), windows_host_process),)),
    Check("hostProbesAndHostLifecycle", BASELINE, (Revision((1, 34), host_probes_and_lifecycle),)),
    Check(
        "allowPrivilegeEscalation",
        RESTRICTED,
        (
            Revision((1, 8), _allow_privilege_escalation(False)),
            Revision((1, 25), _allow_privilege_escalation(True)),
        ),
    ),
    Check(
        "capabilities_restricted",
        RESTRICTED,
        (
            Revision((1, 22), _capabilities_restricted(False), ("capabilities_baseline",)),
            Revision((1, 25), _capabilities_restricted(True), ("capabilities_baseline",)),
        ),
    ),
    Check("procMount_restricted", RESTRICTED, (Revision((1, 35), _proc_mount(False), ("procMount",)),)),
    Check("restrictedVolumes", RESTRICTED, (Revision((1, 0), restricted_volumes, ("hostPathVolumes",)),)),
    Check(
        "runAsNonRoot",
        RESTRICTED,
        (
            Revision((1, 0), _run_as_non_root(False)),
            Revision((1, 35), _run_as_non_root(True)),
        ),
    ),
    Check(
        "runAsUser",
        RESTRICTED,
        (Revision((1, 23), _run_as_user(False)), Revision((1, 35), _run_as_user(True))),
    ),
    Check(
        "seccompProfile_restricted",
        RESTRICTED,
        (
            Revision((1, 19), _seccomp(required=True, skip_windows=False), ("seccompProfile_baseline",)),
            Revision((1, 25), _seccomp(required=True, skip_windows=True), ("seccompProfile_baseline",)),
        ),
    ),
)
# Upstream's order: baseline check IDs sorted, then restricted check IDs sorted (Go byte order).
_ORDERED = sorted((c for c in CHECKS if c.level == BASELINE), key=lambda c: c.id) + sorted(
    (c for c in CHECKS if c.level == RESTRICTED), key=lambda c: c.id
)


def evaluate(level: str, version: Version, meta: Object, spec: Object) -> list[tuple[str, str]]:
    """The failed checks of `level` at `version` (clamped to LATEST), in upstream's order."""
    if level == PRIVILEGED:
        return []
    version = min(version, LATEST)
    revisions = {c.id: (c.level, r) for c in _ORDERED if (r := c.at(version)) is not None}
    if level == BASELINE:
        chosen = [r for lvl, r in revisions.values() if lvl == BASELINE]
    else:
        overridden = {o for lvl, r in revisions.values() if lvl == RESTRICTED for o in r.overrides}
        chosen = [r for cid, (lvl, r) in revisions.items() if cid not in overridden]
    failures = []
    for revision in chosen:
        result = revision.check(meta, spec)
        if result is not None:
            failures.append((result[0] or "unknown forbidden reason", result[1]))
    return failures


def forbidden_detail(failures: list[tuple[str, str]]) -> str:
    """AggregateCheckResult.ForbiddenDetail: `reason (detail), reason, ...`."""
    return ", ".join(f"{reason} ({detail})" if detail else reason for reason, detail in failures)


def forbidden_reason(failures: list[tuple[str, str]]) -> str:
    return ", ".join(reason for reason, _ in failures)
