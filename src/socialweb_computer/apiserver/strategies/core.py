"""Strategies of core/v1 kinds: the defaults and rules a real apiserver applies."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import random
import re

from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")


class NamespaceStrategy(base.Strategy):
    name_format = "label"
    keep_status_on_create = True

    def prepare_for_create(self, obj: Object) -> None:
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
        self._label(obj)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        new["spec"] = old.get("spec", {})
        self._label(new)

    def holds_deletion(self, obj: Object) -> bool:
        return bool((obj.get("spec") or {}).get("finalizers"))

    def prepare_for_delete(self, obj: Object) -> None:
        obj.setdefault("status", {})["phase"] = "Terminating"

    @staticmethod
    def _label(obj: Object) -> None:
        name = obj.get("metadata", {}).get("name", "")
        if name:
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name


def default_container(c: dict) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = c.get("image", "")
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    c.setdefault("resources", {})
    for port in c.get("ports") or []:
        port.setdefault("protocol", "TCP")


def default_pod_spec(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    if spec.get("serviceAccountName") or spec.get("serviceAccount"):
        name = spec.get("serviceAccountName") or spec.get("serviceAccount")
        spec["serviceAccountName"] = spec["serviceAccount"] = name
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            default_container(c)


def validate_pod_spec(spec: object, path: str) -> list[Cause]:
    if not isinstance(spec, dict):
        return [base.required(path)]
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        causes.append(base.required(f"{path}.containers"))
    seen: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            where = f"{path}.{kind}[{i}]"
            name = c.get("name", "") if isinstance(c, dict) else ""
            if not name:
                causes.append(base.required(f"{where}.name"))
            elif name in seen:
                causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{where}.name"))
            seen.add(name)
            if isinstance(c, dict) and not c.get("image"):
                causes.append(base.required(f"{where}.image"))
    policy = spec.get("restartPolicy")
    if policy and policy not in ("Always", "OnFailure", "Never"):
        causes.append(base.not_supported(f"{path}.restartPolicy", policy, ["Always", "OnFailure", "Never"]))
    return causes


# DefaultTolerationSeconds admission: every pod tolerates a not-ready or unreachable node for
# five minutes unless it says otherwise (the taint-eviction controller reads these).
DEFAULT_TOLERATED_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
DEFAULT_TOLERATION_SECONDS = 300


def default_tolerations(spec: dict) -> None:
    tolerations = spec.get("tolerations")
    if tolerations is not None and not isinstance(tolerations, list):
        return
    present = [t for t in tolerations or [] if isinstance(t, dict)]
    missing = [key for key in DEFAULT_TOLERATED_TAINTS
               if not any(t.get("key") in (key, "", None) and t.get("effect") in ("NoExecute", "", None)
                          for t in present)]
    if missing:
        spec["tolerations"] = [*(tolerations or []), *(
            {"key": key, "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": DEFAULT_TOLERATION_SECONDS} for key in missing)]


def default_pod_ips(status: object) -> None:
    """v1 conversion: `podIPs`/`hostIPs` start with `podIP`/`hostIP`, and a status that gives
    only the list gets the single field from its first entry (a kubelet writes both)."""
    if not isinstance(status, dict):
        return
    for single, plural in (("podIP", "podIPs"), ("hostIP", "hostIPs")):
        listed = status.get(plural)
        if status.get(single) and not listed:
            status[plural] = [{"ip": status[single]}]
        elif not status.get(single) and isinstance(listed, list) and listed and isinstance(listed[0], dict):
            status[single] = listed[0].get("ip", "")


_MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


class PodStrategy(base.Strategy):
    keep_status_on_create = True

    def prepare_for_create(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            default_pod_spec(spec)
            if _MIRROR_POD_ANNOTATION not in ((obj.get("metadata") or {}).get("annotations") or {}):
                # As the ServiceAccount admission plugin: a kubelet's mirror pod is left as it sent it.
                spec.setdefault("serviceAccountName", "default")
                spec.setdefault("serviceAccount", spec["serviceAccountName"])
            spec.setdefault("priority", 0)
            default_tolerations(spec)
        status = {"phase": "Pending"}
        if isinstance(spec, dict):
            status["qosClass"] = qos_class(spec)
        obj["status"] = status

    def prepare_for_update(self, new: Object, old: Object) -> None:
        spec = new.get("spec")
        if isinstance(spec, dict):
            default_pod_spec(spec)
            default_tolerations(spec)

    def prepare_for_status_update(self, new: Object, old: Object) -> None:
        default_pod_ips(new.get("status"))

    replaces_update = ("ephemeralcontainers",)

    def prepare_for_subresource_update(self, subresource: str, new: Object, old: Object) -> None:
        if subresource == "ephemeralcontainers":
            for container in (new.get("spec") or {}).get("ephemeralContainers") or []:
                if isinstance(container, dict):
                    default_container(container)

    def validate_subresource_update(self, subresource: str, new: Object, old: Object) -> list[Cause]:
        return _ephemeral_causes(new, old) if subresource == "ephemeralcontainers" else []

    def validate(self, obj: Object) -> list[Cause]:
        return validate_pod_spec(obj.get("spec"), "spec")

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if causes:
            return causes

        # Only container images, activeDeadlineSeconds, tolerations (additions) and scheduling
        # gates may change on a pod; the rest of its spec is fixed at creation.
        def mutable_view(spec: dict) -> dict:
            view = {
                k: v
                for k, v in spec.items()
                if k not in ("activeDeadlineSeconds", "tolerations", "schedulingGates")
            }
            for kind in ("containers", "initContainers"):
                if kind in view:
                    view[kind] = [{k: v for k, v in c.items() if k != "image"} for c in view[kind]]
            return view

        if mutable_view(new.get("spec", {})) != mutable_view(old.get("spec", {})):
            return [
                Cause(
                    "FieldValueForbidden",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                    "(allow it to be set to 1 if it was previously negative)",
                    "spec",
                )
            ]
        return []


# Fields an ephemeral container may not set (upstream's validateEphemeralContainers).
_EPHEMERAL_FORBIDDEN = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "resources",
                        "resizePolicy", "restartPolicy")


def _ephemeral_causes(new: Object, old: Object) -> list[Cause]:
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    before = {c.get("name"): c for c in old_spec.get("ephemeralContainers") or []}
    after = {c.get("name"): c for c in new_spec.get("ephemeralContainers") or [] if isinstance(c, dict)}
    causes = []
    for name, container in before.items():
        if after.get(name) != container:
            message = f'Forbidden: existing ephemeral containers "{name}" may not be changed'
            causes.append(Cause("FieldValueForbidden", message, "spec.ephemeralContainers"))
    taken = {c.get("name") for field in ("containers", "initContainers") for c in new_spec.get(field) or []}
    for index, container in enumerate(new_spec.get("ephemeralContainers") or []):
        path = f"spec.ephemeralContainers[{index}]"
        if not isinstance(container, dict):
            causes.append(Cause("FieldValueInvalid", "Invalid value: must be an object", path))
            continue
        name = container.get("name")
        if not name:
            causes.append(Cause("FieldValueRequired", "Required value", f"{path}.name"))
        elif name in taken:
            causes.append(Cause("FieldValueDuplicate", f'Duplicate value: "{name}"', f"{path}.name"))
        if not container.get("image"):
            causes.append(Cause("FieldValueRequired", "Required value", f"{path}.image"))
        previous = before.get(name) or {}
        for field in _EPHEMERAL_FORBIDDEN:
            if container.get(field) and container.get(field) != previous.get(field):
                message = "Forbidden: cannot be set for an Ephemeral Container"
                causes.append(Cause("FieldValueForbidden", message, f"{path}.{field}"))
        target = container.get("targetContainerName")
        if target and target not in taken:
            field = f"{path}.targetContainerName"
            causes.append(Cause("FieldValueNotFound", f'Not found: "{target}"', field))
    return causes


def qos_class(spec: dict) -> str:
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    requests_any = limits_all = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {} if isinstance(c, dict) else {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            requests_any = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False
        limits_all = True
    if requests_any and guaranteed and limits_all:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"


class ServiceStrategy(base.Strategy):
    name_format = "label"

    def default(self, obj: Object) -> None:
        """SetDefaults_Service."""
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if not spec.get("type"):
            spec["type"] = "ClusterIP"
        if not spec.get("sessionAffinity"):
            spec["sessionAffinity"] = "None"
        if spec["sessionAffinity"] == "ClientIP":
            config = spec.setdefault("sessionAffinityConfig", {})
            client_ip = config.setdefault("clientIP", {}) if isinstance(config, dict) else None
            if isinstance(client_ip, dict) and not client_ip.get("timeoutSeconds"):
                client_ip["timeoutSeconds"] = 10800
        for port in spec.get("ports") or []:
            if not isinstance(port, dict):
                continue
            if not port.get("protocol"):
                port["protocol"] = "TCP"
            if port.get("targetPort") in (None, 0, ""):
                port["targetPort"] = port.get("port")
        kind = spec["type"]
        if kind in ("NodePort", "LoadBalancer") and not spec.get("externalTrafficPolicy"):
            spec["externalTrafficPolicy"] = "Cluster"
        if kind == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") is None:
            spec["allocateLoadBalancerNodePorts"] = True
        if kind != "ExternalName" and not spec.get("internalTrafficPolicy"):
            spec["internalTrafficPolicy"] = "Cluster"

    def prepare_for_create(self, obj: Object) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if spec["type"] != "ExternalName":
            if not spec.get("clusterIP"):
                spec["clusterIP"] = str(SERVICE_CIDR[random.randrange(10, SERVICE_CIDR.num_addresses - 1)])
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
        obj["status"] = {"loadBalancer": {}}

    def prepare_for_update(self, new: Object, old: Object) -> None:
        spec, old_spec = new.get("spec"), old.get("spec") or {}
        if isinstance(spec, dict):
            for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                if key not in spec and key in old_spec:
                    spec[key] = old_spec[key]

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes = []
        # Headless Services may have no ports (DNS-only).
        if spec.get("type", "ClusterIP") != "ExternalName" and not spec.get("ports") \
                and spec.get("clusterIP") != "None":
            causes.append(base.required("spec.ports"))
        allowed = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
        if spec.get("type") and spec["type"] not in allowed:
            causes.append(base.not_supported("spec.type", spec["type"], allowed))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        old_ip = (old.get("spec") or {}).get("clusterIP")
        new_ip = (new.get("spec") or {}).get("clusterIP")
        if old_ip and new_ip != old_ip:
            causes.append(base.invalid("spec.clusterIPs[0]", new_ip, "may not change once set"))
        return causes


_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def _key_causes(data: object, field: str) -> list[Cause]:
    causes = []
    for key in data or {} if isinstance(data, dict) else {}:
        if len(key) > 253 or not _CONFIG_KEY.match(key) or key in (".", ".."):
            causes.append(
                base.invalid(
                    f"{field}",
                    key,
                    "a valid config key must consist of alphanumeric "
                    "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or "
                    "'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                )
            )
    return causes


class ConfigMapStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        causes = _key_causes(obj.get("data"), "data") + _key_causes(obj.get("binaryData"), "binaryData")
        for key in set(obj.get("data") or {}) & set(obj.get("binaryData") or {}):
            causes.append(base.invalid("data", key, "duplicate of key present in binaryData"))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if old.get("immutable") and (
            new.get("data") != old.get("data") or new.get("binaryData") != old.get("binaryData")
        ):
            causes.append(
                Cause("FieldValueForbidden", "Forbidden: field is immutable when `immutable` is set", "data")
            )
        return causes


class SecretStrategy(base.Strategy):
    def prepare_for_create(self, obj: Object) -> None:
        obj.setdefault("type", "Opaque")
        self._fold_string_data(obj)

    def prepare_for_update(self, new: Object, old: Object) -> None:
        new.setdefault("type", old.get("type", "Opaque"))
        self._fold_string_data(new)

    @staticmethod
    def _fold_string_data(obj: Object) -> None:
        # stringData is write-only: merged into data (base64) and never stored.
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = obj.setdefault("data", {})
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()

    def validate(self, obj: Object) -> list[Cause]:
        causes = _key_causes(obj.get("data"), "data")
        for key, value in (obj.get("data") or {}).items():
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError, ValueError):
                causes.append(
                    base.invalid(f"data[{key}]", "<secret contents redacted>", "illegal base64 data")
                )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        if new.get("type") != old.get("type"):
            causes.append(base.immutable("type", new.get("type")))
        return causes


class EventStrategy(base.Strategy):
    def validate(self, obj: Object) -> list[Cause]:
        if not obj.get("involvedObject") and obj.get("apiVersion", "v1") == "v1":
            return [base.required("involvedObject")]
        return []


class NodeStrategy(base.Strategy):
    keep_status_on_create = True

    def prepare_for_create(self, obj: Object) -> None:
        # TaintNodesAtCreation admission: no pod lands on a node before the node lifecycle
        # controller has seen it Ready (it removes this taint then).
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict) or not isinstance(spec.get("taints", []), list):
            return
        taints = spec.get("taints") or []
        if not any(isinstance(t, dict) and t.get("key") == "node.kubernetes.io/not-ready"
                   and t.get("effect") == "NoSchedule" for t in taints):
            spec["taints"] = [*taints, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("", "Namespace"): NamespaceStrategy(),
    ("", "Pod"): PodStrategy(),
    ("", "Service"): ServiceStrategy(),
    ("", "ConfigMap"): ConfigMapStrategy(),
    ("", "Secret"): SecretStrategy(),
    ("", "Event"): EventStrategy(),
    ("", "Node"): NodeStrategy(),
}
