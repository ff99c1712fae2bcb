"""PodSecurity: the Pod Security Standards, per namespace, as the built-in admission plugin.

A namespace's labels choose a level (`privileged`, `baseline`, `restricted`) and version
(`latest` or `v1.N`) for each mode:

    pod-security.kubernetes.io/enforce[-version]   refuse pods that violate it (403)
    pod-security.kubernetes.io/audit[-version]     record the violation (the server log: there is
                                                   no audit log here)
    pod-security.kubernetes.io/warn[-version]      allow, with a `Warning:` the client prints

Unlabelled modes take the cluster's defaults (`Config.defaults`: from the gateway spec's
`podSecurity.defaults`, overridden per Cluster by `spec.podSecurity`; upstream's defaults
are privileged everywhere). An enforce label without a warn label warns at the enforce level
too. Pods are checked on create and on updates that change an image; workload objects with a
pod template (Deployments, Jobs, ...) get the warnings and audit but are never refused (their
pods are). Exempt users, runtime classes and namespaces (`podSecurity.exemptions`) skip every
check. Labels that do not parse are `422` on create and on updates that change them.
Changing a namespace's enforce level warns about the existing pods that would violate it.

    pods "p" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c"
        must not set securityContext.privileged=true), allowPrivilegeEscalation != false (...)
    Warning: would violate PodSecurity "baseline:latest": host namespaces (hostNetwork=true)

What each level refuses is `podchecks.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import admission
from socialweb_computer.apiserver.admission import podchecks

log = logging.getLogger(__name__)

Object = dict[str, Any]
PREFIX = "pod-security.kubernetes.io/"
MODES = ("enforce", "audit", "warn")
_VERSION = re.compile(r"^v1\.(0|[1-9][0-9]*)$")
MAX_PODS_CHECKED = 3000
_IGNORED_POD_SUBRESOURCES = {"exec", "attach", "binding", "eviction", "log", "portforward", "proxy", "status"}
# Kinds whose objects carry a pod template (PodSpecExtractor.PodSpecResources) → where it is.
TEMPLATES = {
    ("", "replicationcontrollers"): ("spec", "template"),
    ("", "podtemplates"): ("template",),
    ("apps", "replicasets"): ("spec", "template"),
    ("apps", "deployments"): ("spec", "template"),
    ("apps", "statefulsets"): ("spec", "template"),
    ("apps", "daemonsets"): ("spec", "template"),
    ("batch", "jobs"): ("spec", "template"),
    ("batch", "cronjobs"): ("spec", "jobTemplate", "spec", "template"),
}


@dataclasses.dataclass(frozen=True)
class LevelVersion:
    level: str = podchecks.PRIVILEGED
    version: str = "latest"

    def __str__(self) -> str:
        return f"{self.level}:{self.version}"

    @property
    def numeric(self) -> podchecks.Version:
        if self.version == "latest":
            return podchecks.LATEST
        return (1, int(self.version.split(".")[1]))

    def equivalent(self, other: LevelVersion) -> bool:
        both_privileged = self.level == other.level == podchecks.PRIVILEGED
        return both_privileged or (self.level == other.level and self.version == other.version)


@dataclasses.dataclass(frozen=True)
class Policy:
    enforce: LevelVersion = LevelVersion()
    audit: LevelVersion = LevelVersion()
    warn: LevelVersion = LevelVersion()

    @property
    def fully_privileged(self) -> bool:
        return all(getattr(self, m).level == podchecks.PRIVILEGED for m in MODES)


@dataclasses.dataclass(frozen=True)
class Config:
    """PodSecurityConfiguration: the defaults for unlabelled namespaces and the exemptions."""

    defaults: Policy = Policy()
    exempt_usernames: tuple[str, ...] = ()
    exempt_runtime_classes: tuple[str, ...] = ()
    exempt_namespaces: tuple[str, ...] = ()


def level_error(value: str) -> str | None:
    return None if value in podchecks.LEVELS else "must be one of privileged, baseline, restricted"


def version_error(value: str) -> str | None:
    return None if value == "latest" or _VERSION.match(value) else 'must be "latest" or "v1.x"'


def policy_for(labels: dict[str, str], defaults: Policy) -> tuple[Policy, list[errors.Cause]]:
    """api.PolicyToEvaluate: the namespace's policy and the causes of labels that do not parse."""
    modes = {m: getattr(defaults, m) for m in MODES}
    causes: list[errors.Cause] = []
    has = {key: key in labels for key in (f"{PREFIX}{m}{s}" for m in MODES for s in ("", "-version"))}
    enforce_level_ok = False
    for mode in MODES:
        level_key, version_key = f"{PREFIX}{mode}", f"{PREFIX}{mode}-version"
        current = modes[mode]
        if level_key in labels:
            value = labels[level_key]
            why = level_error(value)
            if why:
                causes.append(_label_cause(level_key, value, why))
                # Enforce fails closed (restricted), audit and warn fail open (privileged).
                current = dataclasses.replace(
                    current, level=podchecks.RESTRICTED if mode == "enforce" else podchecks.PRIVILEGED
                )
            else:
                current = dataclasses.replace(current, level=value)
                enforce_level_ok = enforce_level_ok or mode == "enforce"
        if version_key in labels:
            value = labels[version_key]
            why = version_error(value)
            if why:
                causes.append(_label_cause(version_key, value, why))
                current = dataclasses.replace(current, version="latest")
            else:
                current = dataclasses.replace(current, version=value)
        modes[mode] = current
    order = {podchecks.PRIVILEGED: 0, podchecks.BASELINE: 1, podchecks.RESTRICTED: 2}
    if (
        not has[f"{PREFIX}warn"]
        and enforce_level_ok
        and order[modes["enforce"].level] > order[modes["warn"].level]
    ):
        version = modes["warn"].version if has[f"{PREFIX}warn-version"] else modes["enforce"].version
        modes["warn"] = LevelVersion(modes["enforce"].level, version)
    return Policy(**modes), causes


def _label_cause(key: str, value: str, why: str) -> errors.Cause:
    return errors.Cause("FieldValueInvalid", f'Invalid value: "{value}": {why}', f"metadata.labels[{key}]")


def _template(obj: Object, path: tuple[str, ...]) -> Object | None:
    node: Any = obj
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


class PodSecurity(admission.BasePlugin):
    name = "PodSecurity"

    def __init__(self, store: Any, config: Config, username: Callable[[], str | None]) -> None:
        self.store = store
        self.config = config
        self.username = username

    def _exempt_namespace(self, namespace: str) -> bool:
        return bool(namespace) and namespace in self.config.exempt_namespaces

    def _exempt_user(self) -> bool:
        name = self.username()
        return bool(name) and name in self.config.exempt_usernames

    async def validate(self, request: admission.Request) -> None:
        if request.operation not in (admission.CREATE, admission.UPDATE) or request.object is None:
            return
        if request.is_("", "namespaces"):
            await self._validate_namespace(request)
        elif request.is_("", "pods"):
            await self._validate_pod(request)
        elif (request.kind.group, request.kind.plural) in TEMPLATES and not request.subresource:
            await self._validate_controller(request)

    # ------------------------------------------------------------------ namespaces

    async def _validate_namespace(self, request: admission.Request) -> None:
        if request.subresource:
            return
        assert request.object is not None
        meta = request.object.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = meta.get("name", request.name)
        policy, causes = policy_for(labels, self.config.defaults)
        if request.operation == admission.CREATE:
            if causes:
                raise errors.invalid("Namespace", name, causes)
            self._warn_exempt(request, name, policy, labels)
            return
        old_labels = ((request.old_object or {}).get("metadata") or {}).get("labels") or {}
        old_policy, old_causes = policy_for(old_labels, self.config.defaults)
        if causes and (not old_causes or causes != old_causes):
            raise errors.invalid("Namespace", name, causes)
        order = {podchecks.PRIVILEGED: 0, podchecks.BASELINE: 1, podchecks.RESTRICTED: 2}
        if (
            policy.enforce == old_policy.enforce
            or policy.enforce.level == podchecks.PRIVILEGED
            or (
                policy.enforce.version == old_policy.enforce.version
                and order[policy.enforce.level] <= order[old_policy.enforce.level]
            )
        ):
            return
        if self._exempt_namespace(name):
            self._warn_exempt(request, name, policy, labels)
            return
        request.warnings.extend(await self._existing_pods(name, policy.enforce))

    def _warn_exempt(
        self, request: admission.Request, name: str, policy: Policy, labels: dict[str, str]
    ) -> None:
        if (
            not self._exempt_namespace(name)
            or policy.fully_privileged
            or all(getattr(policy, m).equivalent(getattr(self.config.defaults, m)) for m in MODES)
        ):
            return
        parts = []
        for mode in MODES:
            current = getattr(policy, mode)
            if current.level != podchecks.PRIVILEGED and (
                f"{PREFIX}{mode}" in labels or f"{PREFIX}{mode}-version" in labels
            ):
                parts.append(f"{mode}={current}")
        request.warnings.append(
            f'namespace "{name}" is exempt from Pod Security, and the policy '
            f"({', '.join(parts)}) will be ignored"
        )

    async def _existing_pods(self, namespace: str, enforce: LevelVersion) -> list[str]:
        from socialweb_computer.apiserver import store as store_mod

        kind = self.store.registry.lookup("", "v1", "pods")
        pods = (await self.store.list(kind, namespace, store_mod.ListOptions()))["items"]
        pods = self._prioritized([p for p in pods if not self._exempt_runtime_class(p.get("spec") or {})])
        total = len(pods)
        pods = pods[:MAX_PODS_CHECKED]
        counts: dict[str, list[Any]] = {}  # reason → [lexically first pod name, count]
        order: list[str] = []
        for pod in pods:
            failures = podchecks.evaluate(
                enforce.level, enforce.numeric, pod.get("metadata") or {}, pod.get("spec") or {}
            )
            if not failures:
                continue
            reason = podchecks.forbidden_reason(failures)
            name = pod["metadata"]["name"]
            if reason not in counts:
                counts[reason] = [name, 0]
                order.append(reason)
            elif name < counts[reason][0]:
                counts[reason][0] = name
            counts[reason][1] += 1
        warnings = []
        if len(pods) < total:
            warnings.append(
                f"new PodSecurity enforce level only checked against the first {len(pods)} of "
                f"{total} existing pods"
            )
        if order:
            warnings.append(
                f'existing pods in namespace "{namespace}" violate the new PodSecurity enforce '
                f'level "{enforce}"'
            )
        decorated = []
        for reason in order:
            first, count = counts[reason]
            others = (
                "" if count == 1 else " (and 1 other pod)" if count == 2 else f" (and {count - 1} other pods)"
            )
            decorated.append(f"{first}{others}: {reason}")
        return warnings + sorted(decorated)

    @staticmethod
    def _prioritized(pods: list[Object]) -> list[Object]:
        """One pod per controller first, then the rest (prioritizePods)."""
        first, later, seen = [], [], set()
        for pod in pods:
            owner = next(
                (r for r in (pod["metadata"].get("ownerReferences") or []) if r.get("controller")), None
            )
            if owner is None:
                first.append(pod)
            elif owner.get("uid") in seen:
                later.append(pod)
            else:
                seen.add(owner.get("uid"))
                first.append(pod)
        return first + later

    # ------------------------------------------------------------------ pods and templates

    def _exempt_runtime_class(self, spec: Object) -> bool:
        runtime_class = spec.get("runtimeClassName")
        return bool(runtime_class) and runtime_class in self.config.exempt_runtime_classes

    async def _namespace_policy(self, request: admission.Request) -> tuple[Policy, list[errors.Cause]]:
        kind = self.store.registry.lookup("", "v1", "namespaces")
        try:
            ns = await self.store.get(kind, "", request.namespace)
        except errors.StatusError as e:
            if e.code != 404:
                raise
            raise errors.internal(f'failed to lookup namespace "{request.namespace}"') from None
        return policy_for((ns.get("metadata") or {}).get("labels") or {}, self.config.defaults)

    async def _validate_pod(self, request: admission.Request) -> None:
        if request.subresource in _IGNORED_POD_SUBRESOURCES:
            return
        if self._exempt_namespace(request.namespace) or self._exempt_user():
            return
        policy, causes = await self._namespace_policy(request)
        if not causes and policy.fully_privileged:
            return
        pod = request.object or {}
        if request.operation == admission.UPDATE and not _significant_update(pod, request.old_object or {}):
            return
        self._evaluate(request, policy, pod.get("metadata") or {}, pod.get("spec") or {}, enforce=True)

    async def _validate_controller(self, request: admission.Request) -> None:
        if self._exempt_namespace(request.namespace) or self._exempt_user():
            return
        policy, causes = await self._namespace_policy(request)
        if (
            not causes
            and policy.warn.level == podchecks.PRIVILEGED
            and policy.audit.level == podchecks.PRIVILEGED
        ):
            return
        template = _template(request.object or {}, TEMPLATES[(request.kind.group, request.kind.plural)])
        if template is None:
            return
        self._evaluate(
            request, policy, template.get("metadata") or {}, template.get("spec") or {}, enforce=False
        )

    def _evaluate(
        self, request: admission.Request, policy: Policy, meta: Object, spec: Object, *, enforce: bool
    ) -> None:
        if self._exempt_runtime_class(spec):
            return
        results: dict[LevelVersion, list[tuple[str, str]]] = {}

        def failures(lv: LevelVersion) -> list[tuple[str, str]]:
            if lv not in results:
                results[lv] = podchecks.evaluate(lv.level, lv.numeric, meta, spec)
            return results[lv]

        if enforce and failures(policy.enforce):
            raise admission.forbidden(
                request,
                f'violates PodSecurity "{policy.enforce}": '
                f"{podchecks.forbidden_detail(failures(policy.enforce))}",
            )
        if failures(policy.audit):
            log.info(
                "PodSecurity audit: %s %s/%s would violate PodSecurity %s: %s",
                request.kind.plural,
                request.namespace,
                admission.object_name(request.object),
                f'"{policy.audit}"',
                podchecks.forbidden_detail(failures(policy.audit)),
            )
        if failures(policy.warn):
            request.warnings.append(
                f'would violate PodSecurity "{policy.warn}": '
                f"{podchecks.forbidden_detail(failures(policy.warn))}"
            )


def _significant_update(pod: Object, old: Object) -> bool:
    """isSignificantPodUpdate: only an image change (or a new ephemeral container) is re-checked."""
    spec, old_spec = pod.get("spec") or {}, old.get("spec") or {}
    for field in ("containers", "initContainers"):
        new_list, old_list = spec.get(field) or [], old_spec.get(field) or []
        if len(new_list) != len(old_list):
            return True
        if any(
            (a or {}).get("image") != (b or {}).get("image") for a, b in zip(new_list, old_list, strict=True)
        ):
            return True
    old_ephemeral = {c.get("name"): c for c in old_spec.get("ephemeralContainers") or []}
    for container in spec.get("ephemeralContainers") or []:
        previous = old_ephemeral.get(container.get("name"))
        if previous is None or previous.get("image") != container.get("image"):
            return True
    return False


def apply_modes(policy: Policy, modes: dict[str, str]) -> Policy:
    """A policy with the given `enforce`/`enforce-version`/... settings (a Cluster's or the gateway's)."""
    out = {m: getattr(policy, m) for m in MODES}
    for mode in MODES:
        if mode in modes:
            out[mode] = dataclasses.replace(out[mode], level=modes[mode])
        if f"{mode}-version" in modes:
            out[mode] = dataclasses.replace(out[mode], version=modes[f"{mode}-version"])
    return Policy(**out)


def config_for(gateway: Config, cluster_modes: dict[str, str]) -> Config:
    """The gateway's configuration with one Cluster's `spec.podSecurity` over its defaults."""
    return dataclasses.replace(gateway, defaults=apply_modes(gateway.defaults, cluster_modes))

