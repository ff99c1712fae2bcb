"""The API engine driven by the real kubectl 1.37, as an operator would drive a cluster.

Each test keeps to its own namespace on the shared server, except those that restart,
compact or change cluster-wide state (they take a fresh `apiserver`). Every test runs on
SQLite and on etcd (`both_storages`).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest
import yaml

from socialweb_computer import testing

pytestmark = pytest.mark.both_storages

CONFIGMAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
data:
  foo: bar
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: app
          image: nginx:1.27
          ports: [{containerPort: 80}]
"""


def test_discovery_short_names_and_api_resources(shared_apiserver: testing.ApiServerProcess) -> None:
    out = shared_apiserver.kubectl("api-resources").stdout
    for line in ("pods", "deployments", "customresourcedefinitions", "priorityclasses", "leases"):
        assert line in out
    assert " po " in out and " deploy " in out
    assert (
        shared_apiserver.kubectl("get", "ns", "default", "-o", "name").stdout.strip() == "namespace/default"
    )
    version = json.loads(shared_apiserver.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.37")


def test_apply_get_describe_and_output_formats(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    k = shared_apiserver.kubectl
    assert k("apply", "-n", namespace, "-f", "-", input=CONFIGMAP).stdout.strip() == "configmap/demo created"
    assert (
        k("apply", "-n", namespace, "-f", "-", input=CONFIGMAP).stdout.strip() == "configmap/demo unchanged"
    )
    changed = CONFIGMAP.replace("foo: bar", "foo: baz")
    assert k("apply", "-n", namespace, "-f", "-", input=changed).stdout.strip() == "configmap/demo configured"
    obj = json.loads(k("get", "-n", namespace, "cm", "demo", "-o", "json").stdout)
    assert obj["data"] == {"foo": "baz"}
    assert (
        obj["metadata"]["uid"] and obj["metadata"]["resourceVersion"] and obj["metadata"]["creationTimestamp"]
    )
    assert (
        yaml.safe_load(k("get", "-n", namespace, "cm", "demo", "-o", "yaml").stdout)["data"]["foo"] == "baz"
    )
    assert k("get", "-n", namespace, "cm", "demo", "-o", "jsonpath={.data.foo}").stdout == "baz"
    # Every namespace also holds kube-root-ca.crt (the root CA publisher), as on any cluster.
    table = k("get", "-n", namespace, "cm").stdout.splitlines()
    assert table[0].split() == ["NAME", "DATA", "AGE"]
    assert table[1].split()[:2] == ["demo", "1"]
    columns = "custom-columns=N:.metadata.name,F:.data.foo"
    custom = k("get", "-n", namespace, "cm", "demo", "-o", columns).stdout
    assert custom.split() == ["N", "F", "demo", "baz"]
    described = k("describe", "-n", namespace, "cm", "demo").stdout
    assert "Name:" in described and "demo" in described and "baz" in described


def test_deployment_table_wide_scale_label_annotate(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)
    header = k("get", "-n", namespace, "deploy").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    wide = k("get", "-n", namespace, "deploy", "-o", "wide").stdout.splitlines()[0].split()
    assert wide[-3:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert (
        k("scale", "-n", namespace, "deploy/web", "--replicas=5").stdout.strip()
        == "deployment.apps/web scaled"
    )
    assert k("get", "-n", namespace, "deploy", "web", "-o", "jsonpath={.spec.replicas}").stdout == "5"
    k("label", "-n", namespace, "deploy/web", "tier=frontend")
    k("annotate", "-n", namespace, "deploy/web", "note=hello")
    obj = json.loads(k("get", "-n", namespace, "deploy", "web", "-o", "json").stdout)
    assert obj["metadata"]["labels"]["tier"] == "frontend"
    assert obj["metadata"]["annotations"]["note"] == "hello"
    assert obj["metadata"]["generation"] == 2  # scale changed the spec, labels did not
    selected = k("get", "-n", namespace, "deploy", "-l", "tier=frontend", "-o", "name").stdout.split()
    assert selected == ["deployment.apps/web"]
    assert k("get", "-n", namespace, "deploy", "-l", "tier!=frontend", "-o", "name").stdout.strip() == ""


def test_patch_types_replace_and_delete(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)
    k(
        "patch",
        "-n",
        namespace,
        "deploy",
        "web",
        "--type=strategic",
        "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"app","image":"nginx:1.28"}]}}}}',
    )
    k("patch", "-n", namespace, "deploy", "web", "--type=merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
    k(
        "patch",
        "-n",
        namespace,
        "deploy",
        "web",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/replicas","value":3}]',
    )
    obj = json.loads(k("get", "-n", namespace, "deploy", "web", "-o", "json").stdout)
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [("app", "nginx:1.28")]
    assert containers[0]["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert obj["metadata"]["labels"]["m"] == "1" and obj["spec"]["replicas"] == 3
    obj["spec"]["replicas"] = 4
    k("replace", "-n", namespace, "-f", "-", input=json.dumps(obj))
    assert k("get", "-n", namespace, "deploy", "web", "-o", "jsonpath={.spec.replicas}").stdout == "4"
    stale = k("replace", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    assert stale.returncode == 1
    assert "the object has been modified; please apply your changes to the latest version" in stale.stderr
    out = k("delete", "-n", namespace, "deploy", "web").stdout.strip()
    assert out == f'deployment.apps "web" deleted from {namespace} namespace'
    missing = k("get", "-n", namespace, "deploy", "web", check=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): deployments.apps "web" not found' in missing.stderr


def test_server_side_apply_and_conflicts(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    out = k("apply", "--server-side", "-n", namespace, "-f", "-", input=CONFIGMAP).stdout.strip()
    assert out == "configmap/demo serverside-applied"
    other = CONFIGMAP.replace("foo: bar", "foo: other")
    conflict = k(
        "apply",
        "--server-side",
        "--field-manager=other",
        "-n",
        namespace,
        "-f",
        "-",
        input=other,
        check=False,
    )
    assert conflict.returncode == 1
    assert "Apply failed with 1 conflict" in conflict.stderr and ".data.foo" in conflict.stderr
    k(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=other",
        "-n",
        namespace,
        "-f",
        "-",
        input=other,
    )
    obj = json.loads(k("get", "-n", namespace, "cm", "demo", "-o", "json", "--show-managed-fields").stdout)
    assert obj["data"]["foo"] == "other"
    assert "other" in [m["manager"] for m in obj["metadata"]["managedFields"]]


def test_strict_field_validation(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    bad = DEPLOYMENT.replace("  replicas: 2\n", "  replicas: 2\n  foo: bar\n")
    result = shared_apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=bad, check=False)
    assert result.returncode == 1
    assert 'strict decoding error: unknown field "spec.foo"' in result.stderr
    assert shared_apiserver.kubectl("get", "-n", namespace, "deploy", "-o", "name").stdout.strip() == ""
    warned = shared_apiserver.kubectl("apply", "--validate=warn", "-n", namespace, "-f", "-", input=bad)
    assert 'unknown field "spec.foo"' in warned.stderr


def test_invalid_and_already_exists(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    bad_name = CONFIGMAP.replace("name: demo", "name: Bad_Name")
    result = k("create", "-n", namespace, "-f", "-", input=bad_name, check=False)
    assert result.returncode == 1
    assert 'The ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"' in result.stderr
    k("create", "-n", namespace, "-f", "-", input=CONFIGMAP)
    again = k("create", "-n", namespace, "-f", "-", input=CONFIGMAP, check=False)
    assert (
        'Error from server (AlreadyExists): error when creating "STDIN": configmaps "demo" already exists'
        in again.stderr
    )
    nowhere = k("create", "-n", "no-such-ns", "-f", "-", input=CONFIGMAP, check=False)
    assert 'namespaces "no-such-ns" not found' in nowhere.stderr


def test_typed_create_commands_send_protobuf(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    k = shared_apiserver.kubectl
    assert (
        k("create", "configmap", "lit", "-n", namespace, "--from-literal=a=b").stdout.strip()
        == "configmap/lit created"
    )
    assert (
        k("create", "secret", "generic", "s", "-n", namespace, "--from-literal=p=q").stdout.strip()
        == "secret/s created"
    )
    assert (
        k("create", "deployment", "d", "-n", namespace, "--image=busybox:1.36", "--replicas=2").stdout.strip()
        == "deployment.apps/d created"
    )
    assert json.loads(k("get", "cm", "lit", "-n", namespace, "-o", "json").stdout)["data"] == {"a": "b"}
    assert json.loads(k("get", "secret", "s", "-n", namespace, "-o", "json").stdout)["data"] == {"p": "cQ=="}
    deployment = json.loads(k("get", "deploy", "d", "-n", namespace, "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:1.36"


def test_create_namespace_and_delete_wait(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    assert k("create", "namespace", "newns").stdout.strip() == "namespace/newns created"
    again = k("create", "namespace", "newns", check=False)
    assert 'Error from server (AlreadyExists): namespaces "newns" already exists' in again.stderr
    k("create", "-n", "newns", "-f", "-", input=CONFIGMAP)
    # `delete` waits through a watch-list (sendInitialEvents + the initial-events-end bookmark).
    done = k("delete", "-n", "newns", "cm", "demo", "--wait=true", timeout=30)
    assert done.stdout.strip() == 'configmap "demo" deleted from newns namespace'


def test_paging_with_chunk_size(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    manifest = "\n---\n".join(CONFIGMAP.replace("name: demo", f"name: cm-{i:02d}") for i in range(23))
    shared_apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    names = shared_apiserver.kubectl(
        "get", "cm", "-n", namespace, "--chunk-size=5", "-o", "name", "-v=6"
    ).stdout.split()
    assert [n for n in names if n.startswith("configmap/cm-")] == [f"configmap/cm-{i:02d}" for i in range(23)]


def test_explain(shared_apiserver: testing.ApiServerProcess) -> None:
    out = shared_apiserver.kubectl("explain", "pods.spec.containers").stdout
    assert "FIELD: containers <[]Container>" in out
    assert "image" in out and "FIELDS:" in out


def test_get_watch_streams_changes(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    k = shared_apiserver.kubectl
    k("create", "configmap", "w1", "-n", namespace, "--from-literal=a=1")
    watcher = subprocess.Popen(
        [
            str(testing.tool_path("kubectl")),
            f"--kubeconfig={shared_apiserver.kubeconfig}",
            "get",
            "cm",
            "-n",
            namespace,
            "-w",
            "--output-watch-events",
            "--no-headers",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=shared_apiserver.tool_env(),
    )
    try:
        time.sleep(1.5)
        k("create", "configmap", "w2", "-n", namespace, "--from-literal=a=2")
        k("delete", "configmap", "w1", "-n", namespace)
        time.sleep(1.5)
    finally:
        watcher.terminate()
        out, _ = watcher.communicate(timeout=10)
    events = [tuple(line.split()[:2]) for line in out.splitlines() if line.strip()]
    events = [e for e in events if e[1:] != ("kube-root-ca.crt",)]  # in every namespace, as upstream
    assert events == [("ADDED", "w1"), ("ADDED", "w2"), ("DELETED", "w1")]


CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd], categories: [all]}
  versions:
    - name: v1
      served: true
      storage: true
      subresources:
        status: {}
        scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
      additionalPrinterColumns:
        - {name: Size, type: integer, jsonPath: .spec.size}
        - {name: Color, type: string, jsonPath: .spec.color, priority: 1}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1}
                color: {type: string, default: blue}
                replicas: {type: integer}
            status:
              type: object
              properties:
                replicas: {type: integer}
"""


def test_crd_lifecycle(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    k("apply", "-f", "-", input=CRD)
    k("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s")
    widget = textwrap.dedent("""\
        apiVersion: example.com/v1
        kind: Widget
        metadata: {name: w1}
        spec: {size: 3, replicas: 1}
        """)
    assert k("apply", "-f", "-", input=widget).stdout.strip() == "widget.example.com/w1 created"
    obj = json.loads(k("get", "wd", "w1", "-o", "json").stdout)
    assert obj["spec"]["color"] == "blue"  # defaulted from the schema
    rows = k("get", "widgets").stdout.splitlines()
    assert rows[0].split() == ["NAME", "SIZE"]  # declared columns replace Age, as upstream
    assert k("get", "widgets", "-o", "wide").stdout.splitlines()[0].split() == ["NAME", "SIZE", "COLOR"]
    assert "widget.example.com/w1" in k("get", "all", "-o", "name").stdout
    k("scale", "widget/w1", "--replicas=4")
    assert k("get", "widget", "w1", "-o", "jsonpath={.spec.replicas}").stdout == "4"
    bad = k("apply", "-f", "-", input=widget.replace("size: 3", "size: 0"), check=False)
    assert bad.returncode == 1 and "spec.size" in bad.stderr
    unknown = k("apply", "-f", "-", input=widget.replace("size: 3", "size: 3, shape: round"), check=False)
    assert unknown.returncode == 1 and 'unknown field "spec.shape"' in unknown.stderr
    k("delete", "crd", "widgets.example.com", timeout=30)
    gone = k("get", "widgets", check=False)
    assert gone.returncode == 1 and "the server could not find the requested resource" in gone.stderr
    assert "widgets" not in k("api-resources").stdout


def test_helm_template_applied(apiserver: testing.ApiServerProcess, tmp_path) -> None:
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("replicas: 2\nimage: nginx:1.27\n")
    (chart / "templates" / "all.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: {{ .Release.Name }}-config}
        data: {greeting: hello}
        ---
        apiVersion: v1
        kind: Service
        metadata: {name: {{ .Release.Name }}}
        spec:
          selector: {app: {{ .Release.Name }}}
          ports: [{port: 80, targetPort: 8080}]
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: {{ .Release.Name }}}
        spec:
          replicas: {{ .Values.replicas }}
          selector: {matchLabels: {app: {{ .Release.Name }}}}
          template:
            metadata: {labels: {app: {{ .Release.Name }}}}
            spec:
              containers: [{name: app, image: {{ .Values.image }}}]
        """)
    )
    rendered = subprocess.run(
        [str(testing.tool_path("helm")), "template", "demo", str(chart)],
        capture_output=True,
        text=True,
        check=True,
        env=apiserver.tool_env(),
    ).stdout
    out = apiserver.kubectl("apply", "-n", "default", "-f", "-", input=rendered).stdout
    assert "configmap/demo-config created" in out
    assert "service/demo created" in out
    assert "deployment.apps/demo created" in out
    svc = json.loads(apiserver.kubectl("get", "svc", "demo", "-o", "json").stdout)
    assert svc["spec"]["clusterIP"] and svc["spec"]["ports"][0]["protocol"] == "TCP"


@pytest.mark.parametrize("body", ["{not json", "[]"])
def test_bad_bodies_get_status_errors(
    shared_apiserver: testing.ApiServerProcess, namespace: str, body: str
) -> None:
    result = shared_apiserver.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/configmaps", "-f", "-", input=body, check=False
    )
    assert result.returncode == 1
    assert "Error from server (BadRequest)" in result.stderr


def test_pods_table_and_status_subresource(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    k = shared_apiserver.kubectl
    assert (
        k("run", "p", "-n", namespace, "--image=busybox:1.36", "--restart=Never").stdout.strip()
        == "pod/p created"
    )
    header, row = k("get", "pods", "-n", namespace).stdout.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["p", "0/1", "Pending", "0"]
    wide = k("get", "pods", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[5:] == ["IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    # Status is written only through the status subresource; the main resource ignores it.
    k("patch", "pod", "p", "-n", namespace, "--type=merge", "-p", '{"status":{"phase":"Running"}}')
    assert k("get", "pod", "p", "-n", namespace, "-o", "jsonpath={.status.phase}").stdout == "Pending"
    k(
        "patch",
        "pod",
        "p",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Running"}}',
    )
    assert k("get", "pod", "p", "-n", namespace, "-o", "jsonpath={.status.phase}").stdout == "Running"


def test_namespace_deletion_removes_its_contents(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    k("create", "namespace", "doomed")
    k("create", "-n", "doomed", "-f", "-", input=CONFIGMAP)
    k("create", "-n", "doomed", "-f", "-", input=DEPLOYMENT)
    k(
        "create",
        "-n",
        "doomed",
        "-f",
        "-",
        input=CONFIGMAP.replace("name: demo", "name: held").replace(
            "metadata:\n", "metadata:\n  finalizers: [example.com/hold]\n"
        ),
    )
    k("delete", "namespace", "doomed", "--wait=false")
    assert k("get", "ns", "doomed", "-o", "jsonpath={.status.phase}").stdout == "Terminating"
    refused = k("create", "-n", "doomed", "configmap", "late", check=False)
    assert (
        'configmaps "late" is forbidden: unable to create new content in namespace doomed because it is '
        "being terminated" in refused.stderr
    )
    k("patch", "-n", "doomed", "cm", "held", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    k("wait", "--for=delete", "namespace/doomed", "--timeout=20s")
    k("create", "namespace", "doomed")
    # Only what a new namespace always holds (the root CA publisher's ConfigMap).
    assert k("get", "cm,deploy", "-n", "doomed", "-o", "name").stdout.split() in (
        [], ["configmap/kube-root-ca.crt"])
    assert "configmap/held" not in k("get", "cm", "-n", "doomed", "-o", "name").stdout
