"""A kubelet's credential against a running tenant: the Node authorizer and NodeRestriction.

A real gateway serves cluster `ci`; node credentials (`system:node:<name>` in `system:nodes`)
are minted from its ClientCA with `clusterprovider.mint_node_credential_for_cluster` (and
once with `credential mint --node`). Pods are bound to nodes n1 and n2 by giving them
`spec.nodeName`, as the scheduler's binding would; no kubelet runs (the node agent is another
issue), so these credentials act as one would. Driven with the pinned kubectl and the
official Python client; refusals are compared with upstream's wording byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, watch

from socialweb_computer import clusterprovider, testing
from socialweb_computer.auth import kubeconfig
from socialweb_computer.testing import gateway as gateway_mod

NS = "work"
FORBIDDEN = "Error from server (Forbidden): "


@dataclass
class Node:
    name: str
    kubeconfig: Path
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


@dataclass
class Tenant:
    gateway: gateway_mod.GatewayProcess
    url: str
    admin: Path
    nodes: dict[str, Node]
    tmp: Path

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.gateway.kubectl_with(self.admin, *args, input=input)

    def as_node(self, node: str, *args: str, input: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.gateway.kubectl_with(self.nodes[node].kubeconfig, *args, input=input, check=check)

    def refused(self, node: str, *args: str, input: str | None = None) -> str:
        """kubectl's error line for a request the node may not make."""
        result = self.as_node(node, *args, input=input, check=False)
        assert result.returncode != 0, result.stdout
        return result.stderr.strip()

    def apply(self, manifest: str) -> None:
        self.kubectl("apply", "-f", "-", input=manifest)


def _node(gateway: gateway_mod.GatewayProcess, url: str, tmp: Path, name: str) -> Node:
    credential = clusterprovider.mint_node_credential_for_cluster(
        state_dir=str(gateway.state_dir), cluster="ci", server=url, node=name, out_dir=str(tmp / name))
    path = tmp / f"{name}.kubeconfig"
    kubeconfig.write(str(path), cluster="ci", server=url, ca_pem=Path(credential.ca_crt).read_bytes(),
                     user=credential.common_name, cert_pem=Path(credential.tls_crt).read_bytes(),
                     key_pem=Path(credential.tls_key).read_bytes())
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=configuration)
    return Node(name, path, client.ApiClient(configuration))


PODS = f"""\
apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
# ServiceAccount admission: a pod's account must exist before the pod.
apiVersion: v1
kind: ServiceAccount
metadata: {{name: builder, namespace: {NS}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: on-n1, namespace: {NS}}}
spec:
  nodeName: n1
  imagePullSecrets: [{{name: pull-secret}}]
  serviceAccountName: builder
  containers:
  - name: app
    image: registry.invalid/app
    env:
    - {{name: A, valueFrom: {{secretKeyRef: {{name: env-secret, key: k}}}}}}
    - {{name: B, valueFrom: {{configMapKeyRef: {{name: env-cm, key: k}}}}}}
    envFrom:
    - secretRef: {{name: envfrom-secret}}
    - configMapRef: {{name: envfrom-cm}}
  volumes:
  - {{name: s, secret: {{secretName: vol-secret}}}}
  - {{name: c, configMap: {{name: vol-cm}}}}
  - name: p
    projected:
      sources:
      - secret: {{name: projected-secret}}
      - configMap: {{name: projected-cm}}
      - serviceAccountToken: {{path: token}}
---
apiVersion: v1
kind: Pod
metadata: {{name: on-n2, namespace: {NS}}}
spec:
  nodeName: n2
  containers:
  - name: app
    image: registry.invalid/app
    envFrom: [{{secretRef: {{name: n2-secret}}}}, {{configMapRef: {{name: n2-cm}}}}]
"""
N1_SECRETS = ("vol-secret", "env-secret", "envfrom-secret", "projected-secret", "pull-secret")
N1_CONFIGMAPS = ("vol-cm", "env-cm", "envfrom-cm", "projected-cm")


@pytest.fixture(scope="module")
def tenant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenant]:
    tmp = tmp_path_factory.mktemp("nodeauth")
    gateway = gateway_mod.GatewayProcess.start(tmp / "state", {"clusters": [{"name": "ci"}]})
    nodes: dict[str, Node] = {}
    try:
        url = gateway.wait_phase("ci", "Ready")["status"]["url"]
        nodes = {name: _node(gateway, url, tmp, name) for name in ("n1", "n2")}
        tenant = Tenant(gateway, url, gateway.tenant_kubeconfig("ci"), nodes, tmp)
        secrets = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                    "stringData": {"k": "v"}}
                   for name in (*N1_SECRETS, "n2-secret", "lonely-secret", "mover-secret")]
        configmaps = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
                       "data": {"k": "v"}} for name in (*N1_CONFIGMAPS, "n2-cm", "lonely-cm")]
        tenant.apply(PODS + "---\n" + yaml.safe_dump_all([*secrets, *configmaps]))
        yield tenant
    finally:
        for node in nodes.values():
            node.api.close()
        gateway.stop()


def _status(error: client.ApiException) -> dict[str, Any]:
    return json.loads(error.body)


def _forbidden(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(client.ApiException) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 403, caught.value.body
    return _status(caught.value)


def _no_relationship(node: str, resource: str, name: str, namespace: str = NS) -> str:
    return (f'{resource} "{name}" is forbidden: User "system:node:{node}" cannot get resource '
            f'"{resource}" in API group "" in the namespace "{namespace}": no relationship found between '
            f"node '{node}' and this object")


def _node_object(name: str, **metadata: Any) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, **metadata}})


# ------------------------------------------------------------------------------ reading


def test_a_node_reads_what_the_pods_bound_to_it_reference(tenant: Tenant) -> None:
    for name in N1_SECRETS:
        got = tenant.as_node("n1", "get", "secret", name, "-n", NS, "-o", "name").stdout
        assert got == f"secret/{name}\n"
    for name in N1_CONFIGMAPS:
        assert tenant.nodes["n1"].core.read_namespaced_config_map(name, NS).data == {"k": "v"}
    assert tenant.nodes["n1"].core.read_namespaced_pod("on-n1", NS).spec.node_name == "n1"
    # A kubelet watches each one it needs through a metadata.name field selector.
    listed = tenant.nodes["n1"].core.list_namespaced_secret(NS, field_selector="metadata.name=vol-secret")
    assert [s.metadata.name for s in listed.items] == ["vol-secret"]


def test_a_node_is_refused_what_its_pods_do_not_reference(tenant: Tenant) -> None:
    for name in ("n2-secret", "lonely-secret"):
        assert tenant.refused("n1", "get", "secret", name, "-n", NS) == FORBIDDEN + _no_relationship(
            "n1", "secrets", name)
    status = _forbidden(tenant.nodes["n1"].core.read_namespaced_config_map, "n2-cm", NS)
    assert status == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": _no_relationship("n1", "configmaps", "n2-cm"),
        "reason": "Forbidden", "details": {"name": "n2-cm", "kind": "configmaps"}, "code": 403}
    assert tenant.refused("n1", "get", "pod", "on-n2", "-n", NS) == FORBIDDEN + _no_relationship(
        "n1", "pods", "on-n2")
    # Listing every secret is no more allowed than reading an unrelated one.
    assert tenant.refused("n1", "get", "secrets", "-n", NS) == (
        f'{FORBIDDEN}secrets is forbidden: User "system:node:n1" cannot list resource "secrets" in API group '
        f'"" in the namespace "{NS}": No Object name found')
    # And n2 reads its own.
    got = tenant.as_node("n2", "get", "secret", "n2-secret", "-n", NS, "-o", "name").stdout
    assert got == "secret/n2-secret\n"
    assert tenant.refused("n2", "get", "configmap", "vol-cm", "-n", NS) == FORBIDDEN + _no_relationship(
        "n2", "configmaps", "vol-cm")


def _mover(node: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mover", "namespace": NS},
                           "spec": {"nodeName": node, "containers": [{
                               "name": "app", "image": "registry.invalid/app",
                               "envFrom": [{"secretRef": {"name": "mover-secret"}}]}]}})


def test_access_goes_when_the_pod_goes_or_moves_to_another_node(tenant: Tenant) -> None:
    n1 = tenant.nodes["n1"].core
    tenant.apply(_mover("n1"))
    assert n1.read_namespaced_secret("mover-secret", NS).metadata.name == "mover-secret"
    # A graceful delete leaves the pod terminating on its node, which still needs what it references ...
    tenant.kubectl("delete", "pod", "mover", "-n", NS, "--wait=false")
    assert n1.read_namespaced_secret("mover-secret", NS).metadata.name == "mover-secret"
    # ... until the kubelet confirms it is gone, as a kubelet does: a delete with grace period 0.
    n1.delete_namespaced_pod("mover", NS, grace_period_seconds=0)
    assert _forbidden(n1.read_namespaced_secret, "mover-secret", NS)["message"] == _no_relationship(
        "n1", "secrets", "mover-secret")
    # The same pod name on another node: the secret follows the pod, not the name.
    tenant.apply(_mover("n2"))
    _forbidden(n1.read_namespaced_secret, "mover-secret", NS)
    assert tenant.nodes["n2"].core.read_namespaced_secret("mover-secret", NS).metadata.name == "mover-secret"
    tenant.kubectl("delete", "pod", "mover", "-n", NS, "--grace-period=0", "--force")
    _forbidden(tenant.nodes["n2"].core.read_namespaced_secret, "mover-secret", NS)


# ------------------------------------------------------------------------------ its Node and Lease


def test_a_node_writes_its_own_node_and_lease_only(tenant: Tenant) -> None:
    n1, n2 = tenant.nodes["n1"].core, tenant.nodes["n2"].core
    assert tenant.refused("n1", "create", "-f", "-", input=_node_object("n2")) == (
        f'{FORBIDDEN}error when creating "STDIN": nodes "n2" is forbidden: node "n1" is not allowed to '
        'modify node "n2"')
    for name in ("n1", "n2"):
        own = _node_object(name, labels={"kubernetes.io/os": "linux"})
        tenant.as_node(name, "create", "-f", "-", input=own)
    status = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                          "message": "kubelet is posting ready status"}]}}
    assert n1.patch_node_status("n1", status).status.conditions[0].reason == "KubeletReady"
    assert _forbidden(n1.patch_node_status, "n2", status)["message"] == (
        'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"')
    assert _forbidden(n1.read_node, "n2")["message"] == (
        'nodes "n2" is forbidden: User "system:node:n1" cannot get resource "nodes" in API group "" at the '
        "cluster scope: node 'n1' cannot read 'n2', only its own Node object")
    assert tenant.refused("n1", "get", "nodes") == (
        f'{FORBIDDEN}nodes is forbidden: User "system:node:n1" cannot list resource "nodes" in API group "" '
        "at the cluster scope: node 'n1' cannot read all nodes, only its own Node object")
    assert tenant.as_node("n1", "get", "node", "n1", "-o", "name").stdout == "node/n1\n"
    # Its own labels, except those that steer workloads (node-role, node-restriction.kubernetes.io).
    n1.patch_node("n1", {"metadata": {"labels": {"example.com/pool": "ci"}}})
    role = {"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}}
    assert _forbidden(n1.patch_node, "n1", role)["message"] == (
        'nodes "n1" is forbidden: is not allowed to modify labels: node-role.kubernetes.io/worker')
    assert tenant.refused("n1", "label", "node", "n1", "node-restriction.kubernetes.io/tier=gold") == (
        f'{FORBIDDEN}nodes "n1" is forbidden: is not allowed to modify labels: '
        "node-restriction.kubernetes.io/tier")
    assert tenant.refused("n1", "delete", "node", "n1") == (
        f'{FORBIDDEN}nodes "n1" is forbidden: User "system:node:n1" cannot delete resource "nodes" in API '
        'group "" at the cluster scope')

    coordination = {name: client.CoordinationV1Api(node.api) for name, node in tenant.nodes.items()}

    def lease(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}

    coordination["n1"].create_namespaced_lease("kube-node-lease", lease("n1"))
    coordination["n2"].create_namespaced_lease("kube-node-lease", lease("n2"))
    renewed = {"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}}
    assert coordination["n1"].patch_namespaced_lease("n1", "kube-node-lease", renewed).spec.renew_time
    leases = coordination["n1"]
    assert _forbidden(leases.create_namespaced_lease, "kube-node-lease", lease("n3"))["message"] == (
        'leases.coordination.k8s.io "n3" is forbidden: can only access node lease with the same name as '
        "the requesting node")
    assert _forbidden(leases.patch_namespaced_lease, "n2", "kube-node-lease", renewed)["message"] == (
        'leases.coordination.k8s.io "n2" is forbidden: User "system:node:n1" cannot patch resource '
        '"leases" in API group "coordination.k8s.io" in the namespace "kube-node-lease": can only access '
        "node lease with the same name as the requesting node")
    assert _forbidden(leases.create_namespaced_lease, "default", lease("n1"))["message"] == (
        'leases.coordination.k8s.io is forbidden: User "system:node:n1" cannot create resource "leases" in '
        'API group "coordination.k8s.io" in the namespace "default": can only access leases in the '
        '"kube-node-lease" system namespace')
    assert n2.read_node("n2").metadata.name == "n2"


# ------------------------------------------------------------------------------ its pods


def test_a_node_writes_the_status_of_its_own_pods_only(tenant: Tenant) -> None:
    n1 = tenant.nodes["n1"].core
    running = {"status": {"phase": "Running", "hostIP": "10.0.0.1"}}
    assert n1.patch_namespaced_pod_status("on-n1", NS, running).status.phase == "Running"
    assert _forbidden(n1.patch_namespaced_pod_status, "on-n2", NS, running)["message"] == (
        'pods "on-n2" is forbidden: node "n1" can only update pod status for pods with spec.nodeName set to '
        "itself")
    assert tenant.refused("n1", "delete", "pod", "on-n2", "-n", NS) == (
        f'{FORBIDDEN}pods "on-n2" is forbidden: node "n1" can only delete pods with spec.nodeName set to '
        "itself")
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "on-n2", "namespace": NS}}
    assert _forbidden(n1.create_namespaced_pod_eviction, "on-n2", NS, eviction)["message"] == (
        'pods "on-n2" is forbidden: node n1 can only evict pods with spec.nodeName set to itself')
    with pytest.raises(client.ApiException) as caught:
        n1.delete_namespaced_pod("no-such-pod", NS)
    assert (caught.value.status, _status(caught.value)["message"]) == (404, 'pod "no-such-pod" not found')
    # Its spec is not the node's to change, and a node cannot schedule work onto itself.
    assert tenant.refused("n1", "label", "pod", "on-n1", "-n", NS, "x=y") == (
        f'{FORBIDDEN}pods "on-n1" is forbidden: User "system:node:n1" cannot patch resource "pods" in API '
        f'group "" in the namespace "{NS}"')
    plain = {"metadata": {"name": "sneaky"}, "spec": {"nodeName": "n1", "containers": [
        {"name": "app", "image": "registry.invalid/app"}]}}
    assert _forbidden(n1.create_namespaced_pod, NS, plain)["message"] == (
        'pods "sneaky" is forbidden: pod does not have "kubernetes.io/config.mirror" annotation, node "n1" '
        "can only create mirror pods")


def test_a_node_creates_and_deletes_mirror_pods_of_its_own(tenant: Tenant) -> None:
    n1 = tenant.nodes["n1"].core
    if tenant.kubectl("get", "node", "n1", "--ignore-not-found", "-o", "name").stdout == "":
        tenant.as_node("n1", "create", "-f", "-", input=_node_object("n1"))
    uid = n1.read_node("n1").metadata.uid
    mirror = {"metadata": {"name": "static-web-n1", "annotations": {"kubernetes.io/config.mirror": "hash"},
                           "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid,
                                                "controller": True}]},
              "spec": {"nodeName": "n1", "containers": [{"name": "web", "image": "registry.invalid/web"}]}}
    created = n1.create_namespaced_pod(NS, mirror)
    assert created.spec.service_account_name is None
    with_secret = json.loads(json.dumps(mirror))
    with_secret["metadata"]["name"] = "static-db-n1"
    with_secret["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": "vol-secret"}}]
    assert _forbidden(n1.create_namespaced_pod, NS, with_secret)["message"] == (
        'pods "static-db-n1" is forbidden: node "n1" can not create pods that reference secrets')
    n1.delete_namespaced_pod("static-web-n1", NS, grace_period_seconds=0)


def test_a_node_lists_and_watches_only_its_own_pods(tenant: Tenant) -> None:
    assert tenant.as_node("n1", "get", "pods", "-A", "--field-selector", "spec.nodeName=n1", "-o", "name"
                          ).stdout.splitlines() == ["pod/on-n1"]
    message = (f'{FORBIDDEN}pods is forbidden: User "system:node:n1" cannot list resource "pods" in API '
               'group "" {where}: can only list/watch pods with spec.nodeName field selector')
    assert tenant.refused("n1", "get", "pods", "-n", NS) == message.format(where=f'in the namespace "{NS}"')
    others = tenant.refused("n1", "get", "pods", "-A", "--field-selector", "spec.nodeName=n2")
    assert others == message.format(where="at the cluster scope")
    events = watch.Watch().stream(tenant.nodes["n1"].core.list_pod_for_all_namespaces,
                                  field_selector="spec.nodeName=n1", timeout_seconds=2)
    assert {(e["type"], e["object"].metadata.name) for e in events} == {("ADDED", "on-n1")}


def test_a_node_gets_tokens_only_for_its_own_pods(tenant: Tenant) -> None:
    n1 = tenant.nodes["n1"].core
    tenant.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ServiceAccount",
                                 "metadata": {"name": "builder", "namespace": NS}}))
    pods = {name: tenant.nodes["n1" if name == "on-n1" else "n2"].core.read_namespaced_pod(name, NS)
            for name in ("on-n1", "on-n2")}

    def request(pod: str, *audiences: str) -> dict[str, Any]:
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pods[pod].metadata.uid}
        return {"spec": {"audiences": list(audiences) or None, "expirationSeconds": 3607,
                         "boundObjectRef": ref}}

    # What a kubelet sends to fill kube-api-access: no audience, bound to the pod.
    issued = n1.create_namespaced_service_account_token("builder", NS, request("on-n1"))
    assert issued.status.token.count(".") == 2
    prefix = 'serviceaccounts "builder" is forbidden: '
    refusals = [
        ({"spec": {}}, "node requested token not bound to a pod"),
        (request("on-n2"), "node requested token bound to a pod scheduled on a different node"),
        (request("on-n1", "vault"), 'audience "vault" not found in pod spec volume, system:node:n1 is not '
                                    "authorized to request tokens for this audience"),
    ]
    for body, why in refusals:
        assert _forbidden(n1.create_namespaced_service_account_token, "builder", NS, body)["message"] == (
            prefix + why)
    # The account of a pod on another node is not n1's to ask for at all.
    assert _forbidden(n1.create_namespaced_service_account_token, "default", NS, request("on-n2"))[
        "message"] == (
        'serviceaccounts "default" is forbidden: User "system:node:n1" cannot create resource '
        f'"serviceaccounts/token" in API group "" in the namespace "{NS}": no relationship found between '
        "node 'n1' and this object")


# ------------------------------------------------------------------------------ reviews, identities


def test_kubectl_auth_can_i_as_a_node(tenant: Tenant) -> None:
    def can_i(*args: str) -> str:
        return tenant.as_node("n1", "auth", "can-i", *args, check=False).stdout.strip()

    unrelated = "no - no relationship found between node 'n1' and this object"
    answers = {
        ("get", "secret/vol-secret", "-n", NS): "yes",
        ("get", "secret/n2-secret", "-n", NS): unrelated,
        ("get", "configmap/lonely-cm", "-n", NS): unrelated,
        ("create", "serviceaccounts/builder", "--subresource=token", "-n", NS): "yes",
        ("create", "serviceaccounts/default", "--subresource=token", "-n", NS): unrelated,
        ("patch", "nodes/n1", "--subresource=status"): "yes",
        ("get", "nodes/n1"): "yes",
        ("list", "nodes"): "no - node 'n1' cannot read all nodes, only its own Node object",
        ("list", "pods"): "no - can only list/watch pods with spec.nodeName field selector",
        ("update", "leases/n1", "-n", "kube-node-lease"): "yes",
        ("update", "leases/n2", "-n", "kube-node-lease"):
            "no - can only access node lease with the same name as the requesting node",
        ("watch", "services", "-A"): "yes",
        ("create", "events", "-n", NS): "yes",
        ("create", "deployments.apps", "-n", NS): "no",
    }
    assert {args: can_i(*args) for args in answers} == answers
    whoami = json.loads(tenant.as_node("n1", "auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]
    assert whoami["username"] == "system:node:n1"
    assert whoami["groups"] == ["system:nodes", "system:authenticated"]
    review = client.AuthorizationV1Api(tenant.nodes["n1"].api).create_self_subject_rules_review(
        {"spec": {"namespace": NS}})
    assert (review.status.incomplete, review.status.evaluation_error) == (
        True, "node authorizer does not support user rule resolution")
    # A field selector in an access review is what a list with that selector is decided on.
    allowed = client.AuthorizationV1Api(tenant.nodes["n1"].api).create_self_subject_access_review({"spec": {
        "resourceAttributes": {"verb": "list", "resource": "pods", "fieldSelector": {
            "requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]}}}})
    assert allowed.status.allowed


def test_users_that_are_not_nodes_are_held_to_rbac_alone(tenant: Tenant) -> None:
    impostors = {"kubelet": ["system:nodes"], "system:node:n1": ["kubelets"]}
    for user, groups in impostors.items():
        credential = clusterprovider.mint_tenant_credential_for_cluster_as(
            state_dir=str(tenant.gateway.state_dir), cluster="ci", server=tenant.url, common_name=user,
            organizations=groups, out_dir=str(tenant.tmp / f"impostor-{groups[0]}"))
        path = tenant.tmp / f"impostor-{groups[0]}.kubeconfig"
        kubeconfig.write(str(path), cluster="ci", server=tenant.url, user=user,
                         ca_pem=Path(credential.ca_crt).read_bytes(),
                         cert_pem=Path(credential.tls_crt).read_bytes(),
                         key_pem=Path(credential.tls_key).read_bytes())
        result = tenant.gateway.kubectl_with(path, "get", "secret", "vol-secret", "-n", NS, check=False)
        assert result.stderr.strip() == (
            f'{FORBIDDEN}secrets "vol-secret" is forbidden: User "{user}" cannot get resource "secrets" in '
            f'API group "" in the namespace "{NS}"')
    # RBAC still applies to nodes after the Node authorizer: a grant to system:nodes works.
    tenant.kubectl("create", "clusterrole", "node-extra", "--verb=list", "--resource=deployments.apps")
    tenant.kubectl("create", "clusterrolebinding", "node-extra", "--clusterrole=node-extra",
                   "--group=system:nodes")
    assert tenant.as_node("n1", "get", "deployments", "-n", NS).returncode == 0


def test_a_node_credential_from_the_command_line(tenant: Tenant) -> None:
    out, path = tenant.tmp / "n3", tenant.tmp / "n3.kubeconfig"
    mint = [sys.executable, "-m", "socialweb_computer", "credential", "mint", "--state-dir",
            str(tenant.gateway.state_dir), "--cluster", "ci", "--out-dir"]
    done = subprocess.run([*mint, str(out), "--node", "n3", "--kubeconfig", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    whoami = json.loads(tenant.gateway.kubectl_with(path, "auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == "system:node:n3"
    assert whoami["status"]["userInfo"]["groups"] == ["system:nodes", "system:authenticated"]
    bad = subprocess.run([*mint, str(tenant.tmp / "bad"), "--node", "Bad_Name"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 1, bad.stderr
    assert bad.stderr.startswith("error: --node: 'Bad_Name' cannot name a Node"), bad.stderr
    assert not (tenant.tmp / "bad").exists()
    assert testing.tool_path("kubectl")  # (the pinned kubectl ran all of the above)
