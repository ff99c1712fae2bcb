"""Kinds are data: one `KindInfo` row per served resource.

Built-in kinds are listed in `BUILTIN_KINDS`; CustomResourceDefinitions become rows at
run time (see `crds.py`). Everything that differs between kinds — scope, short names,
subresources, printer columns, schema, per-kind hooks — hangs off a row, so adding a
kind is adding a row, not a code path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Schema = dict[str, Any]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class PrinterColumn:
    """A Table column. `json_path` is a Kubernetes JSONPath (CRD additionalPrinterColumns);
    `compute` names a function in `printers.py` for built-in columns that need logic."""

    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0
    json_path: str = ""
    compute: str = ""


@dataclass(frozen=True)
class KindInfo:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # Subresource name → kind served at it ("status" → same kind, "scale" → autoscaling/v1 Scale, ...).
    subresources: tuple[str, ...] = ()
    # Name of the built-in OpenAPI definition; CRDs carry `schema` instead.
    definition: str = ""
    schema: Schema | None = field(default=None, compare=False, hash=False)
    printer_columns: tuple[PrinterColumn, ...] | None = None
    # Where scale reads and writes replicas (CRDs configure these; built-ins use the defaults).
    scale_spec_path: str = ".spec.replicas"
    scale_status_path: str = ".status.replicas"
    scale_selector_path: str = ".status.selector"
    # Whether the kind is a CustomResource (merge-patch only, no strategic merge).
    custom: bool = False
    # Stored but not listable/creatable through normal verbs (e.g. review kinds answer POST only).
    storage: bool = True
    # The version objects are stored in when several versions share them ("" = this row's version);
    # `conversion.py` converts between them.
    storage_version: str = ""

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def api_version(self) -> str:
        return self.group_version

    @property
    def storage_api_version(self) -> str:
        """The apiVersion objects of this kind are stored in (every served version shares them)."""
        version = self.storage_version or self.version
        return f"{self.group}/{version}" if self.group else version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def storage_group(self) -> str:
        return self.group or "core"

    def has_subresource(self, name: str) -> bool:
        return name in self.subresources


def _builtin(
    group: str,
    version: str,
    kind: str,
    plural: str,
    *,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    subresources: tuple[str, ...] = (),
    definition: str = "",
    verbs: tuple[str, ...] = ALL_VERBS,
) -> KindInfo:
    package = {
        "": "core",
        "rbac.authorization.k8s.io": "rbac",
        "scheduling.k8s.io": "scheduling",
        "coordination.k8s.io": "coordination",
        "events.k8s.io": "events",
        "apiextensions.k8s.io": "apiextensions",
        "authorization.k8s.io": "authorization",
        "authentication.k8s.io": "authentication",
    }.get(group, group)
    if not definition:
        prefix = "io.k8s.apiextensions-apiserver.pkg.apis" if package == "apiextensions" else "io.k8s.api"
        definition = f"{prefix}.{package}.{version}.{kind}"
    return KindInfo(
        group=group,
        version=version,
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        verbs=verbs,
        subresources=subresources,
        definition=definition,
    )


_ALL = ("all",)
_CREATE_ONLY = ("create",)

# The built-in kinds this server serves, as a real 1.37 cluster names them.
BUILTIN_KINDS: tuple[KindInfo, ...] = (
    _builtin(
        "",
        "v1",
        "Namespace",
        "namespaces",
        namespaced=False,
        short=("ns",),
        subresources=("status", "finalize"),
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    ),
    _builtin(
        "",
        "v1",
        "Pod",
        "pods",
        short=("po",),
        categories=_ALL,
        subresources=(
            "status",
            "binding",
            "eviction",
            "log",
            "exec",
            "attach",
            "portforward",
            "ephemeralcontainers",
            "resize",
        ),
    ),
    _builtin("", "v1", "Binding", "bindings", verbs=_CREATE_ONLY),
    _builtin("", "v1", "Secret", "secrets"),
    _builtin("", "v1", "ConfigMap", "configmaps", short=("cm",)),
    _builtin(
        "",
        "v1",
        "Service",
        "services",
        short=("svc",),
        categories=_ALL,
        subresources=("status", "proxy"),
        verbs=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"),
    ),
    _builtin("", "v1", "ServiceAccount", "serviceaccounts", short=("sa",), subresources=("token",)),
    _builtin("", "v1", "Event", "events", short=("ev",)),
    _builtin(
        "", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", short=("pvc",), subresources=("status",)
    ),
    _builtin("", "v1", "Node", "nodes", namespaced=False, short=("no",), subresources=("status", "proxy")),
    _builtin("", "v1", "Endpoints", "endpoints", short=("ep",)),
    _builtin("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices",
             definition="io.k8s.api.discovery.v1.EndpointSlice"),
    _builtin("", "v1", "LimitRange", "limitranges", short=("limits",)),
    _builtin("", "v1", "ResourceQuota", "resourcequotas", short=("quota",), subresources=("status",)),
    _builtin("events.k8s.io", "v1", "Event", "events", short=("ev",)),
    _builtin(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        short=("deploy",),
        categories=_ALL,
        subresources=("status", "scale"),
    ),
    _builtin(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        short=("rs",),
        categories=_ALL,
        subresources=("status", "scale"),
    ),
    _builtin(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        short=("sts",),
        categories=_ALL,
        subresources=("status", "scale"),
    ),
    _builtin(
        "apps", "v1", "DaemonSet", "daemonsets", short=("ds",), categories=_ALL, subresources=("status",)
    ),
    _builtin("apps", "v1", "ControllerRevision", "controllerrevisions"),
    _builtin("batch", "v1", "Job", "jobs", categories=_ALL, subresources=("status",)),
    _builtin("batch", "v1", "CronJob", "cronjobs", short=("cj",), categories=_ALL, subresources=("status",)),
    _builtin(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        short=("pdb",),
        subresources=("status",),
    ),
    _builtin("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False, short=("pc",)),
    _builtin("coordination.k8s.io", "v1", "Lease", "leases"),
    _builtin("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    _builtin("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
    _builtin("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False),
    _builtin(
        "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False
    ),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        namespaced=False,
        short=("crd", "crds"),
        subresources=("status",),
    ),
    # Review kinds: POST-only, never stored.
    _builtin(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        namespaced=False,
        verbs=_CREATE_ONLY,
    ),
    _builtin(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        namespaced=False,
        verbs=_CREATE_ONLY,
    ),
    _builtin(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        namespaced=False,
        verbs=_CREATE_ONLY,
    ),
    _builtin(
        "authorization.k8s.io",
        "v1",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        verbs=_CREATE_ONLY,
    ),
    _builtin(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        namespaced=False,
        verbs=_CREATE_ONLY,
    ),
    _builtin(
        "authentication.k8s.io", "v1", "TokenReview", "tokenreviews", namespaced=False, verbs=_CREATE_ONLY
    ),
)
