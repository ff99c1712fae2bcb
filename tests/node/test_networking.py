"""In-cluster networking on sandbox nodes, with real kubectl, pods and images built here.

A pod reaches its apiserver at the `kubernetes` Service (the official Python client's
in-cluster configuration, and https://kubernetes.default.svc), a Deployment behind a Service
by DNS name (and stops being routed to when a pod turns unready), a StatefulSet pod by its
stable name, a NodePort within its node, another pod by IP; a pod of another tenant reaches
none of it; the node leaves nothing on the host. Pods report what they saw in their logs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.bidders import base, sandbox
from socialweb_computer.node import config as node_config
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import images, nodes

Tenant = Any  # tests/node/conftest.py's, through the `tenant` fixture

OTHER = "other"
KUBE_API_ACCESS = {
    "name": "kube-api-access",
    "projected": {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ]
    },
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    state = tmp_path_factory.mktemp("gateway") / "state"
    spec = {"clusters": [{"name": "ci"}, {"name": OTHER}]}
    with gateway_mod.GatewayProcess.start(state, spec, timeout=60) as gw:
        gw.wait_phase("ci", "Ready", timeout=60)
        gw.wait_phase(OTHER, "Ready", timeout=60)
        yield gw


@pytest.fixture(scope="session")
def python_image(registry: images.Registry) -> str:
    # The official client without its asyncio half (a third of its size).
    return registry.push(images.python_image("kubernetes", without=("kubernetes/aio/",)), "test/python:1")


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
    done = tenant.wait_phase(name, ns, ("Succeeded", "Failed"), timeout=timeout)
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


def test_a_pod_sees_its_services_and_the_cluster_dns(tenant: Tenant, ns: str, image: str) -> None:
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


def test_the_python_client_in_a_pod_lists_pods_through_kubernetes_default_svc(
    tenant: Tenant, ns: str, python_image: str
) -> None:
    tenant.kubectl(
        "create", "rolebinding", "read", "--clusterrole=view", f"--serviceaccount={ns}:default", "-n", ns
    )
    program = (
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "api = client.CoreV1Api()\n"
        "print('host:', api.api_client.configuration.host)\n"
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
        timeout=180,
        automountServiceAccountToken=False,  # the volume the ServiceAccount admission would add, by hand
        volumes=[KUBE_API_ACCESS],
        container={
            "volumeMounts": [
                {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
            ]
        },
    )
    # The certificate is verified against the ClusterIP and against the service name.
    assert lines(log, "host: ") == ["https://10.96.0.1:443"]
    assert lines(log, "pods: ") == ["['lister']"]
    assert lines(log, "by name: ") == ["['lister']"]
    assert lines(log, "secrets: ") == ["403"]  # the token is the ServiceAccount's, held to RBAC


def test_a_deployment_behind_a_service_answers_by_name_and_loses_an_unready_pod(
    tenant: Tenant, ns: str, image: str
) -> None:
    tenant.kubectl("create", "configmap", "flags", "-n", ns)
    server = web_server(
        "web",
        image,
        readinessProbe={
            "exec": {"command": ["sh", "-c", "test ! -e /flags/unready-$(hostname)"]},
            "periodSeconds": 1,
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
    pods = tenant.wait(lambda: _ready_pods(tenant, ns, "app=web", 2), "two ready web pods")
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
    tenant.wait(lambda: _ready_pods(tenant, ns, "app=web", 1), "one web pod unready", timeout=60)
    tenant.wait(
        lambda: _slice_ready(tenant, ns, "web") == {leaving: False, staying: True}, "the slice says so"
    )
    assert set(lines(run(tenant, ns, "after", by_name, image), "by-name: ")) == {staying}


def _ready_pods(tenant: Tenant, ns: str, selector: str, count: int) -> list[dict[str, Any]] | None:
    listed = json.loads(tenant.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout)["items"]
    ready = [
        p
        for p in listed
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]
    return ready if len(ready) == count and len(listed) >= count else None


def _slice_ready(tenant: Tenant, ns: str, service: str) -> dict[str, bool]:
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


def test_a_statefulset_pod_is_reached_by_its_stable_name(tenant: Tenant, ns: str, image: str) -> None:
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
    ready = tenant.wait(lambda: _ready_pods(tenant, ns, "app=db", 1), "pod-0 ready")
    script = (
        f"echo answer: $(wget -qO- http://pod-0.svc.{ns}.svc.cluster.local:8080/index.html); "
        f"nslookup pod-0.svc.{ns}.svc.cluster.local | sed 's/^/a: /'; "
        f"nslookup -type=SRV _web._tcp.svc.{ns}.svc.cluster.local | sed 's/^/srv: /'"
    )
    log = run(tenant, ns, "client", script, image)
    assert lines(log, "answer: ") == ["pod-0"]
    assert f"a: Address: {ready[0]['status']['podIP']}" in log.splitlines()
    assert any(f"8080 pod-0.svc.{ns}.svc.cluster.local" in line for line in lines(log, "srv: ")), log


def test_a_pod_of_another_tenant_reaches_nothing_of_this_one(
    gateway: gateway_mod.GatewayProcess, tenant: Tenant, ns: str, image: str, registry: images.Registry
) -> None:
    pod = web_server("web", image)
    tenant.kubectl(
        "run",
        "target",
        "-n",
        ns,
        "-l",
        "app=target",
        f"--image={image}",
        "--port=8080",
        "--",
        "sh",
        "-c",
        pod["command"][2],
    )
    tenant.kubectl("expose", "pod", "target", "-n", ns, "--port=80", "--target-port=8080")
    target = tenant.wait(lambda: _ready_pods(tenant, ns, "app=target", 1), "target ready")[0]
    target_ip = tenant.get("service", "target", ns)["spec"]["clusterIP"]
    marker = str(gateway.state_dir)
    before = nodes.HostSnapshot.take(marker)
    other = type(tenant)(gateway, OTHER)
    with _node_of(gateway.state_dir, OTHER, registry) as handle:
        other.wait(lambda: _node_ready(other, handle.name), f"node {handle.name} Ready")
        # The node's rules and DNS address live in its namespace only.
        init = handle_pid(gateway.state_dir, handle.name)
        inside = subprocess.run(
            ["nsenter", "-t", str(init), "-n", "nft", "list", "table", "ip", "socialweb"],
            capture_output=True,
            text=True,
        )
        assert inside.returncode == 0 and "svc-default/kubernetes/tcp/https" in inside.stdout
        assert (
            "socialweb"
            not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        )
        assert "10.96.0.10" not in subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        other_ns = other.namespace()
        script = (
            f"wget -qO- http://{target['status']['podIP']}:8080/index.html; echo pod: $?; "
            f"wget -qO- http://{target_ip}/index.html; echo service: $?; "
            f"nslookup target.{ns}.svc.cluster.local | grep -c NXDOMAIN | sed 's/^/name: /'"
        )
        log = run(other, other_ns, "intruder", script, image)
        assert lines(log, "pod: ") == ["1"] and lines(log, "service: ") == ["1"], log
        assert lines(log, "name: ") != ["0"], log
    assert nodes.HostSnapshot.take(marker).differences(before) == {}


def _node_of(state_dir: Path, cluster: str, registry: images.Registry) -> Any:
    return nodes.sandbox_node(
        state_dir,
        cluster,
        host_ports=[registry.port],
        size=node_config.Size(vcpu=1, mem_mib=1024, rootfs_mib=2048),
    )


def _node_ready(tenant: Tenant, name: str) -> bool:
    jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    return tenant.kubectl("get", "node", name, "-o", jsonpath).stdout == "True"


def handle_pid(state_dir: Path, name: str) -> int:
    records = [h for h in base.read_records(Path(state_dir), sandbox.KIND) if h.name == name]
    return int(records[0].pids["init"])
