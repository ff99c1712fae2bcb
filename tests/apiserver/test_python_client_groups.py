"""The groups a 1.37 cluster serves, through the official `kubernetes` Python client's typed APIs.

The client deserializes every answer into its generated models, which refuse objects that
lack what upstream always returns (a condition's status, a required spec field), so reading
the objects back proves their shape as well as the server's defaults.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from socialweb_computer import testing


@pytest.fixture
def api(shared_apiserver: testing.ApiServerProcess) -> client.ApiClient:
    return shared_apiserver.python_client()


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_autoscaling_v1_and_v2(api: client.ApiClient, namespace: str) -> None:
    v2 = client.AutoscalingV2Api(api)
    hpa = client.V2HorizontalPodAutoscaler(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V2HorizontalPodAutoscalerSpec(
            scale_target_ref=client.V2CrossVersionObjectReference(
                api_version="apps/v1", kind="Deployment", name="web"
            ),
            min_replicas=1,
            max_replicas=3,
        ),
    )
    created = v2.create_namespaced_horizontal_pod_autoscaler(namespace, hpa)
    # Upstream's default metric: 80% CPU utilization.
    (metric,) = created.spec.metrics
    assert metric.type == "Resource" and metric.resource.name == "cpu"
    assert metric.resource.target.average_utilization == 80
    assert created.spec.behavior is None  # upstream defaults a behavior only when one is given
    v1 = client.AutoscalingV1Api(api).read_namespaced_horizontal_pod_autoscaler("web", namespace)
    assert v1.spec.max_replicas == 3 and v1.spec.target_cpu_utilization_percentage == 80


def test_networking_kinds(api: client.ApiClient, namespace: str) -> None:
    net = client.NetworkingV1Api(api)
    klass = _unique("nginx")
    net.create_ingress_class(
        client.V1IngressClass(
            metadata=client.V1ObjectMeta(name=klass),
            spec=client.V1IngressClassSpec(controller="example.com/ingress"),
        )
    )
    ingress = client.V1Ingress(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1IngressSpec(
            ingress_class_name=klass,
            rules=[
                client.V1IngressRule(
                    host="web.example.com",
                    http=client.V1HTTPIngressRuleValue(
                        paths=[
                            client.V1HTTPIngressPath(
                                path="/",
                                path_type="Prefix",
                                backend=client.V1IngressBackend(
                                    service=client.V1IngressServiceBackend(
                                        name="web", port=client.V1ServiceBackendPort(number=80)
                                    )
                                ),
                            )
                        ]
                    ),
                )
            ],
        ),
    )
    assert net.create_namespaced_ingress(namespace, ingress).spec.rules[0].host == "web.example.com"
    policy = client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name="deny"),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(),
            ingress=[client.V1NetworkPolicyIngressRule(ports=[client.V1NetworkPolicyPort(port=70000)])],
        ),
    )
    with pytest.raises(ApiException) as refused:
        net.create_namespaced_network_policy(namespace, policy)
    assert refused.value.status == 422
    assert (
        "spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive"
        in refused.value.body
    )
    policy.spec.ingress[0].ports[0].port = 8080
    created = net.create_namespaced_network_policy(namespace, policy)
    assert created.spec.policy_types == ["Ingress"] and created.spec.ingress[0].ports[0].protocol == "TCP"
    net.delete_ingress_class(klass)


def test_storage_and_node_kinds(api: client.ApiClient) -> None:
    storage = client.StorageV1Api(api)
    name = _unique("fast")
    created = storage.create_storage_class(
        client.V1StorageClass(metadata=client.V1ObjectMeta(name=name), provisioner="example.com/disk")
    )
    assert created.reclaim_policy == "Delete" and created.volume_binding_mode == "Immediate"
    driver = _unique("driver") + ".example.com"
    csi = storage.create_csi_driver(
        client.V1CSIDriver(metadata=client.V1ObjectMeta(name=driver), spec=client.V1CSIDriverSpec())
    )
    assert csi.spec.attach_required is True and csi.spec.volume_lifecycle_modes == ["Persistent"]
    assert csi.spec.fs_group_policy == "ReadWriteOnceWithFSType"
    runtime = _unique("gvisor")
    node = client.NodeV1Api(api)
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=runtime), handler="runsc")
    )
    assert node.read_runtime_class(runtime).handler == "runsc"
    for delete, obj in (
        (storage.delete_storage_class, name),
        (storage.delete_csi_driver, driver),
        (node.delete_runtime_class, runtime),
    ):
        delete(obj)


def test_control_plane_kinds(api: client.ApiClient) -> None:
    services = client.ApiregistrationV1Api(api).list_api_service().items
    local = {s.metadata.name: s for s in services}
    assert local["v1.apps"].spec.service is None
    assert local["v1.apps"].status.conditions[0].type == "Available"
    flow = client.FlowcontrolApiserverV1Api(api)
    assert {"exempt", "catch-all", "global-default"} <= {
        s.metadata.name for s in flow.list_flow_schema().items
    }
    levels = {p.metadata.name: p for p in flow.list_priority_level_configuration().items}
    assert levels["catch-all"].spec.limited.nominal_concurrency_shares == 5
    statuses = client.CoreV1Api(api).list_component_status().items
    assert {s.metadata.name for s in statuses} >= {"etcd-0", "scheduler", "controller-manager"} or statuses


def test_certificates_through_the_client(api: client.ApiClient, tmp_path: Path) -> None:
    user = _unique("carol")
    key, csr = tmp_path / "k.pem", tmp_path / "r.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={user}",
        ],
        check=True,
        capture_output=True,
    )
    certs = client.CertificatesV1Api(api)
    request = client.V1CertificateSigningRequest(
        metadata=client.V1ObjectMeta(name=user),
        spec=client.V1CertificateSigningRequestSpec(
            request=base64.b64encode(csr.read_bytes()).decode(),
            signer_name="kubernetes.io/kube-apiserver-client",
            usages=["client auth"],
        ),
    )
    created = certs.create_certificate_signing_request(request)
    assert created.spec.username == "system:admin"
    created.status = client.V1CertificateSigningRequestStatus(
        conditions=[
            client.V1CertificateSigningRequestCondition(
                type="Approved", status="True", reason="ByTest", message="approved by the test"
            )
        ]
    )
    approved = certs.replace_certificate_signing_request_approval(user, created)
    assert approved.status.conditions[0].type == "Approved"
    certs.delete_certificate_signing_request(user)
