"""API Priority and Fairness configuration as a kube-apiserver keeps it: the mandatory and
suggested PriorityLevelConfigurations and FlowSchemas (its config producer) and each
FlowSchema's `Dangling` condition (its config controller).

The objects are upstream's bootstrap configuration (k8s.io/apiserver
pkg/apis/flowcontrol/bootstrap), written here as data. When a client first asks for either
kind (`Store.on_first_access`; an idle tenant never writes them) a missing one is created and
one whose `apf.kubernetes.io/autoupdate-spec` annotation is `true` gets upstream's spec back;
a mandatory one (`exempt`, `catch-all`) that is deleted is created again at once. Every
FlowSchema is `Dangling=False` (Found) while the PriorityLevelConfiguration it names exists,
`Dangling=True` (NotFound) otherwise, with upstream's message.

This server does not apply priority and fairness to requests (its own per-tenant fairness is
`apiserver/fairness.py`); the objects are there because clients read them (`kubectl get
flowschemas`, the `X-Kubernetes-PF-*` conventions of dashboards). Started by
`controllers.manager.Manager`.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import framework

Object = dict[str, Any]
GROUP = "flowcontrol.apiserver.k8s.io"
MANAGER = "api-priority-and-fairness-config-producer-v1"
STATUS_MANAGER = "api-priority-and-fairness-config-consumer-v1"
AUTO_UPDATE = "apf.kubernetes.io/autoupdate-spec"

_ALL_RESOURCES = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                  "namespaces": ["*"]}
_ALL_NON_RESOURCES = {"verbs": ["*"], "nonResourceURLs": ["*"]}
_EVERYONE = ("system:unauthenticated", "system:authenticated")
_KCM, _SCHEDULER = "system:kube-controller-manager", "system:kube-scheduler"


def _group(name: str) -> Object:
    return {"kind": "Group", "group": {"name": name}}


def _user(name: str) -> Object:
    return {"kind": "User", "user": {"name": name}}


def _kube_system_service_accounts() -> Object:
    return {"kind": "ServiceAccount", "serviceAccount": {"name": "*", "namespace": "kube-system"}}


def _limited(shares: int, lendable: int, queues: int = 0, hand: int = 0, length: int = 0) -> Object:
    response: Object = {"type": "Reject"} if not queues else {
        "type": "Queue", "queuing": {"queues": queues, "handSize": hand, "queueLengthLimit": length}}
    return {"type": "Limited", "limited": {"nominalConcurrencyShares": shares, "lendablePercent": lendable,
                                           "limitResponse": response}}


def _everything(*subjects: Object) -> Object:
    return {"subjects": list(subjects), "resourceRules": [dict(_ALL_RESOURCES)],
            "nonResourceRules": [dict(_ALL_NON_RESOURCES)]}


def _schema(level: str, precedence: int, method: str, *rules: Object) -> Object:
    spec: Object = {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": precedence}
    if method:
        spec["distinguisherMethod"] = {"type": method}
    spec["rules"] = list(rules)
    return spec


# name → spec; `exempt` and `catch-all` are mandatory, the rest suggested.
PRIORITY_LEVELS: dict[str, Object] = {
    "catch-all": _limited(5, 0),
    "exempt": {"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}},
    "system": _limited(30, 33, 64, 6, 50),
    "node-high": _limited(40, 25, 64, 6, 50),
    "leader-election": _limited(10, 0, 16, 4, 50),
    "workload-high": _limited(40, 50, 128, 6, 50),
    "workload-low": _limited(100, 90, 128, 6, 50),
    "global-default": _limited(20, 50, 128, 6, 50),
}
FLOW_SCHEMAS: dict[str, Object] = {
    "exempt": _schema("exempt", 1, "", _everything(_group("system:masters"))),
    "catch-all": _schema("catch-all", 10000, "ByUser", _everything(*map(_group, _EVERYONE))),
    "system-nodes": _schema("system", 500, "ByUser", _everything(_group("system:nodes"))),
    "system-node-high": _schema("node-high", 400, "ByUser", {
        "subjects": [_group("system:nodes")],
        "resourceRules": [
            {"verbs": ["*"], "apiGroups": [""], "resources": ["nodes", "nodes/status"], "clusterScope": True,
             "namespaces": ["*"]},
            {"verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "namespaces": ["*"]},
        ]}),
    "probes": _schema("exempt", 2, "", {
        "subjects": [_group(g) for g in _EVERYONE],
        "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}]}),
    "system-leader-election": _schema("leader-election", 100, "ByUser", {
        "subjects": [_user(_KCM), _user(_SCHEDULER), _kube_system_service_accounts()],
        "resourceRules": [{"verbs": ["get", "create", "update"], "apiGroups": ["coordination.k8s.io"],
                           "resources": ["leases"], "namespaces": ["*"]}]}),
    "kube-controller-manager": _schema("workload-high", 800, "ByNamespace", _everything(_user(_KCM))),
    "kube-scheduler": _schema("workload-high", 800, "ByNamespace", _everything(_user(_SCHEDULER))),
    "kube-system-service-accounts": _schema("workload-high", 900, "ByNamespace",
                                            _everything(_kube_system_service_accounts())),
    "service-accounts": _schema("workload-low", 9000, "ByUser",
                                _everything(_group("system:serviceaccounts"))),
    "global-default": _schema("global-default", 9900, "ByUser", _everything(*map(_group, _EVERYONE))),
}
MANDATORY = frozenset({"exempt", "catch-all"})
_BOOTSTRAP = ("", "*bootstrap*")


def _dangling_condition(schema: Object) -> Object | None:
    for cond in (schema.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Dangling":
            return cond
    return None


class FlowControlController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers,
                 clock: framework.Clock) -> None:
        self.store = store
        self.clock = clock
        self.queue = framework.WorkQueue(clock)
        self.levels = informers.get(GROUP, "prioritylevelconfigurations")
        self.schemas = informers.get(GROUP, "flowschemas")
        self.levels.handlers.append(self._on_level)
        self.schemas.handlers.append(self._on_schema)
        # Made when a client first asks for either kind (Store.on_first_access): an idle tenant
        # never writes them.
        self.materialized = False
        hook = self._materialize
        store.on_first_access[(GROUP, "prioritylevelconfigurations")] = hook
        store.on_first_access[(GROUP, "flowschemas")] = hook

    async def _materialize(self) -> None:
        await self._ensure(self.levels, PRIORITY_LEVELS)
        await self._ensure(self.schemas, FLOW_SCHEMAS)
        for schema in self.schemas.list():
            await self._sync_dangling(schema)
        self.materialized = True

    def _on_level(self, event: str, new: Object | None, old: Object | None) -> None:
        if event in ("ADDED", "DELETED"):
            for schema in self.schemas.list():
                self.queue.add(framework.key_of(schema))
        mandatory = old is not None and old["metadata"]["name"] in MANDATORY
        if event == "DELETED" and mandatory and self.materialized:
            self.queue.add(_BOOTSTRAP)

    def _on_schema(self, event: str, new: Object | None, old: Object | None) -> None:
        if new is not None:
            self.queue.add(framework.key_of(new))
        elif old is not None and old["metadata"]["name"] in MANDATORY and self.materialized:
            self.queue.add(_BOOTSTRAP)

    async def sync(self, key: tuple[str, str]) -> None:
        if key == _BOOTSTRAP:
            await self._ensure(self.levels, PRIORITY_LEVELS)
            await self._ensure(self.schemas, FLOW_SCHEMAS)
            return
        schema = self.schemas.get(*key)
        if schema is not None:
            await self._sync_dangling(schema)

    async def _ensure(self, informer: framework.Informer, wanted: dict[str, Object]) -> None:
        for name, spec in wanted.items():
            present = informer.get("", name)
            try:
                if present is None:
                    await self.store.create(informer.kind, "", {
                        "metadata": {"name": name, "annotations": {AUTO_UPDATE: "true"}}, "spec": spec},
                        store_mod.WriteOptions(field_manager=MANAGER))
                elif ((present["metadata"].get("annotations") or {}).get(AUTO_UPDATE) == "true"
                      and present.get("spec") != spec):
                    updated = framework.clone(present)
                    updated["spec"] = framework.clone(spec)
                    await self.store.update(informer.kind, "", name, updated,
                                            store_mod.WriteOptions(field_manager=MANAGER))
            except errors.StatusError as e:
                if e.reason not in ("AlreadyExists", "Conflict", "NotFound"):
                    raise

    async def _sync_dangling(self, schema: Object) -> None:
        level = str(((schema.get("spec") or {}).get("priorityLevelConfiguration") or {}).get("name") or "")
        named = f'This FlowSchema references the PriorityLevelConfiguration object named "{level}"'
        if self.levels.get("", level) is not None:
            status, reason, message = "False", "Found", f"{named} and it exists"
        else:
            status, reason, message = "True", "NotFound", f"{named} but there is no such object"
        current = _dangling_condition(schema)
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
                status, reason, message):
            return
        updated = framework.clone(schema)
        conditions = [c for c in (updated.get("status") or {}).get("conditions") or []
                      if not (isinstance(c, dict) and c.get("type") == "Dangling")]
        conditions.append({"type": "Dangling", "status": status,
                           "lastTransitionTime": objects.rfc3339(self.clock.now()),
                           "reason": reason, "message": message})
        updated.setdefault("status", {})["conditions"] = conditions
        try:
            await self.store.update(self.schemas.kind, "", schema["metadata"]["name"], updated,
                                    store_mod.WriteOptions(field_manager=STATUS_MANAGER, subresource="status",
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code == 409:
                self.queue.add_rate_limited(framework.key_of(schema))
            elif e.code != 404:
                raise
