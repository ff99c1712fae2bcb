"""A container's environment and its command, as a kubelet computes them.

Order and precedence follow upstream: `envFrom` sources first (later sources win), then
`env` entries (which win over envFrom); `$(VAR)` in values, command and args expands to
earlier-defined variables, `$$` is a literal `$`, and a reference to an undefined variable
stays as written. A missing ConfigMap or Secret, or a missing key, is a
`CreateContainerConfigError` with upstream's message, unless the reference is optional.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from socialweb_computer.api import quantity

Object = dict[str, Any]
# (kind, namespace, name) → the object, or None when it does not exist.
Lookup = Callable[[str, str, str], Awaitable[Object | None]]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FIELD_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """The container cannot be configured; the message is what `kubectl describe` shows."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion (third_party/forked/golang/expansion semantics)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def field_value(pod: Object, path: str) -> str:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    subscript = _FIELD_SUBSCRIPT.match(path)
    if subscript:
        return str((meta.get(subscript.group(1)) or {}).get(subscript.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i.get("ip", "") for i in status.get("hostIPs") or []),
        "status.podIPs": ",".join(i.get("ip", "") for i in status.get("podIPs") or []),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        values = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(values.items()))
    if path not in simple:
        raise ConfigError(f"unsupported fieldPath: {path}")
    return str(simple[path] or "")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def resource_value(container: Object, resource: str, divisor: object, allocatable: dict[str, str]) -> str:
    """A `resourceFieldRef`: limits default to the node's allocatable; cpu rounds up."""
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = allocatable.get(name)
    if value is None:
        value = "0"
    exact = quantity.parse_quantity(value)
    unit = quantity.parse_quantity(divisor or "1")
    if unit == 0:
        raise ConfigError(f"invalid divisor for {resource}")
    ratio = exact / unit
    if name == "cpu":
        return str(math.ceil(ratio))
    return str(int(ratio.to_integral_value(rounding=decimal.ROUND_CEILING)))


async def environment(
    pod: Object,
    container: Object,
    *,
    lookup: Lookup,
    allocatable: dict[str, str],
    service_env: dict[str, str] | None = None,
) -> tuple[list[tuple[str, str]], list[str]]:
    """The container's variables in order, and warnings (skipped envFrom keys).

    The Services' variables (`service_env`) may be referenced as `$(VAR)` and are overridden
    by the container's own; they come after them, as a kubelet orders them."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    services = dict(service_env or {})
    env: dict[str, str] = {}
    warnings: list[str] = []
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref in (("ConfigMap", source.get("configMapRef")), ("Secret", source.get("secretRef"))):
            if ref is None:
                continue
            obj = await lookup(kind, namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
            data = _data(kind, obj)
            invalid = sorted(k for k in data if not _ENV_NAME.match(prefix + k))
            if invalid:
                warnings.append(
                    f"Keys [{', '.join(invalid)}] from the EnvFrom {kind.lower()} "
                    f"{namespace}/{ref.get('name', '')} were skipped since they are considered "
                    "invalid environment variable names."
                )
            for key, value in data.items():
                if key not in invalid:
                    env[prefix + key] = value
    for entry in container.get("env") or []:
        name = entry.get("name", "")
        if "valueFrom" not in entry:
            env[name] = expand(entry.get("value", ""), {**services, **env})
            continue
        value = await _value_from(pod, container, entry["valueFrom"], namespace, lookup, allocatable)
        if value is not None:
            env[name] = value
    return [*env.items(), *((k, v) for k, v in services.items() if k not in env)], warnings


async def _value_from(
    pod: Object,
    container: Object,
    source: Object,
    namespace: str,
    lookup: Lookup,
    allocatable: dict[str, str],
) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"].get("fieldPath", ""))
    if "resourceFieldRef" in source:
        ref = source["resourceFieldRef"]
        target = container
        if ref.get("containerName"):
            target = next(
                (c for c in _all_containers(pod) if c.get("name") == ref["containerName"]), container
            )
        return resource_value(target, ref.get("resource", ""), ref.get("divisor"), allocatable)
    for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
        if field not in source:
            continue
        ref = source[field]
        obj = await lookup(kind, namespace, ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                return None
            raise ConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
        data = _data(kind, obj)
        key = ref.get("key", "")
        if key not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f"couldn't find key {key} in {kind} {namespace}/{ref.get('name', '')}")
        return data[key]
    return None


def _data(kind: str, obj: Object) -> dict[str, str]:
    import base64

    if kind == "Secret":
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()}
    data = dict(obj.get("data") or {})
    for key, value in (obj.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value).decode(errors="replace")
    return data


def _all_containers(pod: Object) -> list[Object]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def command_and_args(container: Object, env: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    mapping = dict(env)
    return (
        [expand(c, mapping) for c in container.get("command") or []],
        [expand(a, mapping) for a in container.get("args") or []],
    )
