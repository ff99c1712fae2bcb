"""The Node authorizer's graph: which objects each node may read, derived from the pods bound to it.

A kubelet may read a Secret, ConfigMap, PersistentVolumeClaim, PersistentVolume or
ServiceAccount (token) only when a pod bound to its node references it, as upstream's
graph (plugin/pkg/auth/authorizer/node/graph.go) records it:

    node <- pod                   (spec.nodeName)
    node <- pod <- secret         (volumes, projected sources, env, envFrom, imagePullSecrets,
                                   in init, regular and ephemeral containers)
    node <- pod <- configmap      (volumes, projected sources, env, envFrom)
    node <- pod <- pvc            (persistentVolumeClaim volumes; ephemeral volumes' <pod>-<volume>)
    node <- pod <- serviceaccount (spec.serviceAccountName)
    node <- pod <- pvc <- pv      (the PV's claimRef)
    node <- pod <- pvc <- pv <- secret

Upstream keeps vertices and edges; a path question here is a dictionary lookup instead:
for each referenced object, how many pods on each node reference it. An idle cluster (no
bound pods) holds a handful of empty dictionaries.

`Populator` keeps a `Graph` current from the store: loaded at start, then updated by the
store's after-write hooks, which run after a write commits and before it is acknowledged, so
an authorization decision never disagrees with an acknowledged write. Deriving a pod's
references never raises on malformed input; if applying a write fails anyway, the pod is
dropped from the graph (its node loses access: the safe direction) and the graph is rebuilt
from the store. Created by `policy.ClusterPolicy`; read by `nodeauthorizer` and
`noderestriction`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from typing import Any

from socialweb_computer.apiserver import store as store_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]

POD, SECRET, CONFIGMAP = "pod", "secret", "configmap"
PVC, PV, SERVICE_ACCOUNT = "persistentvolumeclaim", "persistentvolume", "serviceaccount"

Ref = tuple[str, str, str]  # (type, namespace, name)

# Volume sources whose secret is named by a field of their own (podutil.VisitPodSecretNames).
_POD_VOLUME_SECRETS: dict[str, tuple[str, ...]] = {
    "secret": ("secretName",),
    "azureFile": ("secretName",),
    "cephfs": ("secretRef", "name"),
    "cinder": ("secretRef", "name"),
    "flexVolume": ("secretRef", "name"),
    "rbd": ("secretRef", "name"),
    "scaleIO": ("secretRef", "name"),
    "iscsi": ("secretRef", "name"),
    "storageos": ("secretRef", "name"),
    "csi": ("nodePublishSecretRef", "name"),
}
# PersistentVolume sources and their SecretReferences (name, namespace) (VisitPVSecretNames).
_PV_SECRET_REFS: dict[str, tuple[str, ...]] = {
    "cephfs": ("secretRef",),
    "cinder": ("secretRef",),
    "flexVolume": ("secretRef",),
    "rbd": ("secretRef",),
    "scaleIO": ("secretRef",),
    "iscsi": ("secretRef",),
    "storageos": ("secretRef",),
    "csi": ("controllerPublishSecretRef", "nodeStageSecretRef", "nodePublishSecretRef",
            "controllerExpandSecretRef", "nodeExpandSecretRef"),
}
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def _dict(value: Any) -> Object:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Object]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _name(value: Any, *path: str) -> str:
    for key in path:
        value = _dict(value).get(key)
    return value if isinstance(value, str) else ""


def pod_references(pod: Object) -> frozenset[Ref]:
    """Every object a pod references that its node may read. Never raises on malformed input."""
    meta, spec = _dict(pod.get("metadata")), _dict(pod.get("spec"))
    namespace, pod_name = _name(meta, "namespace"), _name(meta, "name")
    found: set[tuple[str, str]] = set()
    for ref in _list(spec.get("imagePullSecrets")):
        found.add((SECRET, _name(ref, "name")))
    for list_name in _CONTAINER_LISTS:
        for container in _list(spec.get(list_name)):
            _container_references(container, found)
    for volume in _list(spec.get("volumes")):
        for source_name, source in volume.items():
            if source_name in _POD_VOLUME_SECRETS:
                found.add((SECRET, _name(source, *_POD_VOLUME_SECRETS[source_name])))
            elif source_name == "configMap":
                found.add((CONFIGMAP, _name(source, "name")))
            elif source_name == "projected":
                for projection in _list(_dict(source).get("sources")):
                    for kind, key in ((SECRET, "secret"), (CONFIGMAP, "configMap")):
                        if key in projection:
                            found.add((kind, _name(projection[key], "name")))
            elif source_name == "persistentVolumeClaim":
                found.add((PVC, _name(source, "claimName")))
            elif source_name == "ephemeral" and pod_name and _name(volume, "name"):
                # ephemeral.VolumeClaimName: the claim the ephemeral-volume controller creates.
                found.add((PVC, f"{pod_name}-{volume['name']}"))
    found.add((SERVICE_ACCOUNT, _name(spec, "serviceAccountName")))
    return frozenset((kind, namespace, name) for kind, name in found if name)


def _container_references(container: Object, found: set[tuple[str, str]]) -> None:
    for source in _list(container.get("envFrom")):
        if "secretRef" in source:
            found.add((SECRET, _name(source["secretRef"], "name")))
        if "configMapRef" in source:
            found.add((CONFIGMAP, _name(source["configMapRef"], "name")))
    for env in _list(container.get("env")):
        value_from = env.get("valueFrom")
        if isinstance(value_from, dict):
            if "secretKeyRef" in value_from:
                found.add((SECRET, _name(value_from["secretKeyRef"], "name")))
            if "configMapKeyRef" in value_from:
                found.add((CONFIGMAP, _name(value_from["configMapKeyRef"], "name")))


def pv_secrets(pv: Object) -> frozenset[tuple[str, str]]:
    """The (namespace, name) of every Secret a PersistentVolume references."""
    spec = _dict(pv.get("spec"))
    claim_namespace = _name(spec, "claimRef", "namespace")
    found: set[tuple[str, str]] = set()
    azure = _dict(spec.get("azureFile"))
    if _name(azure, "secretName"):
        found.add((_name(azure, "secretNamespace") or claim_namespace or "default", azure["secretName"]))
    for source, fields in _PV_SECRET_REFS.items():
        for field in fields:
            ref = _dict(_dict(spec.get(source)).get(field))
            if _name(ref, "name"):
                found.add((_name(ref, "namespace") or claim_namespace, ref["name"]))
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class BoundPod:
    node: str
    uid: str
    refs: frozenset[Ref]


@dataclasses.dataclass(frozen=True)
class Volume:
    claim: tuple[str, str] | None  # claimRef (namespace, name)
    secrets: frozenset[tuple[str, str]]


class Graph:
    """Pods bound to nodes, what they reference, and PersistentVolumes; answers path questions."""

    __slots__ = ("_pods", "_pv_by_secret", "_pvs", "_readers")

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], BoundPod] = {}
        # object -> node -> how many pods bound to that node reference the object
        self._readers: dict[Ref, dict[str, int]] = {}
        self._pvs: dict[str, Volume] = {}
        self._pv_by_secret: dict[tuple[str, str], set[str]] = {}

    # ---------------------------------------------------------------- updates

    def put_pod(self, pod: Object) -> None:
        """AddPod for a bound pod; a pod without spec.nodeName is not in the graph."""
        meta = _dict(pod.get("metadata"))
        key = (_name(meta, "namespace"), _name(meta, "name"))
        node = _name(pod.get("spec"), "nodeName")
        if not node:
            self.remove_pod(*key)
            return
        bound = BoundPod(node, _name(meta, "uid"), pod_references(pod))
        old = self._pods.get(key)
        if old == bound:
            return
        if old is not None:
            self._count(old, -1)
        self._pods[key] = bound
        self._count(bound, +1)

    def remove_pod(self, namespace: str, name: str) -> None:
        old = self._pods.pop((namespace, name), None)
        if old is not None:
            self._count(old, -1)

    def _count(self, pod: BoundPod, delta: int) -> None:
        for ref in pod.refs:
            readers = self._readers.setdefault(ref, {})
            left = readers.get(pod.node, 0) + delta
            if left > 0:
                readers[pod.node] = left
            else:
                readers.pop(pod.node, None)
                if not readers:
                    del self._readers[ref]

    def put_pv(self, pv: Object) -> None:
        name = _name(pv.get("metadata"), "name")
        self.remove_pv(name)
        claim_ref = _dict(_dict(pv.get("spec")).get("claimRef"))
        claim = (_name(claim_ref, "namespace"), _name(claim_ref, "name"))
        volume = Volume(claim if claim[1] else None, pv_secrets(pv))
        self._pvs[name] = volume
        for secret in volume.secrets:
            self._pv_by_secret.setdefault(secret, set()).add(name)

    def remove_pv(self, name: str) -> None:
        old = self._pvs.pop(name, None)
        if old is None:
            return
        for secret in old.secrets:
            names = self._pv_by_secret.get(secret)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._pv_by_secret[secret]

    # ---------------------------------------------------------------- reads

    def bound_pod(self, namespace: str, name: str) -> BoundPod | None:
        return self._pods.get((namespace, name))

    def has_path(self, node: str, kind: str, namespace: str, name: str) -> bool:
        """Whether a path leads from the object to the node (hasPathFrom)."""
        if kind == POD:
            pod = self._pods.get((namespace, name))
            return pod is not None and pod.node == node
        if kind == PV:
            volume = self._pvs.get(name)
            claim = volume.claim if volume is not None else None
            return claim is not None and self._reads(node, (PVC, *claim))
        if self._reads(node, (kind, namespace, name)):
            return True
        if kind == SECRET:
            volumes = self._pv_by_secret.get((namespace, name), ())
            return any(self.has_path(node, PV, "", pv) for pv in volumes)
        return False

    def _reads(self, node: str, ref: Ref) -> bool:
        return node in self._readers.get(ref, ())

    @property
    def empty(self) -> bool:
        return not (self._pods or self._pvs)

    def statistics(self) -> dict[str, int]:
        return {"pods": len(self._pods), "objects": len(self._readers), "persistentvolumes": len(self._pvs)}


# What a cluster without bound pods or PersistentVolumes reads: one graph shared by all of them,
# never written (a cluster gets its own on its first such write).
EMPTY = Graph()


# --------------------------------------------------------------------------- keeping it current


@dataclasses.dataclass(frozen=True)
class _Write:
    plural: str
    event: str
    obj: Object


class Populator:
    """Keeps a cluster's `Graph` equal to what its store holds (graph_populator.go)."""

    WATCHED = ("pods", "persistentvolumes")
    _RETRY_SECONDS = 1.0

    def __init__(self, store: Any) -> None:
        self.store = store
        self.graph = EMPTY
        self._pending: list[_Write] | None = None  # writes seen while a rebuild lists the store
        self._rebuild: asyncio.Task[None] | None = None
        self._closed = False
        store.after_write.append(self._after_write)

    async def start(self) -> None:
        await self._rebuild_once()

    async def close(self) -> None:
        self._closed = True
        if self._rebuild is not None:
            self._rebuild.cancel()
            await asyncio.gather(self._rebuild, return_exceptions=True)

    def _after_write(self, kind: Any, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group != "" or kind.plural not in self.WATCHED:
            return
        obj = old if event == "DELETED" else new
        if obj is None:
            return
        write = _Write(kind.plural, event, obj)
        if self._pending is not None:
            self._pending.append(write)
        if self.graph is EMPTY:
            if event == "DELETED" or (kind.plural == "pods" and not _name(obj.get("spec"), "nodeName")):
                return  # nothing to remove, or a pod that grants nothing
            self.graph = Graph()
        self._apply_or_rebuild(self.graph, write)

    def _apply_or_rebuild(self, graph: Graph, write: _Write) -> None:
        try:
            _apply(graph, write)
        except Exception:
            log.exception("node authorizer graph: applying a %s write failed; rebuilding from the store",
                          write.plural)
            _forget(graph, write)
            self.schedule_rebuild()

    def schedule_rebuild(self) -> None:
        if self._closed or (self._rebuild is not None and not self._rebuild.done()):
            return
        # A fresh context: the rebuild is the server's own work, not the request's that triggered it.
        self._rebuild = asyncio.get_running_loop().create_task(self._rebuild_loop(),
                                                               context=contextvars.Context())

    async def _rebuild_loop(self) -> None:
        while not self._closed:
            try:
                await self._rebuild_once()
                return
            except Exception:
                log.exception("node authorizer graph: rebuilding failed; retrying")
                await asyncio.sleep(self._RETRY_SECONDS)

    async def _rebuild_once(self) -> None:
        """List the store into a fresh graph, then replay the writes that committed meanwhile.

        Replaying every write seen since the list began, in commit order, ends each object at
        its latest state whether or not the list already saw it; nothing awaits in between, so
        no decision sees the graph half-replayed.
        """
        self._pending = []
        try:
            graph = Graph()
            for plural, field_selector in (("pods", "spec.nodeName!="), ("persistentvolumes", "")):
                kind = self.store.registry.lookup("", "v1", plural)
                if kind is None:
                    continue  # this server does not serve PersistentVolumes (yet)
                listed = await self.store.list(kind, "", store_mod.ListOptions(field_selector=field_selector))
                for obj in listed["items"]:
                    self._apply_or_skip(graph, _Write(plural, "ADDED", obj))
            for write in self._pending:
                self._apply_or_skip(graph, write)
        finally:
            self._pending = None
        self.graph = EMPTY if graph.empty else graph

    @staticmethod
    def _apply_or_skip(graph: Graph, write: _Write) -> None:
        try:
            _apply(graph, write)
        except Exception:
            log.exception("node authorizer graph: cannot load %s %s; it grants no node access",
                          write.plural, _key(write.obj))
            _forget(graph, write)


def _apply(graph: Graph, write: _Write) -> None:
    if write.plural == "pods":
        if write.event == "DELETED":
            graph.remove_pod(*_key(write.obj))
        else:
            graph.put_pod(write.obj)
    elif write.event == "DELETED":
        graph.remove_pv(_key(write.obj)[1])
    else:
        graph.put_pv(write.obj)


def _forget(graph: Graph, write: _Write) -> None:
    """Fail closed: whatever the object granted is gone until the graph is rebuilt."""
    namespace, name = _key(write.obj)
    if write.plural == "pods":
        graph.remove_pod(namespace, name)
    else:
        graph.remove_pv(name)


def _key(obj: Object) -> tuple[str, str]:
    meta = _dict(obj.get("metadata"))
    return _name(meta, "namespace"), _name(meta, "name")
