"""The bootstrap RBAC policy every logical cluster starts with, as upstream ships it.

cluster-admin (bound to system:masters); admin, edit and view as aggregating roles fed by
system:aggregate-to-{admin,edit,view}; system:basic-user (access reviews and whoami for
every authenticated user); system:discovery (API discovery for authenticated users);
system:public-info-viewer (health and /version, also for anonymous requests);
system:monitoring; system:auth-delegator (TokenReview and SubjectAccessReview, unbound);
system:service-account-issuer-discovery (the OIDC documents, for every ServiceAccount);
system:node-proxier (kube-proxy's, bound to the user system:kube-proxy: node agents read
Services and EndpointSlices as it, see node/services.py). Each carries
`kubernetes.io/bootstrapping: rbac-defaults` and
`rbac.authorization.kubernetes.io/autoupdate: "true"`. The roles of control-plane
components that do not exist here (kubelet, scheduler, controllers) are left out.

`ensure()` runs at every start of a logical cluster (`policy.ClusterPolicy.start`): it
creates what is missing and, like the real reconciler, adds back missing rules, subjects,
labels and annotations to objects still marked autoupdate; it never removes anything.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import store as store_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]

GROUP = "rbac.authorization.k8s.io"
BOOTSTRAP_LABEL = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE = "rbac.authorization.kubernetes.io/autoupdate"
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"
MANAGER = "kube-apiserver"

_READ = ("get", "list", "watch")
_WRITE = ("create", "delete", "deletecollection", "patch", "update")
_ALL = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _rule(groups: tuple[str, ...], resources: tuple[str, ...], verbs: tuple[str, ...]) -> Object:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


def _urls(urls: tuple[str, ...], verbs: tuple[str, ...] = ("get",)) -> Object:
    return {"nonResourceURLs": list(urls), "verbs": list(verbs)}


# (name, extra labels, aggregates-from label or "", rules)
_CLUSTER_ROLES: tuple[tuple[str, dict[str, str], str, tuple[Object, ...]], ...] = (
    ("admin", {}, "admin", ()),
    ("cluster-admin", {}, "", (_rule(("*",), ("*",), ("*",)), _urls(("*",), ("*",)))),
    ("edit", {AGGREGATE_TO + "admin": "true"}, "edit", ()),
    (
        "system:aggregate-to-admin",
        {AGGREGATE_TO + "admin": "true"},
        "",
        (
            _rule(("authorization.k8s.io",), ("localsubjectaccessreviews",), ("create",)),
            _rule((GROUP,), ("rolebindings", "roles"), _ALL),
        ),
    ),
    (
        "system:aggregate-to-edit",
        {AGGREGATE_TO + "edit": "true"},
        "",
        (
            _rule(
                ("",),
                ("pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"),
                _READ,
            ),
            _rule(("",), ("serviceaccounts",), ("impersonate",)),
            _rule(("",), ("pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"), _WRITE),
            _rule(("",), ("pods/eviction",), ("create",)),
            _rule(
                ("",),
                (
                    "configmaps",
                    "events",
                    "persistentvolumeclaims",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "secrets",
                    "serviceaccounts",
                    "services",
                    "services/proxy",
                ),
                _WRITE,
            ),
            _rule(("",), ("serviceaccounts/token",), ("create",)),
            _rule(
                ("apps",),
                (
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "replicasets",
                    "replicasets/scale",
                    "statefulsets",
                    "statefulsets/scale",
                ),
                _WRITE,
            ),
            _rule(("autoscaling",), ("horizontalpodautoscalers",), _WRITE),
            _rule(("batch",), ("cronjobs", "jobs"), _WRITE),
            _rule(
                ("extensions",),
                (
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "ingresses",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicationcontrollers/scale",
                ),
                _WRITE,
            ),
            _rule(("policy",), ("poddisruptionbudgets",), _WRITE),
            _rule(("networking.k8s.io",), ("ingresses", "networkpolicies"), _WRITE),
            _rule(("coordination.k8s.io",), ("leases",), _ALL),
        ),
    ),
    (
        "system:aggregate-to-view",
        {AGGREGATE_TO + "view": "true"},
        "",
        (
            _rule(
                ("",),
                (
                    "configmaps",
                    "endpoints",
                    "persistentvolumeclaims",
                    "persistentvolumeclaims/status",
                    "pods",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "serviceaccounts",
                    "services",
                    "services/status",
                ),
                _READ,
            ),
            _rule(
                ("",),
                (
                    "bindings",
                    "events",
                    "limitranges",
                    "namespaces/status",
                    "pods/log",
                    "pods/status",
                    "replicationcontrollers/status",
                    "resourcequotas",
                    "resourcequotas/status",
                ),
                _READ,
            ),
            _rule(("",), ("namespaces",), _READ),
            _rule(("discovery.k8s.io",), ("endpointslices",), _READ),
            _rule(
                ("apps",),
                (
                    "controllerrevisions",
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "statefulsets",
                    "statefulsets/scale",
                    "statefulsets/status",
                ),
                _READ,
            ),
            _rule(("autoscaling",), ("horizontalpodautoscalers", "horizontalpodautoscalers/status"), _READ),
            _rule(("batch",), ("cronjobs", "cronjobs/status", "jobs", "jobs/status"), _READ),
            _rule(
                ("extensions",),
                (
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "ingresses",
                    "ingresses/status",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "replicationcontrollers/scale",
                ),
                _READ,
            ),
            _rule(("policy",), ("poddisruptionbudgets", "poddisruptionbudgets/status"), _READ),
            _rule(("networking.k8s.io",), ("ingresses", "ingresses/status", "networkpolicies"), _READ),
        ),
    ),
    (
        "system:auth-delegator",
        {},
        "",
        (
            _rule(("authentication.k8s.io",), ("tokenreviews",), ("create",)),
            _rule(("authorization.k8s.io",), ("subjectaccessreviews",), ("create",)),
        ),
    ),
    (
        "system:basic-user",
        {},
        "",
        (
            _rule(
                ("authorization.k8s.io",),
                ("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
                ("create",),
            ),
            _rule(("authentication.k8s.io",), ("selfsubjectreviews",), ("create",)),
        ),
    ),
    (
        "system:discovery",
        {},
        "",
        (
            _urls(
                (
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                )
            ),
        ),
    ),
    (
        "system:monitoring",
        {},
        "",
        (
            _urls(
                (
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                )
            ),
        ),
    ),
    (
        # kube-proxy's: every node agent also does its job (node/services.py), as `system:kube-proxy`.
        "system:node-proxier",
        {},
        "",
        (
            _rule(("",), ("endpoints", "services"), ("list", "watch")),
            _rule(("",), ("nodes",), _READ),
            _rule(("", "events.k8s.io"), ("events",), ("create", "patch", "update")),
            _rule(("discovery.k8s.io",), ("endpointslices",), ("list", "watch")),
        ),
    ),
    (
        "system:public-info-viewer",
        {},
        "",
        (_urls(("/healthz", "/livez", "/readyz", "/version", "/version/")),),
    ),
    (
        "system:service-account-issuer-discovery",
        {},
        "",
        (
            _urls(
                (
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                )
            ),
        ),
    ),
    ("view", {AGGREGATE_TO + "edit": "true"}, "view", ()),
)

# (binding name = role name, subjects as (kind, name))
_CLUSTER_ROLE_BINDINGS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("cluster-admin", (("Group", "system:masters"),)),
    ("system:basic-user", (("Group", "system:authenticated"),)),
    ("system:discovery", (("Group", "system:authenticated"),)),
    ("system:monitoring", (("Group", "system:monitoring"),)),
    ("system:node-proxier", (("User", "system:kube-proxy"),)),
    ("system:public-info-viewer", (("Group", "system:authenticated"), ("Group", "system:unauthenticated"))),
    ("system:service-account-issuer-discovery", (("Group", "system:serviceaccounts"),)),
)


def _metadata(name: str, labels: dict[str, str]) -> Object:
    return {"name": name, "labels": {**BOOTSTRAP_LABEL, **labels}, "annotations": {AUTOUPDATE: "true"}}


def cluster_roles() -> list[Object]:
    out = []
    for name, labels, aggregates, rules in _CLUSTER_ROLES:
        role: Object = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ClusterRole",
            "metadata": _metadata(name, labels),
        }
        if aggregates:
            role["aggregationRule"] = {
                "clusterRoleSelectors": [{"matchLabels": {AGGREGATE_TO + aggregates: "true"}}]
            }
        if rules:
            role["rules"] = copy.deepcopy(list(rules))
        out.append(role)
    return out


def cluster_role_bindings() -> list[Object]:
    return [
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _metadata(name, {}),
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": GROUP, "kind": kind, "name": who} for kind, who in subjects],
        }
        for name, subjects in _CLUSTER_ROLE_BINDINGS
    ]


async def ensure(store: Any, existing: dict[str, dict[str, Object]] | None = None) -> None:
    """Create the bootstrap policy where missing; top up objects still marked autoupdate.

    `existing` is what the caller has just listed, by plural and name: an object found there
    is only checked, not created again (a restart of a thousand clusters would otherwise run
    some sixty doomed creates each through the whole write path)."""
    registry = store.registry
    for plural, objects in (
        ("clusterroles", cluster_roles()),
        ("clusterrolebindings", cluster_role_bindings()),
    ):
        kind = registry.lookup(GROUP, "v1", plural)
        assert kind is not None, plural
        present = (existing or {}).get(plural, {})
        for wanted in objects:
            found = present.get(wanted["metadata"]["name"])
            if found is not None:
                await _top_up(store, kind, found, wanted)
            else:
                await _ensure_one(store, kind, _pre_aggregated(wanted))


def _pre_aggregated(role: Object) -> Object:
    """An aggregating bootstrap role created with the rules aggregation would give it anyway.

    Every new cluster starts from the same bootstrap roles, so the result is computed once per
    process; it saves a new tenant the aggregation controller's rewrites (view, then edit, then
    admin), a fifth of its start-up time. The controller still owns these rules afterwards.
    """
    rules = _aggregated_bootstrap_rules().get(role["metadata"]["name"])
    return role if rules is None else {**role, "rules": copy.deepcopy(rules)}


@functools.cache
def _aggregated_bootstrap_rules() -> dict[str, list[Object]]:
    from socialweb_computer.auth import controllers

    roles = {role["metadata"]["name"]: role for role in cluster_roles()}
    for _ in range(len(roles)):
        updated = {}
        for name, role in roles.items():
            wanted = controllers.aggregated_rules(role, roles)
            updated[name] = role if wanted is None else {**role, "rules": wanted}
        if updated == roles:
            break
        roles = updated
    return {name: role["rules"] for name, role in roles.items()
            if "aggregationRule" in role and role.get("rules")}


async def _ensure_one(store: Any, kind: Any, wanted: Object) -> None:
    options = store_mod.WriteOptions(field_manager=MANAGER)
    try:
        await store.create(kind, "", copy.deepcopy(wanted), options)
        return
    except errors.StatusError as e:
        if e.reason != "AlreadyExists":
            raise
    await _top_up(store, kind, await store.get(kind, "", wanted["metadata"]["name"]), wanted)


async def _top_up(store: Any, kind: Any, existing: Object, wanted: Object) -> None:
    """Add back what `wanted` has and `existing` lacks, if it is still marked autoupdate."""
    if (existing["metadata"].get("annotations") or {}).get(AUTOUPDATE) != "true":
        return
    if not _lacks(existing, wanted):
        return
    merged = reconcile(existing, wanted)
    if merged is not None:
        name = wanted["metadata"]["name"]
        try:
            await store.update(kind, "", name, merged, store_mod.WriteOptions(field_manager=MANAGER))
        except errors.StatusError as e:  # a concurrent writer won; the next start tops it up
            log.info("bootstrap reconcile of %s %s skipped: %s", kind.plural, name, e)


def _lacks(existing: Object, wanted: Object) -> bool:
    """Whether `reconcile` would change anything, without copying (the common answer is no)."""
    meta = existing.get("metadata") or {}
    for field in ("labels", "annotations"):
        if not (wanted["metadata"].get(field) or {}).keys() <= (meta.get(field) or {}).keys():
            return True
    if "aggregationRule" in wanted:
        selectors = (existing.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
        return any(s not in selectors for s in wanted["aggregationRule"]["clusterRoleSelectors"])
    for field in ("rules", "subjects"):
        present = existing.get(field) or []
        if any(item not in present for item in wanted.get(field) or []):
            return True
    return False


def reconcile(existing: Object, wanted: Object) -> Object | None:
    """The existing object with what `wanted` adds, or None when nothing is missing."""
    merged = copy.deepcopy(existing)
    meta = merged.setdefault("metadata", {})
    for field in ("labels", "annotations"):
        current = meta.setdefault(field, {}) or {}
        meta[field] = {**wanted["metadata"].get(field, {}), **current}
    if "aggregationRule" in wanted:
        selectors = merged.setdefault("aggregationRule", {}).setdefault("clusterRoleSelectors", [])
        for selector in wanted["aggregationRule"]["clusterRoleSelectors"]:
            if selector not in selectors:
                selectors.append(selector)
    else:
        for field in ("rules", "subjects"):
            if field in wanted:
                present = merged.setdefault(field, []) or []
                merged[field] = present + [item for item in wanted[field] if item not in present]
    return None if merged == existing else merged
