"""The NodeRestriction admission plugin: the writes a kubelet may make, checked against the object.

The Node authorizer lets every node write nodes, pods, pod status, evictions and leases,
because it cannot see the object; this plugin (plugin/pkg/admission/noderestriction) then
holds each node to its own: its own Node (no taints, ownerReferences, configSource or
restricted labels changed: `node-restriction.kubernetes.io/` and every `kubernetes.io`/`k8s.io`
label a kubelet does not set itself, such as `node-role.kubernetes.io/*`), its own Lease in
`kube-node-lease`, status and eviction of the pods bound to it, mirror pods only, PVC status
only, and TokenRequests bound to its own pods. Refusals are upstream's 403s, word for word:

    nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"
    pods "p" is forbidden: node "n1" can only update pod status for pods with spec.nodeName set to itself

Checks that need the final object run from the store's before-write hook
(`admit_write`, through `policy.ClusterPolicy`); deletes and evictions, which have no such
hook, run before the handler (`admit_request`, from the authorization middleware), reading the
pod as upstream reads its informer cache (a missing pod is `404 pod "x" not found`).
TokenRequests are checked by `admit_token_request`, for the TokenRequest handler to call.
Requests from users that are not nodes pass untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.auth import nodeauthorizer, nodegraph, rbac
from socialweb_computer.auth.attributes import Attributes, go_quote

Object = dict[str, Any]

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
RESTRICTED_LABEL_NAMESPACE = "node-restriction.kubernetes.io"
# The labels a kubelet sets on its own Node (k8s.io/kubelet/pkg/apis/well_known_labels.go).
KUBELET_LABELS = frozenset((
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
))
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")

TOKEN_AUDIENCE_VERB = "request-serviceaccounts-token-audience"
_UNHOOKED_POD_SUBRESOURCES = ("binding", "ephemeralcontainers", "resize")

Authorize = Callable[[Attributes], Any]  # policy.ClusterPolicy.authorize


def _dict(value: Any) -> Object:
    return value if isinstance(value, dict) else {}


Refuse = Callable[[str], errors.StatusError]


def _refuser(attrs: Attributes, name: str) -> Refuse:
    """admission.NewForbidden for this request: `<resource> "<name>" is forbidden: <why>`."""
    resource = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource

    def refuse(why: str) -> errors.StatusError:
        return errors.forbidden(f"{resource} {go_quote(name)} is forbidden: {why}", attrs.resource, name,
                                attrs.api_group)

    return refuse


def _object_name(attrs: Attributes, obj: Object | None) -> str:
    """extractResourceName: the request's name, else the object's (or its generateName)."""
    if attrs.name:
        return attrs.name
    meta = _dict((obj or {}).get("metadata"))
    return str(meta.get("name") or meta.get("generateName") or "Unknown")


def _label_namespace(key: str) -> str:
    prefix, slash, _ = key.partition("/")
    return prefix if slash else ""


def _in_namespace(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def is_kubelet_label(key: str) -> bool:
    namespace = _label_namespace(key)
    return key in KUBELET_LABELS or any(_in_namespace(namespace, ns) for ns in KUBELET_LABEL_NAMESPACES)


def forbidden_labels(labels: Any, old_labels: Any) -> list[str]:
    """getForbiddenLabels of the labels added, removed or changed, sorted."""
    new, old = _dict(labels), _dict(old_labels)
    modified = {k for k in new.keys() | old.keys() if new.get(k) != old.get(k) or (k in new) != (k in old)}
    refused = set()
    for key in modified:
        namespace = _label_namespace(key)
        if _in_namespace(namespace, RESTRICTED_LABEL_NAMESPACE):
            refused.add(key)
        kubernetes = _in_namespace(namespace, "kubernetes.io") or _in_namespace(namespace, "k8s.io")
        if kubernetes and not is_kubelet_label(key):
            refused.add(key)
    return sorted(refused)


def _same(a: Any, b: Any) -> bool:
    """apiequality.Semantic.DeepEqual for JSON values: a missing or null list/map equals an empty one."""
    return (a or None) == (b or None)


class NodeRestriction:
    def __init__(self, store: Any, authorize: Authorize) -> None:
        self.store = store
        self.authorize = authorize
        # The UID of every Node, which a mirror pod's owner reference must name (nodesGetter).
        self.node_uids: dict[str, str] = {}
        store.after_write.append(self._after_write)

    async def start(self) -> None:
        kind = self.store.registry.lookup("", "v1", "nodes")
        listed = await self.store.list(kind, "", store_mod.ListOptions())
        for node in listed["items"]:
            self._remember(node)

    def _after_write(self, kind: Any, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group != "" or kind.plural != "nodes":
            return
        if event == "DELETED":
            self.node_uids.pop(str(_dict(_dict(old).get("metadata")).get("name", "")), None)
        elif new is not None:
            self._remember(new)

    def _remember(self, node: Object) -> None:
        meta = _dict(node.get("metadata"))
        self.node_uids[str(meta.get("name", ""))] = str(meta.get("uid", ""))

    # ---------------------------------------------------------------- entry points

    def admit_write(self, attrs: Attributes, kind: Any, new: Object, old: Object | None) -> None:
        """A create or update the request `attrs` makes, with its final object (before-write hook)."""
        node = nodeauthorizer.node_name(attrs.user)
        if node is None or kind.plural != attrs.resource or kind.group != attrs.api_group:
            return  # not a node, or a write the request causes on another kind (a PDB's status)
        if attrs.name and _dict(new.get("metadata")).get("name") != attrs.name:
            return
        refuse = _refuser(attrs, _object_name(attrs, new))
        if not node:
            raise refuse(f"could not determine node from user {go_quote(attrs.user.name)}")
        group_resource = (kind.group, kind.plural)
        if group_resource == ("", "pods"):
            self._admit_pod(node, attrs, refuse, new, old)
        elif group_resource == ("", "nodes"):
            _admit_node(node, _object_name(attrs, new), refuse, new, old)
        elif group_resource == ("", "persistentvolumeclaims"):
            _admit_pvc_status(node, attrs, refuse, new, old)
        elif group_resource == ("coordination.k8s.io", "leases"):
            name = _dict(new.get("metadata")).get("name") if old is None else attrs.name
            _admit_lease(node, attrs, refuse, str(name or ""))

    async def admit_request(self, attrs: Attributes) -> None:
        """Deletes, evictions and other unhooked pod writes: checked before the handler, against the
        object as it is now."""
        node = nodeauthorizer.node_name(attrs.user)
        if node is None or not attrs.resource_request:
            return
        group_resource = (attrs.api_group, attrs.resource)
        pods = group_resource == ("", "pods")
        evicting = pods and attrs.subresource == "eviction" and attrs.verb == "create"
        # Pod writes through subresources that have no before-write hook of their own.
        other_pod_write = (pods and attrs.subresource in _UNHOOKED_POD_SUBRESOURCES
                           and attrs.verb in ("create", "update", "patch"))
        if attrs.verb != "delete" and not evicting and not other_pod_write:
            return
        refuse = _refuser(attrs, _object_name(attrs, None))
        if not node:
            raise refuse(f"could not determine node from user {go_quote(attrs.user.name)}")
        quoted = go_quote(node)
        if pods:
            if attrs.subresource not in ("", "eviction"):
                raise refuse(f"unexpected pod subresource {go_quote(attrs.subresource)}, "
                             "only 'status' and 'eviction' are allowed")
            bound_to = _spec(await self._pod(attrs.namespace, attrs.name)).get("nodeName")
            if bound_to != node and evicting:
                raise refuse(f"node {node} can only evict pods with spec.nodeName set to itself")
            if bound_to != node:
                raise refuse(f"node {quoted} can only delete pods with spec.nodeName set to itself")
        elif group_resource == ("", "nodes"):
            if attrs.name != node:
                raise refuse(f"node {quoted} is not allowed to modify node {go_quote(attrs.name)}")
        elif group_resource == ("", "persistentvolumeclaims"):
            raise refuse("may only update PVC status")
        elif group_resource == ("coordination.k8s.io", "leases"):
            _admit_lease(node, attrs, refuse, attrs.name)

    async def admit_token_request(self, attrs: Attributes, token_request: Object) -> None:
        """admitServiceAccount, with ServiceAccountNodeAudienceRestriction (on by default since 1.33).

        For the TokenRequest handler (`create serviceaccounts/<name>/token`): call it with the
        request's attributes and the decoded TokenRequest before issuing anything. A node's
        token must be bound to a pod bound to that node, by name and UID, and ask for no
        audience, or one a projected serviceAccountToken volume of that pod names, or one the
        node is authorized for (`request-serviceaccounts-token-audience` on the audience).
        """
        node = nodeauthorizer.node_name(attrs.user)
        if node is None:
            return
        refuse = _refuser(attrs, attrs.name)
        if not node:
            raise refuse(f"could not determine node from user {go_quote(attrs.user.name)}")
        spec = _dict(token_request.get("spec"))
        ref = _dict(spec.get("boundObjectRef"))
        if ref.get("apiVersion") != "v1" or ref.get("kind") != "Pod" or not ref.get("name"):
            raise refuse("node requested token not bound to a pod")
        if not ref.get("uid"):
            raise refuse("node requested token with a pod binding without a uid")
        pod = await self._pod(attrs.namespace, str(ref["name"]))
        if ref["uid"] != _dict(pod.get("metadata")).get("uid"):
            raise refuse(f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
                         "record. The object might have been deleted and then recreated")
        if _spec(pod).get("nodeName") != node:
            raise refuse("node requested token bound to a pod scheduled on a different node")
        await self._admit_audience(attrs, refuse, spec, pod)

    # ---------------------------------------------------------------- pods

    def _admit_pod(self, node: str, attrs: Attributes, refuse: Refuse, pod: Object,
                   old: Object | None) -> None:
        if attrs.subresource == "status":
            _admit_pod_status(node, refuse, pod, old)
        elif attrs.subresource == "eviction":
            return  # checked before the handler
        elif attrs.subresource:
            raise refuse(f"unexpected pod subresource {go_quote(attrs.subresource)}, "
                         "only 'status' and 'eviction' are allowed")
        elif old is None:
            self._admit_mirror_pod(node, refuse, pod)
        else:
            raise refuse(f'unexpected operation "UPDATE", node {go_quote(node)} can only create and delete '
                         "mirror pods")

    def _admit_mirror_pod(self, node: str, refuse: Refuse, pod: Object) -> None:
        """admitPodCreate: a node creates only mirror pods of its own static pods, referencing nothing."""
        meta, spec = _dict(pod.get("metadata")), _spec(pod)
        quoted = go_quote(node)
        if MIRROR_POD_ANNOTATION not in _dict(meta.get("annotations")):
            raise refuse(f"pod does not have {go_quote(MIRROR_POD_ANNOTATION)} annotation, node {quoted} "
                         "can only create mirror pods")
        if spec.get("nodeName") != node:
            raise refuse(f"node {quoted} can only create pods with spec.nodeName set to itself")
        owners = [o for o in meta.get("ownerReferences") or () if isinstance(o, dict)]
        if len(owners) > 1:
            raise refuse(f"node {quoted} can only create pods with a single owner reference set to itself")
        owner = owners[0] if owners else {}
        if owner.get("apiVersion") != "v1" or owner.get("kind") != "Node" or owner.get("name") != node:
            raise refuse(f"node {quoted} can only create pods with an owner reference set to itself")
        if owner.get("controller") is not True:
            raise refuse(f"node {quoted} can only create pods with a controller owner reference set to "
                         "itself")
        if owner.get("blockOwnerDeletion") is True:
            raise refuse(f"node {quoted} must not set blockOwnerDeletion on an owner reference")
        uid = self.node_uids.get(node)
        if uid is None:
            raise errors.not_found("node", node)  # the lister's wording
        if owner.get("uid") != uid:
            raise refuse(f"node {node} UID mismatch: expected {owner.get('uid', '')} got {uid}")
        if spec.get("serviceAccountName"):
            raise refuse(f"node {quoted} can not create pods that reference a service account")
        kinds = {kind for kind, _, _ in nodegraph.pod_references(pod)}
        for kind, plural in ((nodegraph.SECRET, "secrets"), (nodegraph.CONFIGMAP, "configmaps")):
            if kind in kinds:
                raise refuse(f"node {quoted} can not create pods that reference {plural}")
        volumes = [_dict(v) for v in spec.get("volumes") or ()]
        for volume in volumes:
            sources = _dict(volume.get("projected")).get("sources") or ()
            if any("clusterTrustBundle" in _dict(source) for source in sources):
                raise refuse(f"node {quoted} can not create pods that reference clustertrustbundles")
        if any("persistentVolumeClaim" in volume for volume in volumes):
            raise refuse(f"node {quoted} can not create pods that reference persistentvolumeclaims")

    async def _pod(self, namespace: str, name: str) -> Object:
        kind = self.store.registry.lookup("", "v1", "pods")
        try:
            return await self.store.get(kind, namespace, name)
        except errors.StatusError as e:
            if e.code == 404:
                raise errors.not_found("pod", name) from None  # the lister's wording
            raise

    # ---------------------------------------------------------------- token audiences

    async def _admit_audience(self, attrs: Attributes, refuse: Refuse, spec: Object, pod: Object) -> None:
        audiences = spec.get("audiences") or []
        if len(audiences) > 1:
            raise refuse("node may only request 0 or 1 audiences")
        audience = str(audiences[0]) if audiences else ""
        found, problems = await self._pod_references_audience(pod, audience)
        if found:
            return
        if problems:
            raise refuse(f"error validating audience {go_quote(audience)}: {rbac.aggregate_errors(problems)}")
        check = Attributes(attrs.user, TOKEN_AUDIENCE_VERB, True, resource=audience,
                           namespace=attrs.namespace, name=attrs.name)
        if not self.authorize(check).allowed:
            raise refuse(f"audience {go_quote(audience)} not found in pod spec volume, {attrs.user.name} is "
                         "not authorized to request tokens for this audience")

    async def _pod_references_audience(self, pod: Object, audience: str) -> tuple[bool, list[str]]:
        """podReferencesAudience: a projected token volume names it, or a CSI driver requests it."""
        problems: list[str] = []
        meta = _dict(pod.get("metadata"))
        for volume in (_dict(v) for v in _spec(pod).get("volumes") or ()):
            for source in _dict(volume.get("projected")).get("sources") or ():
                token = _dict(_dict(source).get("serviceAccountToken"))
                if token and str(token.get("audience") or "") == audience:
                    return True, []
            claim = ""
            if "persistentVolumeClaim" in volume:
                claim = str(_dict(volume["persistentVolumeClaim"]).get("claimName", ""))
            elif "ephemeral" in volume:
                claim = f"{meta.get('name', '')}-{volume.get('name', '')}"
            if claim:
                problem = await self._claim_problem(str(meta.get("namespace", "")), claim)
                if problem:
                    problems.append(problem)
            elif "csi" in volume:
                # No CSIDriver kind is served, so no driver can ask for this audience.
                driver = str(_dict(volume["csi"]).get("driver", ""))
                problems.append(f"csidriver.storage.k8s.io {go_quote(driver)} not found")
        return False, problems

    async def _claim_problem(self, namespace: str, claim: str) -> str:
        kind = self.store.registry.lookup("", "v1", "persistentvolumeclaims")
        try:
            pvc = await self.store.get(kind, namespace, claim)
        except errors.StatusError as e:
            if e.code == 404:
                return f"persistentvolumeclaim {go_quote(claim)} not found"
            raise
        volume = str(_spec(pvc).get("volumeName", ""))
        # No PersistentVolume kind is served, so a bound claim's volume (and driver) cannot be found.
        return f"persistentvolume {go_quote(volume)} not found" if volume else ""


# --------------------------------------------------------------------------- checks on one object


def _admit_pod_status(node: str, refuse: Refuse, pod: Object, old: Object | None) -> None:
    quoted = go_quote(node)
    if old is None or _spec(old).get("nodeName") != node:
        raise refuse(f"node {quoted} can only update pod status for pods with spec.nodeName set to itself")
    if not _same(_dict(pod.get("metadata")).get("labels"), _dict(old.get("metadata")).get("labels")):
        raise refuse(f"node {quoted} cannot update labels through pod status")
    claims, old_claims = (_dict(p.get("status")).get("resourceClaimStatuses") for p in (pod, old))
    if not _same(claims, old_claims):
        raise refuse(f"node {quoted} cannot update resource claim statues")  # sic, upstream's typo


def _admit_node(node: str, name: str, refuse: Refuse, obj: Object, old: Object | None) -> None:
    quoted = go_quote(node)
    if name != node:
        raise refuse(f"node {quoted} is not allowed to modify node {go_quote(name)}")
    labels = _dict(obj.get("metadata")).get("labels")
    if old is None:
        if _spec(obj).get("configSource") is not None:
            raise refuse(f"node {quoted} is not allowed to create pods with a non-nil configSource")
        refused = forbidden_labels(labels, None)
        if refused:
            raise refuse(f"node {quoted} is not allowed to set the following labels: {', '.join(refused)}")
        return
    source = _spec(obj).get("configSource")
    if source is not None and source != _spec(old).get("configSource"):
        raise refuse(f"node {quoted} is not allowed to update configSource to a new non-nil configSource")
    if not _same(_spec(obj).get("taints"), _spec(old).get("taints")):
        raise refuse(f"node {quoted} is not allowed to modify taints")
    owners, old_owners = (_dict(o.get("metadata")).get("ownerReferences") for o in (obj, old))
    if not _same(owners, old_owners):
        raise refuse(f"node {quoted} is not allowed to modify ownerReferences")
    refused = forbidden_labels(labels, _dict(old.get("metadata")).get("labels"))
    if refused:
        raise refuse(f"is not allowed to modify labels: {', '.join(refused)}")


def _admit_lease(node: str, attrs: Attributes, refuse: Refuse, lease_name: str) -> None:
    if attrs.namespace != nodeauthorizer.NODE_LEASE_NAMESPACE:
        raise refuse(f"can only access leases in the {go_quote(nodeauthorizer.NODE_LEASE_NAMESPACE)} "
                     "system namespace")
    if lease_name != node:
        raise refuse("can only access node lease with the same name as the requesting node")


def _admit_pvc_status(node: str, attrs: Attributes, refuse: Refuse, pvc: Object, old: Object | None) -> None:
    if attrs.subresource != "status":
        raise refuse("may only update PVC status")
    changed = _pvc_changes(old, pvc) if old is not None else ""
    if changed:
        raise refuse(f"node {go_quote(node)} is not allowed to update fields other than status.capacity "
                     f"and status.conditions: {changed}")


def _spec(obj: Object) -> Object:
    return _dict(obj.get("spec"))


# What a node may change in a PVC's status (admitPVCStatus, with RecoverVolumeExpansionFailure).
_PVC_STATUS_FIELDS = ("capacity", "conditions", "allocatedResourceStatuses", "allocatedResources")


def _pvc_changes(old: Object, new: Object) -> str:
    """The fields outside the allowed status ones that differ (upstream prints a go-cmp diff)."""

    def comparable(pvc: Object) -> Object:
        copied = copy.deepcopy(pvc)
        meta = _dict(copied.get("metadata"))
        for field in ("resourceVersion", "managedFields"):
            meta.pop(field, None)
        for field in _PVC_STATUS_FIELDS:
            _dict(copied.get("status")).pop(field, None)
        return copied

    before, after = comparable(old), comparable(new)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for top in ("metadata", "spec", "status"):
        if top in changed:
            inner_before, inner_after = _dict(before.get(top)), _dict(after.get(top))
            changed.remove(top)
            changed.extend(f"{top}.{k}" for k in sorted(inner_before.keys() | inner_after.keys())
                           if inner_before.get(k) != inner_after.get(k))
    return gofmt.quote(", ".join(changed)) if changed else ""
