"""networking.k8s.io kinds: Ingress, IngressClass and NetworkPolicy, with upstream's defaults
and the validation rules clients meet (`kubectl create ingress`, helm charts).

They are stored and validated; nothing routes traffic by them yet (no ingress controller
runs, and NetworkPolicy is not enforced on nodes). Which IngressClass an Ingress without one
gets is admission's job (`apiserver/defaultclass.py`).
"""

from __future__ import annotations

import ipaddress

from socialweb_computer.api import gofmt, objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

PATH_TYPES = ["Exact", "ImplementationSpecific", "Prefix"]
PROTOCOLS = ["SCTP", "TCP", "UDP"]
POLICY_TYPES = ["Egress", "Ingress"]


def _wildcard_host_errors(host: str) -> list[str]:
    if host.startswith("*."):
        rest = host[2:]
        if objects.dns1123_subdomain_errors(rest):
            return [
                "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, "
                "which must consist of lower case alphanumeric characters, '-' or '.' and end with an "
                "alphanumeric character (e.g. '*.example.com', regex used for validation is "
                "'\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        return []
    return objects.dns1123_subdomain_errors(host)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class IngressStrategy(base.Strategy):
    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {"loadBalancer": {}}

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        rules = spec.get("rules")
        if not rules and not spec.get("defaultBackend"):
            causes.append(
                base.invalid(
                    "spec",
                    gofmt.GoSyntax("[]networking.IngressRule(nil)")
                    if rules is None
                    else gofmt.GoSyntax("[]networking.IngressRule{}"),
                    "either `defaultBackend` or `rules` must be specified",
                )
            )
        if isinstance(spec.get("defaultBackend"), dict):
            causes.extend(_backend_causes(spec["defaultBackend"], "spec.defaultBackend"))
        for i, rule in enumerate(rules or []):
            if isinstance(rule, dict):
                causes.extend(_rule_causes(rule, f"spec.rules[{i}]"))
        for i, tls in enumerate(spec.get("tls") or []):
            for j, host in enumerate((tls or {}).get("hosts") or []):
                for message in _wildcard_host_errors(host):
                    causes.append(base.invalid(f"spec.tls[{i}].hosts[{j}]", host, message))
        name = spec.get("ingressClassName")
        if isinstance(name, str):
            for message in objects.dns1123_subdomain_errors(name):
                causes.append(base.invalid("spec.ingressClassName", name, message))
        return causes


def _rule_causes(rule: Object, path: str) -> list[Cause]:
    causes: list[Cause] = []
    host = rule.get("host")
    if host:
        if _is_ip(host):
            causes.append(base.invalid(f"{path}.host", host, "must be a DNS name, not an IP address"))
        else:
            causes.extend(base.invalid(f"{path}.host", host, m) for m in _wildcard_host_errors(host))
    http = rule.get("http")
    if isinstance(http, dict):
        paths = http.get("paths")
        if not paths:
            causes.append(base.required(f"{path}.http.paths"))
        for j, entry in enumerate(paths or []):
            if isinstance(entry, dict):
                causes.extend(_path_causes(entry, f"{path}.http.paths[{j}]"))
    return causes


def _path_causes(entry: Object, path: str) -> list[Cause]:
    causes: list[Cause] = []
    path_type, value = entry.get("pathType"), entry.get("path", "")
    if not path_type:
        causes.append(
            Cause("FieldValueRequired", "Required value: pathType must be specified", f"{path}.pathType")
        )
    elif path_type not in PATH_TYPES:
        causes.append(base.not_supported(f"{path}.pathType", path_type, PATH_TYPES))
    elif path_type in ("Exact", "Prefix"):
        if not str(value).startswith("/"):
            causes.append(base.invalid(f"{path}.path", value, "must be an absolute path"))
        elif "//" in value:
            causes.append(base.invalid(f"{path}.path", value, "must not contain '//'"))
    elif value and not str(value).startswith("/"):
        causes.append(base.invalid(f"{path}.path", value, "must be an absolute path"))
    backend = entry.get("backend")
    if not isinstance(backend, dict):
        causes.append(base.required(f"{path}.backend"))
    else:
        causes.extend(_backend_causes(backend, f"{path}.backend"))
    return causes


def _backend_causes(backend: Object, path: str) -> list[Cause]:
    service, resource = backend.get("service"), backend.get("resource")
    if service is not None and resource is not None:
        return [base.invalid(path, "", "cannot set both resource and service backends")]
    if resource is not None:
        causes = []
        for field in ("kind", "name"):
            if not (resource or {}).get(field):
                causes.append(base.required(f"{path}.resource.{field}"))
        return causes
    if not isinstance(service, dict):
        return [
            Cause("FieldValueInvalid", 'Invalid value: "": resource or service backend is required', path)
        ]
    causes = []
    if not service.get("name"):
        causes.append(base.required(f"{path}.service.name"))
    else:
        causes.extend(
            base.invalid(f"{path}.service.name", service["name"], m)
            for m in objects.dns1123_label_errors(service["name"])
        )
    port = service.get("port") or {}
    has_name, has_number = bool(port.get("name")), port.get("number") is not None
    if has_name and has_number:
        causes.append(
            base.invalid(f"{path}.service.port", port.get("name"), "cannot set both port name & number")
        )
    elif not has_name and not has_number:
        causes.append(
            Cause(
                "FieldValueRequired",
                "Required value: port name or number is required",
                f"{path}.service.port",
            )
        )
    elif has_number and not 0 < int(port["number"]) < 65536:
        causes.append(
            base.invalid(
                f"{path}.service.port.number", port["number"], "must be between 1 and 65535, inclusive"
            )
        )
    return causes


class IngressClassStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        params = (obj.get("spec") or {}).get("parameters") if isinstance(obj.get("spec"), dict) else None
        if isinstance(params, dict) and not params.get("scope"):
            params["scope"] = "Cluster"

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        controller = spec.get("controller")
        causes: list[Cause] = []
        if not controller:
            causes.append(base.required("spec.controller"))
        elif "/" not in controller or objects.dns1123_subdomain_errors(controller.split("/", 1)[0]):
            causes.append(
                base.invalid(
                    "spec.controller", controller, 'must be a domain-prefixed path (such as "acme.io/foo")'
                )
            )
        elif len(controller) > 250:
            causes.append(
                Cause("FieldValueTooLong", "Too long: may not be more than 250 bytes", "spec.controller")
            )
        params = spec.get("parameters")
        if isinstance(params, dict):
            scope = params.get("scope")
            if scope not in ("Cluster", "Namespace"):
                causes.append(base.not_supported("spec.parameters.scope", scope, ["Cluster", "Namespace"]))
            if scope == "Namespace" and not params.get("namespace"):
                causes.append(
                    Cause(
                        "FieldValueRequired",
                        "Required value: `parameters.scope` is set to 'Namespace'",
                        "spec.parameters.namespace",
                    )
                )
            if scope == "Cluster" and params.get("namespace"):
                causes.append(
                    base.forbidden("spec.parameters.namespace", "`parameters.scope` is set to 'Cluster'")
                )
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        new_controller = (new.get("spec") or {}).get("controller")
        if new_controller != (old.get("spec") or {}).get("controller"):
            causes.append(base.immutable("spec.controller", new_controller))
        return causes


class NetworkPolicyStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        """SetDefaults_NetworkPolicy: ports are TCP; policyTypes Ingress (and Egress when there are
        egress rules)."""
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        for direction in ("ingress", "egress"):
            for rule in spec.get(direction) or []:
                for port in (rule or {}).get("ports") or [] if isinstance(rule, dict) else []:
                    if isinstance(port, dict) and not port.get("protocol"):
                        port["protocol"] = "TCP"
        if not spec.get("policyTypes"):
            spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        types = spec.get("policyTypes") or []
        for i, kind in enumerate(types):
            if kind not in POLICY_TYPES:
                causes.append(base.not_supported(f"spec.policyTypes[{i}]", kind, ["Ingress", "Egress"]))
        if len(types) > 2:
            causes.append(
                base.invalid("spec.policyTypes", types, "may not specify more than two policyTypes")
            )
        for direction, peers in (("ingress", "from"), ("egress", "to")):
            for i, rule in enumerate(spec.get(direction) or []):
                if not isinstance(rule, dict):
                    continue
                where = f"spec.{direction}[{i}]"
                for j, port in enumerate(rule.get("ports") or []):
                    protocol = (port or {}).get("protocol")
                    if protocol is not None and protocol not in PROTOCOLS:
                        causes.append(base.not_supported(f"{where}.ports[{j}].protocol", protocol, PROTOCOLS))
                for j, peer in enumerate(rule.get(peers) or []):
                    causes.extend(_peer_causes(peer, f"{where}.{peers}[{j}]"))
        return causes


def _peer_causes(peer: object, path: str) -> list[Cause]:
    if not isinstance(peer, dict):
        return []
    chosen = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if peer.get(k) is not None]
    if not chosen:
        return [base.required(path)]
    block = peer.get("ipBlock")
    if not isinstance(block, dict):
        return []
    if "podSelector" in chosen or "namespaceSelector" in chosen:
        return [base.forbidden(path, "may not specify both ipBlock and another peer")]
    cidr = block.get("cidr")
    if not cidr:
        return [base.required(f"{path}.ipBlock.cidr")]
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return [
            base.invalid(
                f"{path}.ipBlock.cidr",
                cidr,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )
        ]
    causes = []
    for i, except_cidr in enumerate(block.get("except") or []):
        try:
            inner = ipaddress.ip_network(except_cidr, strict=False)
        except ValueError:
            causes.append(
                base.invalid(
                    f"{path}.ipBlock.except[{i}]",
                    except_cidr,
                    "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                )
            )
            continue
        if inner.version != network.version or not inner.subnet_of(network):  # type: ignore[arg-type]
            causes.append(
                base.invalid(f"{path}.ipBlock.except[{i}]", except_cidr, "must be a strict subset of `cidr`")
            )
    return causes


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("networking.k8s.io", "Ingress"): IngressStrategy(),
    ("networking.k8s.io", "IngressClass"): IngressClassStrategy(),
    ("networking.k8s.io", "NetworkPolicy"): NetworkPolicyStrategy(),
}
