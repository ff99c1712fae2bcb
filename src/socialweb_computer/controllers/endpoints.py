"""The Endpoints and EndpointSlice controllers: which Pods back each Service.

Why it exists: a Service with a selector is only useful if clients (kube-proxy, DNS, a
`kubectl get endpoints`) can see the addresses of the Pods it selects. Like the real
kube-controller-manager, two controllers publish them:

- `EndpointsController` writes core/v1 Endpoints named after the Service: ready Pods under
  `addresses`, the others under `notReadyAddresses` (all under `addresses` with
  `publishNotReadyAddresses`), terminating Pods left out, subsets repacked so addresses
  offering the same ports share one subset.
- `EndpointSliceController` writes discovery.k8s.io/v1 EndpointSlices (`generateName:
  <service>-`, owned by the Service, labels `kubernetes.io/service-name` and
  `endpointslice.kubernetes.io/managed-by`), one slice per port set and up to 100
  endpoints each, with the `ready`/`serving`/`terminating` conditions; a Service without
  endpoints keeps one empty placeholder slice. As upstream, a Pod whose Node does not exist
  is left out (unless `publishNotReadyAddresses`) until the Node appears.

Target ports are resolved per Pod (a named targetPort looks the name up in the Pod's
container ports). Services of type ExternalName and Services without a selector are left
alone. `publish_apiserver()` writes the Endpoints and EndpointSlice of the `kubernetes`
Service, which kube-apiserver maintains itself.

Started by `controllers.manager.Manager`; Pods get their IPs from a node (or a test, through
pods/status).
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import selectors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

Object = dict[str, Any]
Key = tuple[str, str]
MANAGER = "kube-controller-manager"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
HEADLESS_LABEL = "service.kubernetes.io/headless"
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
MAX_ENDPOINTS_PER_SLICE = 100


# ---------------------------------------------------------------------- shared helpers


def selected_by(svc: Object) -> selectors.LabelSelector | None:
    """The Service's selector, or None for Services this controller leaves alone."""
    spec = svc.get("spec") or {}
    if spec.get("type") == "ExternalName" or not spec.get("selector"):
        return None
    return selectors.selector_from_labels(spec["selector"])


def pod_ips(pod: Object) -> list[str]:
    status = pod.get("status") or {}
    ips = [p["ip"] for p in status.get("podIPs") or [] if isinstance(p, dict) and p.get("ip")]
    return ips or ([status["podIP"]] if status.get("podIP") else [])


def ipv4(ips: Iterable[str]) -> list[str]:
    out = []
    for ip in ips:
        try:
            if ipaddress.ip_address(ip).version == 4:
                out.append(ip)
        except ValueError:
            continue
    return out


def in_endpoints(pod: Object, include_terminating: bool) -> bool:
    """endpointsliceutil.ShouldPodBeInEndpoints."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if not pod_ips(pod):
        return False
    return include_terminating or not pod["metadata"].get("deletionTimestamp")


def find_port(pod: Object, svc_port: Object) -> int | None:
    """podutil.FindPort: a number as is, a name looked up in the Pod's container ports."""
    target = svc_port.get("targetPort", svc_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    protocol = svc_port.get("protocol") or "TCP"
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    for container in [*(spec.get("containers") or []), *sidecars]:
        for port in container.get("ports") or []:
            if port.get("name") == target and (port.get("protocol") or "TCP") == protocol:
                return int(port["containerPort"])
    return None


def hostname_for(pod: Object, svc: Object) -> str:
    spec = pod.get("spec") or {}
    if spec.get("hostname") and spec.get("subdomain") == svc["metadata"]["name"] and \
            pod["metadata"].get("namespace") == svc["metadata"].get("namespace"):
        return str(spec["hostname"])
    return ""


def target_ref(pod: Object) -> Object:
    meta = pod["metadata"]
    return {"kind": "Pod", "namespace": meta.get("namespace", ""), "name": meta["name"],
            "uid": meta.get("uid", "")}


def _ip_sort_key(ip: str) -> tuple[int, int, str]:
    try:
        address = ipaddress.ip_address(ip)
        return address.version, int(address), ""
    except ValueError:
        return 9, 0, ip


def _ready_time(pod: Object) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("lastTransitionTime") or "")
    return ""


class TriggerTimes:
    """endpoints.kubernetes.io/last-change-trigger-time: the earliest change (a Pod's Ready
    transition, the Service's creation) not yet published, as upstream's TriggerTimeTracker."""

    def __init__(self) -> None:
        self._seen: dict[Key, tuple[dict[str, str], str]] = {}

    def compute(self, svc: Object, pods: list[Object]) -> str:
        key = framework.key_of(svc)
        seen_pods, seen_svc = self._seen.get(key, ({}, ""))
        changed: list[str] = []
        now_pods: dict[str, str] = {}
        for pod in pods:
            stamp = _ready_time(pod)
            if stamp:
                now_pods[pod["metadata"]["name"]] = stamp
                if stamp > seen_pods.get(pod["metadata"]["name"], ""):
                    changed.append(stamp)
        created = str(svc["metadata"].get("creationTimestamp") or "")
        if created > seen_svc:
            changed.append(created)
        self._seen[key] = (now_pods, created)
        return min(changed) if changed else ""

    def forget(self, key: Key) -> None:
        self._seen.pop(key, None)


class _ServiceQueueing:
    """What both controllers share: a queue of Service keys fed by Service and Pod changes."""

    def __init__(self, store: store_mod.Store, informers: framework.Informers,
                 clock: framework.Clock) -> None:
        self.store = store
        self.clock = clock
        self.queue = framework.WorkQueue(clock)
        self.services = informers.get("", "services")
        self.pods = informers.get("", "pods")
        self.triggers = TriggerTimes()
        self.services.handlers.append(self._on_service)
        self.pods.handlers.append(self._on_pod)

    def _on_service(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        if new is not None and old is not None and not _pod_changed(new, old):
            return
        for pod in (new, old):
            if pod is not None:
                self.enqueue_services_of(pod)

    def enqueue_services_of(self, pod: Object) -> None:
        labels = pod["metadata"].get("labels") or {}
        for svc in self.services.list(pod["metadata"].get("namespace", "")):
            selector = selected_by(svc)
            if selector is not None and selector.matches(labels):
                self.queue.add(framework.key_of(svc))

    def selected_pods(self, svc: Object, selector: selectors.LabelSelector) -> list[Object]:
        pods = self.pods.list(svc["metadata"].get("namespace", ""))
        return sorted((p for p in pods if selector.matches(p["metadata"].get("labels") or {})),
                      key=lambda p: p["metadata"]["name"])

    async def write(self, kind_info: Any, current: Object | None, desired: Object) -> None:
        """Create `desired`, or update `current` to it (conflict-checked on resourceVersion)."""
        meta = desired["metadata"]
        options = store_mod.WriteOptions(field_manager=MANAGER, field_validation="Ignore")
        if current is None:
            await self.store.create(kind_info, meta["namespace"], desired, options)
            return
        await self.store.update(kind_info, meta["namespace"], current["metadata"]["name"], desired, options)


def _pod_changed(new: Object, old: Object) -> bool:
    """Only what an endpoint shows matters (upstream's podEndpointsChanged, roughly)."""
    def view(pod: Object) -> tuple[Any, ...]:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        return (pod["metadata"].get("labels"), bool(pod["metadata"].get("deletionTimestamp")), pod_ips(pod),
                framework.is_ready(pod), _ready_time(pod), status.get("phase"), spec.get("nodeName"),
                spec.get("hostname"), spec.get("subdomain"))
    return view(new) != view(old)


# ---------------------------------------------------------------------- Endpoints


def _endpoint_address(pod: Object, svc: Object, ip: str) -> Object:
    address: Object = {"ip": ip}
    hostname = hostname_for(pod, svc)
    if hostname:
        address["hostname"] = hostname
    if (pod.get("spec") or {}).get("nodeName"):
        address["nodeName"] = pod["spec"]["nodeName"]
    address["targetRef"] = target_ref(pod)
    return address


def _endpoint_port(svc_port: Object, number: int) -> Object:
    port: Object = {}
    if svc_port.get("name"):
        port["name"] = svc_port["name"]
    port["port"] = number
    port["protocol"] = svc_port.get("protocol") or "TCP"
    if svc_port.get("appProtocol"):
        port["appProtocol"] = svc_port["appProtocol"]
    return port


def _port_key(port: Object) -> tuple[str, int, str]:
    return str(port.get("name", "")), int(port.get("port", 0)), str(port.get("protocol", ""))


def repack(entries: list[tuple[Object, bool, Object | None]]) -> list[Object]:
    """endpoints.RepackSubsets: (address, ready, port or None) → subsets where every address
    of a subset offers exactly the subset's ports."""
    addresses: dict[tuple[str, str], tuple[Object, bool]] = {}
    by_port: dict[tuple[str, int, str] | None, set[tuple[str, str]]] = {}
    ports: dict[tuple[str, int, str], Object] = {}
    for address, ready, port in entries:
        akey = (address["ip"], address.get("targetRef", {}).get("uid", ""))
        addresses[akey] = (address, ready)
        pkey = _port_key(port) if port is not None else None
        if port is not None:
            ports[_port_key(port)] = port
        by_port.setdefault(pkey, set()).add(akey)
    groups: dict[frozenset[tuple[str, str]], list[tuple[str, int, str]]] = {}
    for pkey, akeys in by_port.items():
        group = groups.setdefault(frozenset(akeys), [])
        if pkey is not None:
            group.append(pkey)
    subsets = []
    for akeys, pkeys in groups.items():
        ordered = sorted(akeys, key=lambda k: (_ip_sort_key(k[0]), k[1]))
        subset: Object = {}
        ready = [addresses[k][0] for k in ordered if addresses[k][1]]
        not_ready = [addresses[k][0] for k in ordered if not addresses[k][1]]
        if ready:
            subset["addresses"] = ready
        if not_ready:
            subset["notReadyAddresses"] = not_ready
        if pkeys:
            subset["ports"] = [ports[k] for k in sorted(pkeys)]
        subsets.append(subset)

    def first_ip(subset: Object) -> tuple[int, int, str]:
        return _ip_sort_key(((subset.get("addresses") or subset.get("notReadyAddresses"))[0])["ip"])

    return sorted(subsets, key=first_ip)


def endpoint_subsets(svc: Object, pods: list[Object]) -> list[Object]:
    spec = svc.get("spec") or {}
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    entries: list[tuple[Object, bool, Object | None]] = []
    for pod in pods:
        if not in_endpoints(pod, publish_not_ready):
            continue
        ips = ipv4(pod_ips(pod))
        if not ips:
            continue
        address = _endpoint_address(pod, svc, ips[0])
        ready = publish_not_ready or framework.is_ready(pod)
        svc_ports = spec.get("ports") or []
        if not svc_ports and spec.get("clusterIP") == "None":
            entries.append((address, ready, None))
        for svc_port in svc_ports:
            number = find_port(pod, svc_port)
            if number is not None:
                entries.append((address, ready, _endpoint_port(svc_port, number)))
    return repack(entries)


def _with_headless_label(labels: dict[str, str], svc: Object) -> dict[str, str]:
    labels = dict(labels)
    if (svc.get("spec") or {}).get("clusterIP") == "None":
        labels[HEADLESS_LABEL] = ""
    else:
        labels.pop(HEADLESS_LABEL, None)
    return labels


class EndpointsController(_ServiceQueueing):
    def __init__(self, store: store_mod.Store, informers: framework.Informers,
                 clock: framework.Clock) -> None:
        super().__init__(store, informers, clock)
        self.endpoints = informers.get("", "endpoints")
        self.endpoints.handlers.append(self._on_endpoints)

    def _on_endpoints(self, event: str, new: Object | None, old: Object | None) -> None:
        # Someone else changed or removed what this controller owns: put it back.
        key = framework.key_of(new or old)  # type: ignore[arg-type]
        if self.services.get(*key) is not None:
            self.queue.add(key)

    async def sync(self, key: Key) -> None:
        svc = self.services.get(*key)
        if svc is None:
            self.triggers.forget(key)
            await self._delete(key)
            return
        selector = selected_by(svc)
        if selector is None:
            return
        pods = self.selected_pods(svc, selector)
        subsets = endpoint_subsets(svc, pods)
        trigger = self.triggers.compute(svc, pods)
        current = self.endpoints.get(*key)
        labels = _with_headless_label(svc["metadata"].get("labels") or {}, svc)
        if current is not None and (current.get("subsets") or []) == subsets and \
                _without(current["metadata"].get("labels") or {}, HEADLESS_LABEL) == \
                (svc["metadata"].get("labels") or {}):
            return
        desired = copy.deepcopy(current) if current is not None else {
            "metadata": {"name": key[1], "namespace": key[0]}}
        meta = desired["metadata"]
        meta["labels"] = labels
        annotations = dict(meta.get("annotations") or {})
        if trigger:
            annotations[TRIGGER_TIME] = trigger
        else:
            annotations.pop(TRIGGER_TIME, None)
        meta["annotations"] = annotations
        if not annotations:
            meta.pop("annotations")
        if not labels:
            meta.pop("labels")
        desired.pop("subsets", None)
        if subsets:
            desired["subsets"] = subsets
        try:
            await self.write(self.endpoints.kind, current, desired)
        except errors.StatusError as e:
            if e.code != 404:  # the namespace is going away
                raise

    async def _delete(self, key: Key) -> None:
        if self.endpoints.get(*key) is None:
            return
        try:
            await self.store.delete(self.endpoints.kind, key[0], key[1], store_mod.DeleteOptions())
        except errors.StatusError as e:
            if e.code != 404:
                raise


def _without(labels: dict[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != name}


# ---------------------------------------------------------------------- EndpointSlices


def _slice_port(svc_port: Object, number: int) -> Object:
    port: Object = {"name": svc_port.get("name", ""), "protocol": svc_port.get("protocol") or "TCP",
                    "port": number}
    if svc_port.get("appProtocol"):
        port["appProtocol"] = svc_port["appProtocol"]
    return port


def _slice_endpoint(pod: Object, node: Object | None, svc: Object, ips: list[str]) -> Object:
    publish_not_ready = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
    serving = framework.is_ready(pod)
    terminating = bool(pod["metadata"].get("deletionTimestamp"))
    # A terminating Pod is never "ready", unless the Service publishes not-ready addresses.
    ready = publish_not_ready or (serving and not terminating)
    endpoint: Object = {"addresses": ips,
                        "conditions": {"ready": ready, "serving": serving, "terminating": terminating}}
    hostname = hostname_for(pod, svc)
    if hostname:
        endpoint["hostname"] = hostname
    endpoint["targetRef"] = target_ref(pod)
    if (pod.get("spec") or {}).get("nodeName"):
        endpoint["nodeName"] = pod["spec"]["nodeName"]
    zone = ((node or {}).get("metadata", {}).get("labels") or {}).get("topology.kubernetes.io/zone")
    if zone:
        endpoint["zone"] = zone
    return endpoint


def _slice_labels(svc: Object) -> dict[str, str]:
    labels = {k: v for k, v in (svc["metadata"].get("labels") or {}).items()
              if k not in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL)}
    labels = _with_headless_label(labels, svc)
    labels[SERVICE_NAME_LABEL] = svc["metadata"]["name"]
    labels[MANAGED_BY_LABEL] = SLICE_CONTROLLER
    return labels


class EndpointSliceController(_ServiceQueueing):
    def __init__(self, store: store_mod.Store, informers: framework.Informers,
                 clock: framework.Clock) -> None:
        super().__init__(store, informers, clock)
        self.slices = informers.get("discovery.k8s.io", "endpointslices")
        self.nodes = informers.get("", "nodes")
        self.slices.handlers.append(self._on_slice)
        self.nodes.handlers.append(self._on_node)

    def _on_slice(self, event: str, new: Object | None, old: Object | None) -> None:
        labels = ((new or old or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == SLICE_CONTROLLER and labels.get(SERVICE_NAME_LABEL):
            namespace = (new or old)["metadata"].get("namespace", "")  # type: ignore[index]
            self.queue.add((namespace, labels[SERVICE_NAME_LABEL]))

    def _on_node(self, event: str, new: Object | None, old: Object | None) -> None:
        # A Node appearing, going or changing zone changes the endpoints of the Pods on it.
        if event == "MODIFIED" and new is not None and old is not None and \
                (new["metadata"].get("labels") or {}) == (old["metadata"].get("labels") or {}):
            return
        name = (new or old)["metadata"]["name"]  # type: ignore[index]
        for pod in self.pods.list():
            if (pod.get("spec") or {}).get("nodeName") == name:
                self.enqueue_services_of(pod)

    def owned_slices(self, svc: Object) -> list[Object]:
        name = svc["metadata"]["name"]
        return sorted((s for s in self.slices.list(svc["metadata"].get("namespace", ""))
                       if (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == name
                       and (s["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == SLICE_CONTROLLER
                       and s.get("addressType") == "IPv4"),
                      key=lambda s: s["metadata"]["name"])

    def desired_groups(self, svc: Object, pods: list[Object]) -> dict[str, tuple[list[Object], list[Object]]]:
        """Endpoints grouped by port set: {port-set key: (ports, endpoints)}."""
        spec = svc.get("spec") or {}
        groups: dict[str, tuple[list[Object], list[Object]]] = {}
        for pod in pods:
            if not in_endpoints(pod, True):
                continue
            ports = []
            for svc_port in spec.get("ports") or []:
                number = find_port(pod, svc_port)
                if number is not None:
                    ports.append(_slice_port(svc_port, number))
            group = groups.setdefault(repr(sorted(ports, key=_port_key)), (ports, []))
            node_name = (pod.get("spec") or {}).get("nodeName", "")
            node = self.nodes.get("", node_name) if node_name else None
            if node is None and not spec.get("publishNotReadyAddresses"):
                continue  # upstream skips it until its Node exists (the Node's arrival requeues)
            ips = ipv4(pod_ips(pod))
            if ips:
                group[1].append(_slice_endpoint(pod, node, svc, ips))
        return groups

    async def sync(self, key: Key) -> None:
        svc = self.services.get(*key)
        if svc is None:
            self.triggers.forget(key)
            return  # the garbage collector removes the slices it owns
        if svc["metadata"].get("deletionTimestamp") or selected_by(svc) is None:
            return
        selector = selected_by(svc)
        assert selector is not None
        pods = self.selected_pods(svc, selector)
        trigger = self.triggers.compute(svc, pods)
        desired: list[tuple[list[Object] | None, list[Object] | None]] = []
        for ports, endpoints in self.desired_groups(svc, pods).values():
            endpoints.sort(key=lambda e: _ip_sort_key(e["addresses"][0]))
            for start in range(0, len(endpoints), MAX_ENDPOINTS_PER_SLICE):
                desired.append((ports, endpoints[start:start + MAX_ENDPOINTS_PER_SLICE]))
        if not desired:
            desired.append((None, None))  # the placeholder every selecting Service keeps
        await self._reconcile(svc, desired, trigger)

    async def _reconcile(self, svc: Object, desired: list[tuple[list[Object] | None, list[Object] | None]],
                         trigger: str) -> None:
        existing = self.owned_slices(svc)
        labels = _slice_labels(svc)
        unmatched = list(existing)
        pending: list[tuple[list[Object] | None, list[Object] | None]] = []
        for ports, endpoints in desired:
            same = next((s for s in unmatched if s.get("ports") == ports and s.get("endpoints") == endpoints
                         and s["metadata"].get("labels") == labels), None)
            if same is not None:
                unmatched.remove(same)
            else:
                pending.append((ports, endpoints))
        for ports, endpoints in pending:
            # Reuse a slice with the same ports first, then any left over, then a new one.
            reuse = next((s for s in unmatched if s.get("ports") == ports), None) or \
                (unmatched[0] if unmatched else None)
            if reuse is not None:
                unmatched.remove(reuse)
            await self._write_slice(svc, reuse, labels, ports, endpoints, trigger)
        for stale in unmatched:
            await self._delete_slice(stale)

    async def _write_slice(self, svc: Object, current: Object | None, labels: dict[str, str],
                           ports: list[Object] | None, endpoints: list[Object] | None, trigger: str) -> None:
        meta = svc["metadata"]
        if current is None:
            body: Object = {"metadata": {
                "generateName": f"{meta['name'][:57]}-", "namespace": meta.get("namespace", ""),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]}}
        else:
            body = copy.deepcopy(current)
        body["metadata"]["labels"] = labels
        annotations = dict(body["metadata"].get("annotations") or {})
        if trigger:
            annotations[TRIGGER_TIME] = trigger
        else:
            annotations.pop(TRIGGER_TIME, None)
        body["metadata"]["annotations"] = annotations
        if not annotations:
            body["metadata"].pop("annotations")
        body["addressType"] = "IPv4"
        body["endpoints"] = endpoints
        body["ports"] = ports
        try:
            await self.write(self.slices.kind, current, body)
        except errors.StatusError as e:
            if e.code != 404:
                raise

    async def _delete_slice(self, obj: Object) -> None:
        meta = obj["metadata"]
        try:
            await self.store.delete(self.slices.kind, meta["namespace"], meta["name"],
                                    store_mod.DeleteOptions(precondition_uid=meta.get("uid")))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise


# ---------------------------------------------------------------------- kube-apiserver's own


async def publish_apiserver(store: store_mod.Store, ip: str, port: int) -> None:
    """Point default/kubernetes at the serving apiserver (kube-apiserver's endpoint reconciler):
    an Endpoints and an EndpointSlice named `kubernetes` with one address and port `https`."""
    endpoints_kind = store.registry.lookup("", "v1", "endpoints")
    slices_kind = store.registry.lookup("discovery.k8s.io", "v1", "endpointslices")
    assert endpoints_kind is not None and slices_kind is not None
    endpoints = {
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }
    endpoint_slice = {
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {SERVICE_NAME_LABEL: "kubernetes"}},
        "addressType": "IPv6" if ":" in ip else "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "protocol": "TCP", "port": port}],
    }
    for kind_info, body, fields in ((endpoints_kind, endpoints, ("subsets",)),
                                    (slices_kind, endpoint_slice, ("addressType", "endpoints", "ports"))):
        options = store_mod.WriteOptions(field_manager="kube-apiserver")
        try:
            current = await store.get(kind_info, "default", "kubernetes")
        except errors.StatusError as e:
            if e.code != 404:
                raise
            await store.create(kind_info, "default", body, options)
            continue
        if all(current.get(f) == body[f] for f in fields):
            continue
        current.update({f: body[f] for f in fields})
        await store.update(kind_info, "default", "kubernetes", current, options)

