"""The APIServices a kube-apiserver keeps for itself: one local APIService per served
group-version (kube-aggregator's autoregister and crdregistration controllers) and the
`Available` condition of every APIService (its availability controller).

- They are made when a client first asks for APIServices (`Store.on_first_access`), not at
  start, so an idle tenant never writes them; their age says so.
- Built-in group-versions get `<version>.<group>` (`v1.` for the core group) with
  the label `kube-aggregator.kubernetes.io/automanaged: onstart` and upstream's priorities
  (`PRIORITIES`); a group-version with no priority there gets none, as upstream skips it.
  The aggregator's own `apiregistration.k8s.io` gets none either: upstream registers the
  group-versions of the servers it delegates to.
- Every served version of a CustomResourceDefinition gets one with the label value `true`,
  groupPriorityMinimum 1000 and versionPriority 100, and loses it when no CRD serves that
  group-version any more.
- A local APIService (no `spec.service`) is `Available=True` (Local, "Local APIServices are
  always available"). One that names a Service is not proxied by this server: it is
  `Available=False`, ServiceNotFound when the Service is missing, else FailedDiscoveryCheck
  saying that aggregated API servers are not reached from here (docs/api-engine.md).

Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

Object = dict[str, Any]
GROUP, PLURAL = "apiregistration.k8s.io", "apiservices"
MANAGER = "kube-apiserver"
AUTOMANAGED = "kube-aggregator.kubernetes.io/automanaged"
CRD_PRIORITY = (1000, 100)  # crdregistration: CRDs sort below every built-in group

# (group, version) → (groupPriorityMinimum, versionPriority): kube-apiserver's table of the
# priorities of its own group-versions (DefaultGenericAPIServicePriorities merged with the
# kube-apiserver's, pkg/controlplane/apiserver/aggregator.go and cmd/kube-apiserver), for the
# group-versions this server serves.
PRIORITIES: dict[tuple[str, str], tuple[int, int]] = {
    ("", "v1"): (18000, 1),
    ("apps", "v1"): (17800, 15),
    ("events.k8s.io", "v1"): (17750, 15),
    ("authentication.k8s.io", "v1"): (17700, 15),
    ("authorization.k8s.io", "v1"): (17600, 15),
    ("autoscaling", "v1"): (17500, 15),
    ("autoscaling", "v2"): (17500, 30),
    ("batch", "v1"): (17400, 15),
    ("certificates.k8s.io", "v1"): (17300, 15),
    ("networking.k8s.io", "v1"): (17200, 15),
    ("policy", "v1"): (17100, 15),
    ("rbac.authorization.k8s.io", "v1"): (17000, 15),
    ("storage.k8s.io", "v1"): (16800, 15),
    ("apiextensions.k8s.io", "v1"): (16700, 15),
    ("admissionregistration.k8s.io", "v1"): (16700, 15),
    ("scheduling.k8s.io", "v1"): (16600, 15),
    ("coordination.k8s.io", "v1"): (16500, 15),
    ("node.k8s.io", "v1"): (16300, 15),
    ("discovery.k8s.io", "v1"): (16200, 15),
    ("flowcontrol.apiserver.k8s.io", "v1"): (16100, 21),
    # These two went GA after the table this was read from: the group's minimum there, and a
    # version priority above its betas'.
    ("resource.k8s.io", "v1"): (16200, 21),
    ("storagemigration.k8s.io", "v1"): (15800, 15),
}

_SYNC_ALL = ("", "*all*")


def name_of(group: str, version: str) -> str:
    return f"{version}.{group}"


def _wanted(group: str, version: str, priority: tuple[int, int], automanaged: str) -> Object:
    return {"metadata": {"name": name_of(group, version), "labels": {AUTOMANAGED: automanaged}},
            "spec": {"group": group, "version": version, "groupPriorityMinimum": priority[0],
                     "versionPriority": priority[1]}}


def _condition(obj: Object, kind: str) -> Object | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


class APIServiceController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers,
                 clock: framework.Clock) -> None:
        self.store = store
        self.clock = clock
        self.queue = framework.WorkQueue(clock)
        self.apiservices = informers.get(GROUP, PLURAL)
        self.crds = informers.get("apiextensions.k8s.io", "customresourcedefinitions")
        self.services = informers.get("", "services")
        self.apiservices.handlers.append(self._on_apiservice)
        self.crds.handlers.append(self._resync)
        self.services.handlers.append(self._on_service)
        self._registered_on_start = False
        # Made when a client first asks for APIServices (Store.on_first_access): an idle tenant
        # never writes them.
        self.materialized = False
        store.on_first_access[(GROUP, PLURAL)] = self._materialize

    async def _materialize(self) -> None:
        await self._register()
        for apiservice in self.apiservices.list():
            await self._sync_status(apiservice)
        self.materialized = True

    def _resync(self, *_: object) -> None:
        if self.materialized:
            self.queue.add(_SYNC_ALL)

    def _on_apiservice(self, event: str, new: Object | None, old: Object | None) -> None:
        if new is not None:
            self.queue.add(framework.key_of(new))
        elif old is not None and ((old.get("metadata") or {}).get("labels") or {}).get(AUTOMANAGED) == "true":
            self._resync()  # a CRD's APIService deleted by hand comes back

    def _on_service(self, event: str, new: Object | None, old: Object | None) -> None:
        obj = new or old
        if obj is None:
            return
        namespace, name = framework.key_of(obj)
        for apiservice in self.apiservices.list():
            service = (apiservice.get("spec") or {}).get("service") or {}
            if service.get("namespace") == namespace and service.get("name") == name:
                self.queue.add(framework.key_of(apiservice))

    @property
    def _kind(self) -> Any:
        return self.apiservices.kind

    async def sync(self, key: tuple[str, str]) -> None:
        if key == _SYNC_ALL:
            await self._register()
            return
        apiservice = self.apiservices.get(*key)
        if apiservice is not None:
            await self._sync_status(apiservice)

    # ------------------------------------------------------------ registration

    def _crd_group_versions(self) -> set[tuple[str, str]]:
        served = set()
        for crd in self.crds.list():
            spec = crd.get("spec") or {}
            for version in spec.get("versions") or []:
                if isinstance(version, dict) and version.get("served"):
                    served.add((str(spec.get("group") or ""), str(version.get("name") or "")))
        return served

    async def _register(self) -> None:
        wanted: dict[str, Object] = {}
        if not self._registered_on_start:
            builtin = {(k.group, k.version) for k in self.store.registry.all() if not k.custom}
            for group, version in sorted(builtin):
                priority = PRIORITIES.get((group, version))
                if priority is not None:
                    wanted[name_of(group, version)] = _wanted(group, version, priority, "onstart")
        crd_names = set()
        for group, version in sorted(self._crd_group_versions()):
            if (group, version) in PRIORITIES:
                continue
            crd_names.add(name_of(group, version))
            wanted[name_of(group, version)] = _wanted(group, version, CRD_PRIORITY, "true")
        for name, obj in wanted.items():
            present = self.apiservices.get("", name)
            if present is None:
                await self._create(obj)
            elif ((present.get("metadata") or {}).get("labels") or {}).get(AUTOMANAGED) and \
                    {k: v for k, v in (present.get("spec") or {}).items() if k in obj["spec"]} != obj["spec"]:
                updated = framework.clone(present)
                updated["spec"] = {**(updated.get("spec") or {}), **obj["spec"]}
                updated["spec"].pop("service", None)
                await self._write(updated)
        for present in self.apiservices.list():
            meta = present.get("metadata") or {}
            if (meta.get("labels") or {}).get(AUTOMANAGED) == "true" and meta["name"] not in crd_names:
                await self._delete(present)
        self._registered_on_start = True

    async def _create(self, obj: Object) -> None:
        try:
            await self.store.create(self._kind, "", obj, store_mod.WriteOptions(field_manager=MANAGER))
        except errors.StatusError as e:
            if e.reason != "AlreadyExists":
                raise

    async def _write(self, obj: Object, subresource: str = "") -> None:
        try:
            await self.store.update(self._kind, "", obj["metadata"]["name"], obj,
                                    store_mod.WriteOptions(field_manager=MANAGER, subresource=subresource,
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise
            if e.code == 409:
                self.queue.add_rate_limited(framework.key_of(obj))

    async def _delete(self, obj: Object) -> None:
        try:
            await self.store.delete(self._kind, "", obj["metadata"]["name"],
                                    store_mod.DeleteOptions(precondition_uid=obj["metadata"]["uid"]))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    # ------------------------------------------------------------ availability

    def _availability(self, apiservice: Object) -> tuple[str, str, str]:
        service = (apiservice.get("spec") or {}).get("service")
        if not service:
            return "True", "Local", "Local APIServices are always available"
        namespace, name = str(service.get("namespace") or ""), str(service.get("name") or "")
        if self.services.get(namespace, name) is None:
            return "False", "ServiceNotFound", f'service/{name} in "{namespace}" is not present'
        return ("False", "FailedDiscoveryCheck",
                f"failing or missing response from service/{name} in \"{namespace}\": this server does not "
                "proxy to aggregated API servers")

    async def _sync_status(self, apiservice: Object) -> None:
        status, reason, message = self._availability(apiservice)
        current = _condition(apiservice, "Available")
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
                status, reason, message):
            return
        updated = framework.clone(apiservice)
        conditions = [c for c in (updated.get("status") or {}).get("conditions") or []
                      if not (isinstance(c, dict) and c.get("type") == "Available")]
        since = current.get("lastTransitionTime") if current and current.get("status") == status else None
        conditions.append({"type": "Available", "status": status,
                           "lastTransitionTime": since or objects.rfc3339(self.clock.now()),
                           "reason": reason, "message": message})
        updated.setdefault("status", {})["conditions"] = conditions
        await self._write(updated, "status")
