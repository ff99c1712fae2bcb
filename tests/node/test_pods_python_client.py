"""The same node through the official Python client: create, watch the status, read logs."""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import watch


def test_python_client_creates_a_pod_watches_it_run_and_reads_its_log(gateway, tenant, ns, image) -> None:
    api_client = k8s.ApiClient(_configuration(gateway))
    core = k8s.CoreV1Api(api_client)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="py"),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            containers=[
                k8s.V1Container(name="main", image=image, command=["sh", "-c", "echo from python; sleep 2"])
            ],
        ),
    )
    core.create_namespaced_pod(ns, pod)
    phases = []
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod, ns, field_selector="metadata.name=py", timeout_seconds=90
    ):
        phase = event["object"].status.phase
        if not phases or phases[-1] != phase:
            phases.append(phase)
        if phase in ("Succeeded", "Failed"):
            stream.stop()
    assert phases[-1] == "Succeeded"
    assert "Running" in phases
    done = core.read_namespaced_pod("py", ns)
    assert done.status.container_statuses[0].state.terminated.exit_code == 0
    assert done.status.pod_ip
    assert core.read_namespaced_pod_log("py", ns) == "from python\n"
    followed = core.read_namespaced_pod_log("py", ns, follow=True, _preload_content=False)
    assert followed.read() == b"from python\n"
    api_client.close()


def test_python_client_sees_the_node(gateway, node) -> None:
    api_client = k8s.ApiClient(_configuration(gateway))
    listed = k8s.CoreV1Api(api_client).read_node(node.name)
    ready = {c.type: c.status for c in listed.status.conditions}
    assert ready["Ready"] == "True"
    assert listed.status.node_info.kubelet_version == "v1.37.0"
    assert listed.spec.pod_cidr.startswith("10.244.")
    api_client.close()


def _configuration(gateway) -> k8s.Configuration:
    from kubernetes import config

    configuration = k8s.Configuration()
    config.load_kube_config(
        config_file=str(gateway.tenant_kubeconfig("ci")), client_configuration=configuration
    )
    return configuration
