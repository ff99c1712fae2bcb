"""OpenAPI v3 index/documents and Swagger 2.0, checked as data and against the real kubectl.

The end-to-end tests serve only discovery, the OpenAPI documents and two ConfigMap answers from
a small HTTPS stub, so they prove exactly what kubectl needs from openapi.py: `explain` renders
from our components, and `apply` trusts our PATCH operations enough to send
`fieldValidation=Strict` without falling back to /openapi/v2.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web

from socialweb_computer.apiserver import kinds, openapi, schemas
from socialweb_computer.apiserver.kinds import KindInfo
from socialweb_computer.testing import pki

KUBECTL = Path(__file__).resolve().parents[2] / ".tools/bin/kubectl"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _row(
    group: str,
    version: str,
    kind: str,
    plural: str,
    *,
    namespaced: bool = True,
    subresources: tuple[str, ...] = (),
    custom: bool = False,
    schema: dict[str, Any] | None = None,
) -> KindInfo:
    definition = "" if custom else schemas.gvk_index()[(group, version, kind)]
    return KindInfo(
        group=group,
        version=version,
        kind=kind,
        plural=plural,
        singular=kind.lower(),
        namespaced=namespaced,
        subresources=subresources,
        definition=definition,
        custom=custom,
        schema=schema,
    )


POD = _row("", "v1", "Pod", "pods", subresources=("status", "exec", "log", "eviction", "binding"))
CONFIGMAP = _row("", "v1", "ConfigMap", "configmaps")
NAMESPACE = _row("", "v1", "Namespace", "namespaces", namespaced=False, subresources=("status", "finalize"))
DEPLOYMENT = _row("apps", "v1", "Deployment", "deployments", subresources=("status", "scale"))
CRONTAB_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "cronSpec": {"type": "string", "pattern": "^\\S+$"},
                "replicas": {"type": "integer", "nullable": True},
                "template": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "x-kubernetes-preserve-unknown-fields": True,
                },
            },
        },
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}
CRONTAB = _row(
    "stable.example.com",
    "v1",
    "CronTab",
    "crontabs",
    subresources=("status", "scale"),
    custom=True,
    schema=CRONTAB_SCHEMA,
)
ROWS = [POD, CONFIGMAP, NAMESPACE, DEPLOYMENT, CRONTAB]


def _gvk(group: str, version: str, kind: str) -> dict[str, str]:
    return {"group": group, "kind": kind, "version": version}


# --------------------------------------------------------------------------- index


def test_index_lists_each_group_version_with_a_stable_hash() -> None:
    index = openapi.v3_index(ROWS)
    assert sorted(index["paths"]) == ["api/v1", "apis/apps/v1", "apis/stable.example.com/v1"]
    url = index["paths"]["api/v1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/api/v1?hash=")
    digest = url.split("hash=")[1]
    assert len(digest) == 128 and digest == digest.upper()
    assert digest == openapi.v3_hash("v1", ROWS)
    assert openapi.v3_index(list(reversed(ROWS))) == index


def test_hash_changes_when_a_crd_schema_changes() -> None:
    before = openapi.v3_hash("stable.example.com/v1", ROWS)
    changed = _row(
        "stable.example.com",
        "v1",
        "CronTab",
        "crontabs",
        custom=True,
        schema={"type": "object", "properties": {"spec": {"type": "object"}}},
    )
    assert openapi.v3_hash("stable.example.com/v1", [changed]) != before
    assert openapi.v3_hash("stable.example.com/v1", ROWS) == before


# --------------------------------------------------------------------------- built-in documents


def test_builtin_patch_operation_carries_what_kubectl_checks() -> None:
    doc = openapi.v3_document("v1", ROWS)
    assert doc["openapi"] == "3.0.0"
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == _gvk("", "v1", "ConfigMap")
    assert patch["x-kubernetes-action"] == "patch"
    assert patch["operationId"] == "patchCoreV1NamespacedConfigMap"
    names = {(p["name"], p["in"]) for p in patch["parameters"]}
    assert {
        ("fieldValidation", "query"),
        ("fieldManager", "query"),
        ("force", "query"),
        ("dryRun", "query"),
    } <= names
    assert sorted(patch["requestBody"]["content"]) == sorted(openapi.PATCH_MEDIA_BUILTIN)
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]


def test_builtin_collection_item_and_cluster_wide_paths() -> None:
    doc = openapi.v3_document("v1", ROWS)
    paths = doc["paths"]
    assert paths["/api/v1/pods"]["get"]["operationId"] == "listCoreV1PodForAllNamespaces"
    assert paths["/api/v1/pods"]["get"]["x-kubernetes-action"] == "list"
    coll = paths["/api/v1/namespaces/{namespace}/pods"]
    assert {m for m in coll if m != "parameters"} == {"get", "post", "delete"}
    assert coll["delete"]["x-kubernetes-action"] == "deletecollection"
    assert coll["post"]["operationId"] == "createCoreV1NamespacedPod"
    assert [p["name"] for p in coll["parameters"]] == ["namespace", "pretty"]
    item = paths["/api/v1/namespaces/{namespace}/pods/{name}"]
    assert {m for m in item if m != "parameters"} == {"get", "put", "patch", "delete"}
    assert [p["name"] for p in item["parameters"]] == ["name", "namespace", "pretty"]
    assert "/api/v1/namespaces/{name}" in paths and "/api/v1/namespaces/{namespace}/namespaces" not in paths
    assert paths["/api/v1/"]["get"]["operationId"] == "getCoreV1APIResources"


def test_builtin_subresources() -> None:
    paths = openapi.v3_document("v1", ROWS)["paths"]
    status = paths["/api/v1/namespaces/{namespace}/pods/{name}/status"]
    assert status["patch"]["operationId"] == "patchCoreV1NamespacedPodStatus"
    assert status["patch"]["x-kubernetes-group-version-kind"] == _gvk("", "v1", "Pod")
    execs = paths["/api/v1/namespaces/{namespace}/pods/{name}/exec"]
    assert execs["get"]["operationId"] == "connectCoreV1GetNamespacedPodExec"
    assert execs["post"]["x-kubernetes-action"] == "connect"
    assert execs["post"]["x-kubernetes-group-version-kind"] == _gvk("", "v1", "PodExecOptions")
    eviction = paths["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]["post"]
    assert eviction["x-kubernetes-group-version-kind"] == _gvk("policy", "v1", "Eviction")
    assert (
        paths["/api/v1/namespaces/{namespace}/pods/{name}/log"]["get"]["operationId"]
        == "readCoreV1NamespacedPodLog"
    )
    scale = openapi.v3_document("apps/v1", ROWS)["paths"][
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
    ]
    assert scale["get"]["x-kubernetes-group-version-kind"] == _gvk("autoscaling", "v1", "Scale")
    assert scale["patch"]["operationId"] == "patchAppsV1NamespacedDeploymentScale"


def test_components_hold_kinds_and_everything_they_reference() -> None:
    doc = openapi.v3_document("v1", ROWS)
    components = doc["components"]["schemas"]
    pod = components["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [_gvk("", "v1", "Pod")]
    assert pod["type"] == "object"
    assert "enum" not in pod["properties"]["apiVersion"]
    spec = pod["properties"]["spec"]
    assert spec["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}]
    assert spec["description"]
    text = orjson.dumps(doc).decode()
    assert "#/$defs/" not in text and '"null"' not in text
    for ref in {part.split('"')[0] for part in text.split('"$ref":"#/components/schemas/')[1:]}:
        assert ref in components, ref
    assert components["io.k8s.api.core.v1.Container"]["properties"]["image"]["type"] == "string"
    assert "io.k8s.api.core.v1.ConfigMapList" in components
    assert "io.k8s.api.apps.v1.Deployment" not in components


def test_documents_are_cached() -> None:
    # How fast they are built is bench/'s business; here: every document builds, and once built
    # it is served from the cache (the same object), not rebuilt per request.
    rows = [*kinds.BUILTIN_KINDS, CRONTAB] if hasattr(kinds, "BUILTIN_KINDS") else ROWS
    openapi._CACHE.clear()
    index = openapi.v3_index(rows)
    for key in index["paths"]:
        document = openapi.v3_document(key.split("/", 1)[1], rows)
        assert openapi.v3_document(key.split("/", 1)[1], rows) is document
    assert openapi.v2_document(rows) is openapi.v2_document(rows)


# --------------------------------------------------------------------------- CRD documents


def test_crd_document() -> None:
    doc = openapi.v3_document("stable.example.com/v1", ROWS)
    assert doc["info"]["title"] == "Kubernetes CRD Swagger"
    patch = doc["paths"]["/apis/stable.example.com/v1/namespaces/{namespace}/crontabs/{name}"]["patch"]
    assert sorted(patch["requestBody"]["content"]) == sorted(openapi.PATCH_MEDIA_CUSTOM)
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    assert patch["x-kubernetes-group-version-kind"] == _gvk("stable.example.com", "v1", "CronTab")
    assert patch["operationId"] == "patchStableExampleComV1NamespacedCronTab"
    assert any(p["name"] == "fieldValidation" and p["in"] == "query" for p in patch["parameters"])
    assert list(patch["responses"]["200"]["content"]) == ["application/json", "application/yaml"]
    schema = doc["components"]["schemas"]["com.example.stable.v1.CronTab"]
    assert schema["x-kubernetes-group-version-kind"] == [_gvk("stable.example.com", "v1", "CronTab")]
    assert schema["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    ]
    assert schema["properties"]["spec"]["properties"]["cronSpec"]["pattern"] == "^\\S+$"
    template = schema["properties"]["spec"]["properties"]["template"]
    assert set(template["properties"]) == {"apiVersion", "kind", "metadata"}
    listed = doc["components"]["schemas"]["com.example.stable.v1.CronTabList"]
    assert listed["properties"]["items"]["items"] == {
        "$ref": "#/components/schemas/com.example.stable.v1.CronTab"
    }
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in doc["components"]["schemas"]
    scale = doc["paths"]["/apis/stable.example.com/v1/namespaces/{namespace}/crontabs/{name}/scale"]["get"]
    assert scale["x-kubernetes-group-version-kind"] == _gvk("autoscaling", "v1", "Scale")
    assert CRONTAB_SCHEMA["properties"]["spec"]["properties"]["template"] == {
        "type": "object",
        "x-kubernetes-embedded-resource": True,
        "x-kubernetes-preserve-unknown-fields": True,
    }


# --------------------------------------------------------------------------- Swagger 2.0


def test_v2_document_is_swagger_2() -> None:
    doc = openapi.v2_document(ROWS)
    assert doc["swagger"] == "2.0"
    text = orjson.dumps(doc).decode()
    assert "#/components/" not in text and '"oneOf"' not in text and '"requestBody"' not in text
    definitions = doc["definitions"]
    assert definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] == {
        "type": "string",
        "format": "int-or-string",
    }
    assert (
        definitions["io.k8s.api.core.v1.PodSpec"]["properties"]["affinity"]["$ref"]
        == "#/definitions/io.k8s.api.core.v1.Affinity"
    )
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"]
    assert patch["consumes"] == list(openapi.PATCH_MEDIA_BUILTIN)
    body = patch["parameters"][0]
    assert body == {
        "in": "body",
        "name": "body",
        "required": True,
        "schema": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"},
    }
    field_validation = next(p for p in patch["parameters"] if p["name"] == "fieldValidation")
    assert field_validation["in"] == "query" and field_validation["type"] == "string"
    assert patch["responses"]["200"]["schema"] == {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMap"}
    crontab = definitions["com.example.stable.v1.CronTab"]
    assert "pattern" not in crontab["properties"]["spec"]["properties"]["cronSpec"]
    assert "nullable" not in crontab["properties"]["spec"]["properties"]["replicas"]


# --------------------------------------------------------------------------- kubectl, end to end


def _discovery_resource(k: KindInfo, short: tuple[str, ...]) -> dict[str, Any]:
    return {
        "resource": k.plural,
        "responseKind": {"group": k.group, "version": k.version, "kind": k.kind},
        "scope": "Namespaced" if k.namespaced else "Cluster",
        "singularResource": k.singular,
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        "shortNames": list(short),
    }


class Stub:
    """Discovery, OpenAPI and creates of ConfigMaps and CronTabs; every request is recorded."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.rows = [POD, CONFIGMAP, CRONTAB]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        path = request.path
        if path == "/api":
            return self._aggregated([_group("", "v1", [(POD, ("po",)), (CONFIGMAP, ("cm",))])])
        if path == "/apis":
            return self._aggregated([_group(CRONTAB.group, "v1", [(CRONTAB, ("ct",))])])
        if path == "/openapi/v3":
            return web.json_response(openapi.v3_index(self.rows))
        if path.startswith("/openapi/v3/"):
            group_version = path.removeprefix("/openapi/v3/").split("/", 1)[1]
            headers = {"Cache-Control": "public, immutable"} if "hash" in request.query else {}
            return web.Response(
                body=orjson.dumps(openapi.v3_document(group_version, self.rows)),
                content_type="application/json",
                headers=headers,
            )
        if request.method == "GET" and path.endswith("/demo"):
            return _status(404, "NotFound", 'configmaps "demo" not found')
        if request.method == "POST" and path.endswith(("/configmaps", "/crontabs")):
            return web.json_response(await request.json(), status=201)
        return _status(404, "NotFound", "the server could not find the requested resource")

    @staticmethod
    def _aggregated(items: list[dict[str, Any]]) -> web.Response:
        body = {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }
        return web.Response(body=orjson.dumps(body), headers={"Content-Type": AGGREGATED})


def _group(name: str, version: str, resources: list[tuple[KindInfo, tuple[str, ...]]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "versions": [
            {
                "version": version,
                "freshness": "Current",
                "resources": [_discovery_resource(k, s) for k, s in resources],
            }
        ],
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


@pytest.fixture
async def cluster(tmp_path: Path) -> Any:
    assert KUBECTL.exists(), f"pinned kubectl missing at {KUBECTL}"
    credentials = pki.generate(tmp_path / "pki")
    stub = Stub()
    runner = web.AppRunner(stub.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=credentials.server_ssl_context())
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(credentials.kubeconfig(f"https://127.0.0.1:{port}")))
    home = tmp_path / "home"
    home.mkdir()
    yield stub, kubeconfig, home
    await runner.cleanup()


async def _kubectl(kubeconfig: Path, home: Path, *args: str) -> tuple[int, str, str]:
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(kubeconfig)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_kubectl_explain_pod_containers(cluster: Any) -> None:
    stub, kubeconfig, home = cluster
    code, out, err = await _kubectl(kubeconfig, home, "explain", "pods.spec.containers")
    assert code == 0, err
    assert "FIELDS:" in out and "image\t<string>" in out
    assert "<[]Container>" in out
    assert ("GET", "/openapi/v3?timeout=32s") in stub.requests
    assert not any(path.startswith("/openapi/v2") for _, path in stub.requests)


async def test_kubectl_explain_configmap_data(cluster: Any) -> None:
    _, kubeconfig, home = cluster
    code, out, err = await _kubectl(kubeconfig, home, "explain", "configmap.data")
    assert code == 0, err
    assert "<map[string]string>" in out


async def test_kubectl_apply_sends_strict_field_validation(cluster: Any, tmp_path: Path) -> None:
    stub, kubeconfig, home = cluster
    manifest = tmp_path / "cm.yaml"
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: b\n")
    code, out, err = await _kubectl(kubeconfig, home, "apply", "-f", str(manifest))
    assert code == 0, err
    assert "configmap/demo created" in out
    posts = [path for method, path in stub.requests if method == "POST"]
    assert len(posts) == 1 and "fieldValidation=Strict" in posts[0], stub.requests
    assert not any(path.startswith("/openapi/v2") for _, path in stub.requests), stub.requests
    hashed = openapi.v3_index(stub.rows)["paths"]["api/v1"]["serverRelativeURL"]
    assert ("GET", hashed + "&timeout=32s") in stub.requests


async def test_kubectl_explain_and_apply_custom_resource(cluster: Any, tmp_path: Path) -> None:
    stub, kubeconfig, home = cluster
    code, out, err = await _kubectl(kubeconfig, home, "explain", "crontabs.spec")
    assert code == 0, err
    assert "GROUP:      stable.example.com" in out and "cronSpec\t<string>" in out
    manifest = tmp_path / "ct.yaml"
    manifest.write_text(
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: demo\n"
        "spec:\n  cronSpec: '* * * * *'\n"
    )
    code, out, err = await _kubectl(kubeconfig, home, "apply", "-f", str(manifest))
    assert code == 0, err
    assert "crontab.stable.example.com/demo created" in out
    posts = [path for method, path in stub.requests if method == "POST"]
    assert posts == [
        "/apis/stable.example.com/v1/namespaces/default/crontabs?fieldManager=kubectl-client-side-apply"
        "&fieldValidation=Strict"
    ], stub.requests
    assert not any(
        path.startswith(("/openapi/v2", "/apis/apiextensions.k8s.io")) for _, path in stub.requests
    )
