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
    storage_version: str = "",
    storage: bool = True,
) -> KindInfo:
    # The OpenAPI definition's Go package: the group's first label (core for the legacy group).
    package = {"": "core", "rbac.authorization.k8s.io": "rbac"}.get(group, group.split(".")[0])
    if not definition:
        prefix = {"apiextensions": "io.k8s.apiextensions-apiserver.pkg.apis",
                  "apiregistration": "io.k8s.kube-aggregator.pkg.apis"}.get(package, "io.k8s.api")
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
        storage_version=storage_version,
        storage=storage,
    )


_ALL = ("all",)
_CREATE_ONLY = ("create",)
_READ_ONLY = ("get", "list")
_EXTENSIONS = ("api-extensions",)
_STATUS = ("status",)

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
            "proxy",
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
    _builtin("", "v1", "PersistentVolume", "persistentvolumes", namespaced=False, short=("pv",),
             subresources=_STATUS),
    _builtin("", "v1", "ReplicationController", "replicationcontrollers", short=("rc",), categories=_ALL,
             subresources=("status", "scale")),
    _builtin("", "v1", "PodTemplate", "podtemplates"),
    # Answered from the cluster's own state, never stored (componentstatus.py).
    _builtin("", "v1", "ComponentStatus", "componentstatuses", namespaced=False, short=("cs",),
             verbs=_READ_ONLY, storage=False),
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
        categories=_EXTENSIONS,
        subresources=("status",),
    ),
    # autoscaling: v2 is the storage version; v1 is served by conversion (conversion.py).
    _builtin("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", short=("hpa",),
             categories=_ALL, subresources=_STATUS),
    _builtin("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", short=("hpa",),
             categories=_ALL, subresources=_STATUS, storage_version="v2"),
    _builtin("networking.k8s.io", "v1", "Ingress", "ingresses", short=("ing",), subresources=_STATUS),
    _builtin("networking.k8s.io", "v1", "IngressClass", "ingressclasses", namespaced=False),
    _builtin("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", short=("netpol",)),
    _builtin("networking.k8s.io", "v1", "IPAddress", "ipaddresses", namespaced=False, short=("ip",)),
    _builtin("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs", namespaced=False,
             subresources=_STATUS),
    _builtin("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests",
             namespaced=False, short=("csr",), subresources=("approval", "status")),
    _builtin("certificates.k8s.io", "v1", "ClusterTrustBundle", "clustertrustbundles", namespaced=False),
    _builtin("certificates.k8s.io", "v1", "PodCertificateRequest", "podcertificaterequests",
             subresources=_STATUS),
    _builtin("storage.k8s.io", "v1", "StorageClass", "storageclasses", namespaced=False, short=("sc",)),
    _builtin("storage.k8s.io", "v1", "CSIDriver", "csidrivers", namespaced=False),
    _builtin("storage.k8s.io", "v1", "CSINode", "csinodes", namespaced=False),
    _builtin("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities"),
    _builtin("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", namespaced=False,
             subresources=_STATUS),
    _builtin("storage.k8s.io", "v1", "VolumeAttributesClass", "volumeattributesclasses", namespaced=False,
             short=("vac",)),
    _builtin("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
             "mutatingwebhookconfigurations", namespaced=False, categories=_EXTENSIONS),
    _builtin("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration",
             "validatingwebhookconfigurations", namespaced=False, categories=_EXTENSIONS),
    _builtin("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies",
             namespaced=False, categories=_EXTENSIONS, subresources=_STATUS),
    _builtin("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
             "validatingadmissionpolicybindings", namespaced=False, categories=_EXTENSIONS),
    _builtin("admissionregistration.k8s.io", "v1", "MutatingAdmissionPolicy", "mutatingadmissionpolicies",
             namespaced=False, categories=_EXTENSIONS),
    _builtin("admissionregistration.k8s.io", "v1", "MutatingAdmissionPolicyBinding",
             "mutatingadmissionpolicybindings", namespaced=False, categories=_EXTENSIONS),
    _builtin("apiregistration.k8s.io", "v1", "APIService", "apiservices", namespaced=False,
             categories=_EXTENSIONS, subresources=_STATUS),
    _builtin("flowcontrol.apiserver.k8s.io", "v1", "FlowSchema", "flowschemas", namespaced=False,
             subresources=_STATUS),
    _builtin("flowcontrol.apiserver.k8s.io", "v1", "PriorityLevelConfiguration",
             "prioritylevelconfigurations", namespaced=False, subresources=_STATUS),
    _builtin("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", namespaced=False),
    _builtin("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", namespaced=False),
    _builtin("resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules", namespaced=False,
             subresources=_STATUS),
    _builtin("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", subresources=_STATUS),
    _builtin("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    _builtin("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", namespaced=False),
    _builtin("storagemigration.k8s.io", "v1", "StorageVersionMigration", "storageversionmigrations",
             namespaced=False, subresources=_STATUS),
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
