"""The Node authorizer: what a kubelet's identity may do, decided before RBAC.

A request is a node's when its user is `system:node:<name>` in the group `system:nodes`
(nodeidentifier.NewDefaultNodeIdentifier). For such a request this authorizer answers as
upstream's (plugin/pkg/auth/authorizer/node/node_authorizer.go, with AuthorizeNodeWithSelectors,
GA since 1.34):

- Secrets and ConfigMaps: get/list/watch of one named object a pod bound to the node
  references; PVCs and PVs: get (and PVC status updates) likewise; ServiceAccounts: only
  `create serviceaccounts/token` for the account of a pod bound to the node.
- Nodes: create/update/patch (NodeRestriction limits it to its own), get/list/watch of its
  own Node only; Pods: get its own, list/watch with `fieldSelector=spec.nodeName=<node>`,
  create/delete (mirror pods), status and eviction (NodeRestriction limits them).
- Leases: get/create/update/patch/delete of its own in `kube-node-lease`.
- Everything else: the static rules of the `system:node` ClusterRole (`NODE_RULES`).

A request it does not allow has no opinion, with upstream's reason, and goes on to RBAC;
`policy.ClusterPolicy` joins the reasons as the union authorizer does. Requests from
anyone else are not looked at. Nothing here reads storage: paths come from `nodegraph.Graph`.
"""

from __future__ import annotations

from socialweb_computer.apiserver import selectors
from socialweb_computer.auth import identity, nodegraph, rbac
from socialweb_computer.auth.attributes import Attributes, go_quote

NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
NODE_LEASE_NAMESPACE = "kube-node-lease"
RULES_UNSUPPORTED = "node authorizer does not support user rule resolution"
_LEASE_NAMESPACE = go_quote(NODE_LEASE_NAMESPACE)

Decision = rbac.Decision


def node_name(user: identity.UserInfo) -> str | None:
    """The node a user is (None: not a node; "": a node whose name cannot be told)."""
    if not user.name.startswith(NODE_USER_PREFIX) or NODES_GROUP not in user.groups:
        return None
    return user.name[len(NODE_USER_PREFIX):]


def _rule(verbs: str, groups: str, resources: str) -> rbac.Rule:
    return rbac.Rule.from_dict(
        {"verbs": verbs.split(), "apiGroups": [g if g != "core" else "" for g in groups.split()],
         "resources": resources.split()}
    )


# The `system:node` ClusterRole's rules (bootstrappolicy.NodeRules), the static part of the
# Node authorizer. Secrets, configmaps, PVCs, PVs, service accounts, nodes, pods and leases
# are decided by the graph and the name checks below before these rules are read.
NODE_RULES: tuple[rbac.Rule, ...] = (
    _rule("create", "authentication.k8s.io", "tokenreviews"),
    _rule("create", "authorization.k8s.io", "subjectaccessreviews localsubjectaccessreviews"),
    _rule("get list watch", "core", "services"),
    _rule("create get list watch", "core", "nodes"),
    _rule("update patch", "core", "nodes/status"),
    _rule("update patch", "core", "nodes"),
    _rule("create update patch", "core", "events"),
    _rule("get list watch", "core", "pods"),
    _rule("create delete", "core", "pods"),
    _rule("update patch", "core", "pods/status"),
    _rule("create", "core", "pods/eviction"),
    _rule("get list watch", "core", "secrets configmaps"),
    _rule("get", "core", "persistentvolumeclaims persistentvolumes"),
    _rule("get", "core", "endpoints"),
    _rule("create get list watch", "certificates.k8s.io", "certificatesigningrequests"),
    _rule("get create update patch delete", "coordination.k8s.io", "leases"),
    _rule("get", "storage.k8s.io", "volumeattachments"),
    _rule("create", "core", "serviceaccounts/token"),
    _rule("get update patch", "core", "persistentvolumeclaims/status"),
    _rule("get watch list", "storage.k8s.io", "csidrivers"),
    _rule("get create update patch delete", "storage.k8s.io", "csinodes"),
    _rule("get list watch", "node.k8s.io", "runtimeclasses"),
    _rule("get", "resource.k8s.io", "resourceclaims"),
)


class NodeAuthorizer:
    def __init__(self, graph: nodegraph.Populator) -> None:
        self._populator = graph

    @property
    def graph(self) -> nodegraph.Graph:
        return self._populator.graph

    def authorize(self, attrs: Attributes) -> Decision | None:
        """Allow, or no opinion with a reason; None when the user is not a node."""
        node = node_name(attrs.user)
        if node is None:
            return None
        if not node:
            return Decision(False, f"unknown node for user {go_quote(attrs.user.name)}")
        if attrs.resource_request:
            decide = _SUBDIVIDED.get((attrs.api_group, attrs.resource))
            if decide is not None:
                return decide(self, node, attrs)
        return Decision(any(rule.allows(attrs) for rule in NODE_RULES))

    # ---------------------------------------------------------------- per resource

    def _read_namespaced(self, kind: str, node: str, attrs: Attributes) -> Decision:
        """authorizeReadNamespacedObject (secrets, configmaps)."""
        if attrs.verb not in ("get", "list", "watch"):
            return Decision(False, "can only read resources of this type")
        if attrs.subresource:
            return Decision(False, "cannot read subresource")
        if not attrs.namespace:
            return Decision(False, "can only read namespaced object of this type")
        return self._related(kind, node, attrs)

    def _get(self, kind: str, node: str, attrs: Attributes) -> Decision:
        """authorizeGet."""
        if attrs.verb != "get":
            return Decision(False, "can only get individual resources of this type")
        if attrs.subresource:
            return Decision(False, "cannot get subresource")
        return self._related(kind, node, attrs)

    def _related(self, kind: str, node: str, attrs: Attributes) -> Decision:
        if not attrs.name:
            return Decision(False, "No Object name found")
        if self.graph.has_path(node, kind, attrs.namespace, attrs.name):
            return Decision(True)
        return Decision(False, f"no relationship found between node '{node}' and this object")

    def _pvc(self, node: str, attrs: Attributes) -> Decision:
        if attrs.subresource == "status":
            if attrs.verb not in ("update", "patch"):
                return Decision(False, "can only get/update/patch this type")
            return self._related(nodegraph.PVC, node, attrs)
        return self._get(nodegraph.PVC, node, attrs)

    def _service_account(self, node: str, attrs: Attributes) -> Decision:
        """authorizeCreateToken."""
        if attrs.verb != "create" or not attrs.name:
            return Decision(False, "can only create tokens for individual service accounts")
        if attrs.subresource != "token":
            return Decision(False, "can only create token subresource of serviceaccount")
        if self.graph.has_path(node, nodegraph.SERVICE_ACCOUNT, attrs.namespace, attrs.name):
            return Decision(True)
        return Decision(False, f"no relationship found between node '{node}' and this object")

    @staticmethod
    def _lease(node: str, attrs: Attributes) -> Decision:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return Decision(False, "can only get, create, update, patch, or delete a node lease")
        if attrs.namespace != NODE_LEASE_NAMESPACE:
            return Decision(False, f"can only access leases in the {_LEASE_NAMESPACE} system namespace")
        # The name of a lease being created is in the body: NodeRestriction checks it.
        if attrs.verb != "create" and attrs.name != node:
            return Decision(False, "can only access node lease with the same name as the requesting node")
        return Decision(True)

    @staticmethod
    def _csinode(node: str, attrs: Attributes) -> Decision:
        if attrs.verb not in ("get", "create", "update", "patch", "delete"):
            return Decision(False, "can only get, create, update, patch, or delete a CSINode")
        if attrs.subresource:
            return Decision(False, "cannot authorize CSINode subresources")
        if attrs.verb != "create" and attrs.name != node:
            return Decision(False, "can only access CSINode with the same name as the requesting node")
        return Decision(True)

    @staticmethod
    def _node(node: str, attrs: Attributes) -> Decision:
        """authorizeNode: a kubelet reads only its own Node; NodeRestriction guards its writes."""
        if not attrs.subresource:
            if attrs.verb in ("create", "update", "patch"):
                return Decision(True)
            if attrs.verb in ("get", "list", "watch"):
                if attrs.name == node:
                    return Decision(True)
                if not attrs.name:
                    return Decision(False, f"node '{node}' cannot read all nodes, only its own Node object")
                return Decision(False, f"node '{node}' cannot read '{attrs.name}', only its own Node object")
        elif attrs.subresource == "status" and attrs.verb in ("update", "patch"):
            return Decision(True)
        return Decision(False)

    def _pod(self, node: str, attrs: Attributes) -> Decision:
        """authorizePod."""
        verb = attrs.verb
        if not attrs.subresource:
            if verb == "get":
                return self._get(nodegraph.POD, node, attrs)
            if verb in ("list", "watch"):
                if _selects_node(attrs.field_selector, node):
                    return Decision(True)
                if attrs.name:
                    return self._related(nodegraph.POD, node, attrs)
                return Decision(False, "can only list/watch pods with spec.nodeName field selector")
            if verb in ("create", "delete"):
                return Decision(True)  # mirror pods; NodeRestriction limits them
        elif (attrs.subresource, verb) in _POD_WRITES:
            return Decision(True)  # NodeRestriction limits them to pods bound to the node
        return Decision(False)


_POD_WRITES = {("status", "update"), ("status", "patch"), ("eviction", "create")}


def _selects_node(field_selector: str, node: str) -> bool:
    """hasNodeNameSelector: a `spec.nodeName=<node>` term (`=` or `==`) in the field selector."""
    if not field_selector:
        return False
    try:
        parsed = selectors.parse_field_selector_or_error(field_selector)
    except selectors.SelectorError:
        return False
    return any(t.field == "spec.nodeName" and t.operator in ("=", "==") and t.value == node
               for t in parsed.terms)


_SUBDIVIDED = {
    ("", "secrets"): lambda a, node, attrs: a._read_namespaced(nodegraph.SECRET, node, attrs),
    ("", "configmaps"): lambda a, node, attrs: a._read_namespaced(nodegraph.CONFIGMAP, node, attrs),
    ("", "persistentvolumeclaims"): lambda a, node, attrs: a._pvc(node, attrs),
    ("", "persistentvolumes"): lambda a, node, attrs: a._get(nodegraph.PV, node, attrs),
    # Not served here; upstream's graph relates them to nodes, this one never does.
    ("storage.k8s.io", "volumeattachments"): lambda a, node, attrs: a._get("volumeattachment", node, attrs),
    ("resource.k8s.io", "resourceclaims"): lambda a, node, attrs: a._get("resourceclaim", node, attrs),
    ("", "serviceaccounts"): lambda a, node, attrs: a._service_account(node, attrs),
    ("coordination.k8s.io", "leases"): lambda a, node, attrs: a._lease(node, attrs),
    ("storage.k8s.io", "csinodes"): lambda a, node, attrs: a._csinode(node, attrs),
    ("", "nodes"): lambda a, node, attrs: a._node(node, attrs),
    ("", "pods"): lambda a, node, attrs: a._pod(node, attrs),
}
