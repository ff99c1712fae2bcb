"""Capacity through the official Python client, as a program (GitLab Runner's executor, a CI
tool) sees it: a pod created on a zero-node cluster is watched until it runs, its events name
the scale-up in cluster-autoscaler's words, the rented node carries its labels, and once the
pod is gone a watch on the nodes sees the node deleted after the hold.

Real parts: the gateway process with the sandbox bidder (`start_capacity`, which checks the
host afterwards), the `kubernetes` package against the tenant's listener.
"""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config, watch

from .conftest import Capacity


def _core(cap: Capacity, cluster: str) -> tuple[k8s.ApiClient, k8s.CoreV1Api]:
    configuration = k8s.Configuration()
    config.load_kube_config(
        config_file=str(cap.gateway.tenant_kubeconfig(cluster)), client_configuration=configuration
    )
    api_client = k8s.ApiClient(configuration)
    return api_client, k8s.CoreV1Api(api_client)


def test_the_python_client_sees_a_node_rented_for_its_pod_and_released_after(start_capacity, image) -> None:
    cap = start_capacity()
    api_client, core = _core(cap, "ci")
    try:
        assert core.list_node().items == []
        core.create_namespaced_pod(
            "default",
            k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(name="py-job"),
                spec=k8s.V1PodSpec(
                    restart_policy="Never",
                    termination_grace_period_seconds=1,
                    containers=[k8s.V1Container(name="main", image=image, command=["sleep", "3"])],
                ),
            ),
        )
        phases: list[str] = []
        stream = watch.Watch()
        for event in stream.stream(
            core.list_namespaced_pod, "default", field_selector="metadata.name=py-job", timeout_seconds=180
        ):
            phase = event["object"].status.phase
            if not phases or phases[-1] != phase:
                phases.append(phase)
            if phase in ("Succeeded", "Failed"):
                stream.stop()
        assert phases[0] == "Pending" and "Running" in phases and phases[-1] == "Succeeded", phases
        done = core.read_namespaced_pod("py-job", "default")
        node = core.read_node(done.spec.node_name)
        labels = node.metadata.labels
        assert labels["socialweb.computer/bidder"] == "sandbox"
        assert labels["socialweb.computer/size"] == "1cpu-1024mi-1024mi"
        assert labels["socialweb.computer/cluster"] == "ci"
        assert labels["socialweb.computer/managed-by"] == "capacity"

        said = core.list_namespaced_event("default", field_selector="involvedObject.name=py-job").items
        [scale_up] = [e for e in said if e.reason == "TriggeredScaleUp"]
        assert scale_up.type == "Normal" and scale_up.source.component == "cluster-autoscaler"
        assert scale_up.message == "pod triggered scale-up: [{sandbox-1cpu-1024mi-1024mi 0->1 (max: 10)}]"
        assert scale_up.involved_object.kind == "Pod" and scale_up.involved_object.uid == done.metadata.uid

        # The work is gone: after the hold the node is deleted, which a watch on the nodes sees.
        listed = core.list_node()
        core.delete_namespaced_pod("py-job", "default")
        deleted = []
        stream = watch.Watch()
        for event in stream.stream(
            core.list_node, resource_version=listed.metadata.resource_version, timeout_seconds=120
        ):
            if event["type"] == "DELETED":
                deleted.append(event["object"].metadata.name)
                stream.stop()
        assert deleted == [node.metadata.name]
        node_said = core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node.metadata.name}"
        ).items
        assert [(e.reason, e.message) for e in node_said if e.reason == "ScaleDown"] == [
            ("ScaleDown", "marked the node as toBeDeleted/unschedulable"),
            ("ScaleDown", "node removed by cluster autoscaler"),
        ]
        assert all(e.involved_object.kind == "Node" for e in node_said)
    finally:
        api_client.close()
