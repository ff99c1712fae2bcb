"""In-cluster networking scenarios, run against any tenant whose pods land on a real node.

The sandbox tests (tests/node/test_networking.py) and the microVM tests
(tests/guest/test_microvm_networking.py) run the same scenarios: each creates what it needs
in namespace `ns`, runs client pods that print what they saw, and asserts on their logs.
`tenant` is anything with `kubectl`, `apply`, `get`, `wait` and `wait_phase` as
tests/node/conftest.py's Tenant has them; `Cluster` is one for a gateway's tenant.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from socialweb_computer.testing import gateway as gateway_mod

Tenant = Any


class Cluster:
    """kubectl against one tenant of a gateway as its admin, with waits."""

    def __init__(self, gateway: gateway_mod.GatewayProcess, cluster: str, *, patience: float = 1.0) -> None:
        self.gateway = gateway
        self.kubeconfig = gateway.tenant_kubeconfig(cluster)
        self.patience = patience  # how much longer than on a sandbox node pods take (a TCG guest)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0) -> Any:
        return self.gateway.kubectl_with(self.kubeconfig, *args, input=input, check=check, timeout=timeout)

    def apply(self, manifest: str, namespace: str) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)

    def wait(self, predicate: Any, what: str, timeout: float = 180.0, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except Exception as exc:  # the object may not exist yet
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")

    def wait_phase(self, name: str, namespace: str, phases: tuple[str, ...], timeout: float = 180.0) -> Any:
        return self.wait(
            lambda: (p := self.get("pod", name, namespace))["status"].get("phase") in phases and p,
            f"pod {namespace}/{name} in {phases}",
            timeout,
        )

    def namespace(self) -> str:
        name = "t-" + uuid.uuid4().hex[:8]
        self.kubectl("create", "namespace", name)
        return name


def patience(tenant: Tenant) -> float:
    return float(getattr(tenant, "patience", 1.0))


def run(
    tenant: Tenant, ns: str, name: str, script: str, image: str, timeout: float = 120.0, **spec: Any
) -> str:
    """Runs `script` in a pod to completion; returns its log (and fails if the pod failed)."""
    container = {"name": "main", "image": image, "command": ["sh", "-c", script]}
    container.update(spec.pop("container", {}))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }
    tenant.apply(json.dumps(pod), ns)
    done = tenant.wait_phase(name, ns, ("Succeeded", "Failed"), timeout=timeout * patience(tenant))
    log = tenant.kubectl("logs", "-n", ns, name).stdout
    assert done["status"]["phase"] == "Succeeded", log
    return log


def lines(log: str, prefix: str) -> list[str]:
    return [line[len(prefix) :] for line in log.splitlines() if line.startswith(prefix)]


def web_server(name: str, image: str, **spec: Any) -> dict[str, Any]:
    """A container answering /index.html with its pod's name (and ready while no flag names it)."""
    return {
        "name": name,
        "image": image,
        "command": ["sh", "-c", "mkdir -p /w && hostname > /w/index.html && exec httpd -f -p 8080 -h /w"],
        "ports": [{"name": "http", "containerPort": 8080}],
        **spec,
    }


def pod_sees_its_services_and_the_cluster_dns(tenant: Tenant, ns: str, image: str) -> None:
    tenant.kubectl("create", "service", "clusterip", "web-api", "--tcp=80:8080", "-n", ns)
    ip = tenant.get("service", "web-api", ns)["spec"]["clusterIP"]
    script = "env | sort | sed 's/^/env: /'; sed 's/^/resolv: /' /etc/resolv.conf"
    log = run(tenant, ns, "env", script, image)
    env = dict(line.split("=", 1) for line in lines(log, "env: "))
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and env["KUBERNETES_SERVICE_PORT"] == "443"
    assert env["KUBERNETES_PORT"] == "tcp://10.96.0.1:443"
    assert env["WEB_API_SERVICE_HOST"] == ip and env["WEB_API_PORT_80_TCP"] == f"tcp://{ip}:80"
    assert lines(log, "resolv: ") == [
        f"search {ns}.svc.cluster.local svc.cluster.local cluster.local",
        "nameserver 10.96.0.10",
        "options ndots:5",
    ]
    quiet = run(tenant, ns, "no-links", "env | sort | sed 's/^/env: /'", image, enableServiceLinks=False)
    names = {line.split("=", 1)[0] for line in lines(quiet, "env: ")}
    assert "KUBERNETES_SERVICE_HOST" in names and "WEB_API_SERVICE_HOST" not in names


def python_client_lists_pods_through_kubernetes_default_svc(
    tenant: Tenant, ns: str, python_image: str
) -> None:
    """The official client's in-cluster configuration, from what every pod gets: the Service
    variables, and the `kube-api-access-*` volume ServiceAccount admission adds (token, ca.crt,
    namespace) that the agent fills."""
    tenant.kubectl(
        "create", "rolebinding", "read", "--clusterrole=view", f"--serviceaccount={ns}:default", "-n", ns
    )
    program = (
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "print('host:', api.api_client.configuration.host)\n"
        "review = client.AuthenticationV1Api().create_self_subject_review(client.V1SelfSubjectReview())\n"
        "print('user:', review.status.user_info.username)\n"
        "print('pod:', review.status.user_info.extra['authentication.kubernetes.io/pod-name'])\n"
        f"print('pods:', sorted(p.metadata.name for p in api.list_namespaced_pod('{ns}').items))\n"
        "named = client.Configuration.get_default_copy()\n"
        "named.host = 'https://kubernetes.default.svc'\n"
        "api = client.CoreV1Api(client.ApiClient(named))\n"
        f"print('by name:', sorted(p.metadata.name for p in api.list_namespaced_pod('{ns}').items))\n"
        "try:\n"
        f"    api.list_namespaced_secret('{ns}')\n"
        "except client.ApiException as e:\n"
        "    print('secrets:', e.status)\n"
    )
    log = run(
        tenant,
        ns,
        "lister",
        f'exec python3 -c "{program}"',
        python_image,
        timeout=300,  # importing the whole client takes minutes in a TCG guest
    )
    # The certificate is verified against the ClusterIP and against the service name.
    assert lines(log, "host: ") == ["https://10.96.0.1:443"]
    assert lines(log, "user: ") == [f"system:serviceaccount:{ns}:default"]
    assert lines(log, "pod: ") == ["['lister']"]  # the token is bound to this pod
    assert lines(log, "pods: ") == ["['lister']"]
    assert lines(log, "by name: ") == ["['lister']"]
    assert lines(log, "secrets: ") == ["403"]  # the token is the ServiceAccount's, held to RBAC


def deployment_behind_a_service_answers_by_name_and_loses_an_unready_pod(
    tenant: Tenant, ns: str, image: str
) -> None:
    tenant.kubectl("create", "configmap", "flags", "-n", ns)
    server = web_server(
        "web",
        image,
        readinessProbe={
            "exec": {"command": ["sh", "-c", "test ! -e /flags/unready-$(hostname)"]},
            "periodSeconds": 1,
            "timeoutSeconds": 10,  # an exec in a TCG guest on a busy machine takes seconds
        },
        volumeMounts=[{"name": "flags", "mountPath": "/flags"}],
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [server],
                    "volumes": [{"name": "flags", "configMap": {"name": "flags"}}],
                },
            },
        },
    }
    services = [
        {"metadata": {"name": "web"}, "spec": {}},
        {"metadata": {"name": "sticky"}, "spec": {"sessionAffinity": "ClientIP"}},
        {"metadata": {"name": "web-np"}, "spec": {"type": "NodePort"}},
    ]
    tenant.apply(json.dumps(deployment), ns)
    for svc in services:
        svc["apiVersion"], svc["kind"] = "v1", "Service"
        svc["spec"].update(
            {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
        )
        tenant.apply(json.dumps(svc), ns)
    pods = tenant.wait(
        lambda: ready_pods(tenant, ns, "app=web", 2), "two ready web pods", 90 * patience(tenant)
    )
    node_port = tenant.get("service", "web-np", ns)["spec"]["ports"][0]["nodePort"]
    direct = pods[0]["status"]["podIP"]
    url = f"http://web.{ns}.svc.cluster.local/index.html"
    by_name = f"for i in $(seq 12); do echo by-name: $(wget -qO- {url}); done"
    script = (
        f"{by_name}; "
        "for i in $(seq 3); do echo short: $(wget -qO- http://web/index.html); done; "
        "for i in $(seq 8); do echo sticky: $(wget -qO- http://sticky/index.html); done; "
        f"echo nodeport: $(wget -qO- http://$NODE_IP:{node_port}/index.html); "
        f"echo direct: $(wget -qO- http://{direct}:8080/index.html)"
    )
    node_ip = {"env": [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]}
    names = sorted(p["metadata"]["name"] for p in pods)
    log = run(tenant, ns, "client", script, image, container=node_ip)
    assert sorted(set(lines(log, "by-name: "))) == names  # both get connections
    assert set(lines(log, "short: ")) <= set(names) and len(lines(log, "short: ")) == 3
    assert len(set(lines(log, "sticky: "))) == 1  # ClientIP affinity: one client, one pod
    assert lines(log, "nodeport: ")[0] in names
    assert lines(log, "direct: ") == [pods[0]["metadata"]["name"]]  # pod to pod on one node

    leaving, staying = names
    tenant.kubectl(
        "patch", "configmap", "flags", "-n", ns, "-p", json.dumps({"data": {f"unready-{leaving}": "1"}})
    )
    tenant.wait(lambda: ready_pods(tenant, ns, "app=web", 1), "one web pod unready", 60 * patience(tenant))
    tenant.wait(
        lambda: slice_ready(tenant, ns, "web") == {leaving: False, staying: True}, "the slice says so"
    )
    assert set(lines(run(tenant, ns, "after", by_name, image), "by-name: ")) == {staying}


def ready_pods(tenant: Tenant, ns: str, selector: str, count: int) -> list[dict[str, Any]] | None:
    listed = json.loads(tenant.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout)["items"]
    ready = [
        p
        for p in listed
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]
    return ready if len(ready) == count and len(listed) >= count else None


def slice_ready(tenant: Tenant, ns: str, service: str) -> dict[str, bool]:
    listed = json.loads(
        tenant.kubectl(
            "get", "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={service}", "-o", "json"
        ).stdout
    )["items"]
    return {
        e["targetRef"]["name"]: e["conditions"].get("ready", True)
        for s in listed
        for e in s.get("endpoints") or []
    }


def statefulset_pod_is_reached_by_its_stable_name(tenant: Tenant, ns: str, image: str) -> None:
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"name": "web", "port": 8080}]},
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "pod"},
        "spec": {
            "serviceName": "svc",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [web_server("db", image)]},
            },
        },
    }
    tenant.apply(json.dumps(headless), ns)
    tenant.apply(json.dumps(statefulset), ns)
    ready = tenant.wait(lambda: ready_pods(tenant, ns, "app=db", 1), "pod-0 ready", 90 * patience(tenant))
    script = (
        f"echo answer: $(wget -qO- http://pod-0.svc.{ns}.svc.cluster.local:8080/index.html); "
        f"nslookup pod-0.svc.{ns}.svc.cluster.local | sed 's/^/a: /'; "
        f"nslookup -type=SRV _web._tcp.svc.{ns}.svc.cluster.local | sed 's/^/srv: /'"
    )
    log = run(tenant, ns, "client", script, image)
    assert lines(log, "answer: ") == ["pod-0"]
    assert f"a: Address: {ready[0]['status']['podIP']}" in log.splitlines()
    assert any(f"8080 pod-0.svc.{ns}.svc.cluster.local" in line for line in lines(log, "srv: ")), log
