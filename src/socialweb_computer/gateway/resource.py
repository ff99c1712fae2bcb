"""The `Cluster` resource of the admin plane: `clusters.socialweb.computer/v1alpha1`.

It is installed as a CustomResourceDefinition, so it gets everything the engine gives any
kind (structural schema with defaults, a status subresource that alone writes status,
printer columns, watch, server-side apply) with no code of its own. `ensure_definition`
keeps the stored definition equal to this one at every gateway start.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from socialweb_computer.api import errors, gofmt, objects
from socialweb_computer.apiserver import kinds, store

Object = dict[str, Any]

GROUP = "socialweb.computer"
VERSION = "v1alpha1"
PLURAL = "clusters"
CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = f"{GROUP}/teardown"
FIELD_MANAGER = "socialweb-computer-gateway"

INITIALIZING, READY, UNAVAILABLE, DRAINING = "Initializing", "Ready", "Unavailable", "Draining"
DEGRADED = "Degraded"  # condition type: serving, but something stored cannot be used (see message)
PHASES = (INITIALIZING, READY, UNAVAILABLE, DRAINING)

_NODE_SETTINGS = {
    "vcpu": {"type": "integer", "minimum": 1, "description": "vCPUs of each node (default: the gateway's)"},
    "memMiB": {"type": "integer", "minimum": 64, "description": "memory of each node in MiB"},
    "rootfsMiB": {"type": "integer", "minimum": 64, "description": "root filesystem of each node in MiB"},
    "releaseAfterSeconds": {
        "type": "integer",
        "minimum": 0,
        "description": "how long a node with no work is kept before it is released",
    },
    "max": {"type": "integer", "minimum": 0, "description": "the most nodes capacity rents for this cluster"},
}

_LIMITS = {
    "objects": {"type": "integer", "minimum": 1, "description": "objects the cluster may hold (Events not "
                                                             "counted)"},
    "pods": {"type": "integer", "minimum": 1, "description": "pods the cluster may hold"},
    "watches": {"type": "integer", "minimum": 1, "description": "watches open at once"},
    "requestsInFlight": {"type": "integer", "minimum": 1,
                         "description": "requests running or waiting their turn at once; more get 429"},
    "controllerWritesPerSecond": {"type": "number", "minimum": 0.01,
                                  "description": "how fast the cluster's controllers may write"},
}

_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer", "format": "int64"},
    },
}

_SCHEMA = {
    "type": "object",
    "description": "A tenant Kubernetes cluster: a control plane on its own loopback port, with nodes "
    "rented when Pods need them.",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "description": "What the cluster should be: running or parked, and how its nodes are sized.",
            "default": {},
            "properties": {
                "running": {
                    "type": "boolean",
                    "default": True,
                    "description": "false parks the control plane: its listener closes and its data is kept",
                },
                "nodes": {
                    "type": "object",
                    "properties": _NODE_SETTINGS,
                    "description": "node settings for this cluster; unset fields take the "
                    "gateway's nodeDefaults",
                },
                "limits": {
                    "type": "object",
                    "properties": _LIMITS,
                    "description": "what this cluster may take of the gateway; unset fields take the "
                    "gateway spec's limits",
                },
                "bidder": {
                    "type": "string",
                    "enum": ["sandbox", "qemu", "none"],
                    "description": "what starts this cluster's nodes (default: the gateway's "
                    "capacity.bidder); none rents no node",
                },
            },
        },
        "status": {
            "type": "object",
            "description": "What the gateway observed; written only through the status subresource.",
            "properties": {
                "phase": {"type": "string", "enum": list(PHASES)},
                "url": {"type": "string", "description": "https://127.0.0.1:<port>, the tenant apiserver"},
                "instance": {
                    "type": "integer",
                    "format": "int64",
                    "description": "bumped each time the control plane is brought up",
                },
                "nodes": {"type": "integer", "format": "int32", "description": "Node objects in the cluster"},
                "observedGeneration": {"type": "integer", "format": "int64"},
                "conditions": {
                    "type": "array",
                    "items": _CONDITION,
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["type"],
                },
            },
        },
    },
}

DEFINITION: Object = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Cluster",
        "names": {"plural": PLURAL, "singular": "cluster", "kind": "Cluster", "listKind": "ClusterList"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": _SCHEMA},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
                    {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }
        ],
    },
}


async def ensure_definition(admin: store.Store) -> kinds.KindInfo:
    """Create or correct the CRD; returns the registry row of the Cluster kind."""
    crd_kind = admin.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    assert crd_kind is not None
    options = store.WriteOptions(field_manager=FIELD_MANAGER)
    try:
        current = await admin.get(crd_kind, "", CRD_NAME)
    except errors.StatusError as e:
        if e.code != 404:
            raise
        await admin.create(crd_kind, "", copy.deepcopy(DEFINITION), options)
    else:
        wanted = copy.deepcopy(DEFINITION)
        if current.get("spec", {}).get("versions", [{}])[0].get("schema") != wanted["spec"]["versions"][0][
            "schema"
        ] or _columns(current) != _columns(wanted):
            wanted["metadata"] = current["metadata"]
            await admin.update(crd_kind, "", CRD_NAME, wanted, options)
    kind = admin.registry.lookup(GROUP, VERSION, PLURAL)
    assert kind is not None, "the Cluster CRD did not register"
    return kind


def check_name(kind: kinds.KindInfo, new: Object, old: Object | None) -> None:
    """A before-write hook of the admin plane: a Cluster's name becomes a directory, a key prefix
    and a kubeconfig context, so it must be a DNS label (the CRD's default rule allows 253
    characters, and such a Cluster could never come up)."""
    if kind.group != GROUP or kind.plural != PLURAL or old is not None:
        return
    meta = new.get("metadata") or {}
    name = meta.get("name") or (f"{meta['generateName']}xxxxx" if meta.get("generateName") else "")
    if not name:
        return
    problems = objects.dns1123_label_errors(name)
    if problems:
        field = "metadata.name" if meta.get("name") else "metadata.generateName"
        shown = meta.get("name") or meta.get("generateName")
        causes = [errors.Cause("FieldValueInvalid", f"Invalid value: {gofmt.quote(shown)}: {p}", field)
                  for p in problems]
        raise errors.invalid("Cluster", meta.get("name", ""), causes, GROUP)


def _columns(crd: Object) -> Any:
    return [v.get("additionalPrinterColumns") for v in crd.get("spec", {}).get("versions", [])]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def degraded_condition(cluster: Object, message: str) -> Object:
    """`Degraded`: serving, but something it stores cannot be used (the message says what)."""
    previous = next(
        (c for c in cluster.get("status", {}).get("conditions", []) if c.get("type") == DEGRADED), {}
    )
    return {
        "type": DEGRADED,
        "status": "True",
        "reason": "UnusableObjects",
        "message": message,
        "lastTransitionTime": (previous.get("lastTransitionTime") if previous.get("status") == "True"
                               else now()),
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }


def ready_condition(cluster: Object, status: str, reason: str, message: str) -> Object:
    """The `Ready` condition, keeping lastTransitionTime while the status does not change."""
    previous = next(
        (c for c in cluster.get("status", {}).get("conditions", []) if c.get("type") == "Ready"), {}
    )
    since = previous.get("lastTransitionTime") if previous.get("status") == status else None
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now(),
        "observedGeneration": cluster["metadata"].get("generation", 1),
    }
