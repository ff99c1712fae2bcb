"""Admission webhooks called for real: a webhook server on loopback TLS (aiohttp, in a thread of
the test process), configured with kubectl, answering the server's AdmissionReviews.

Every configuration is scoped to the test's namespace with a namespaceSelector, so the shared
server's other tests never meet these webhooks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from socialweb_computer import testing
from socialweb_computer.testing import pki


class WebhookServer:
    """Answers /validate (denies objects labelled deny=yes) and /mutate (adds a label)."""

    def __init__(self, directory: Path) -> None:
        self.pki = pki.generate(directory)
        self.reviews: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.pki.serving_ca_file.read_bytes()).decode()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/validate", self._validate)
        app.router.add_post("/mutate", self._mutate)
        app.router.add_post("/broken", self._broken)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.pki.server_cert_file), str(self.pki.server_key_file))
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=context)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    async def _review(self, request: web.Request) -> dict[str, Any]:
        review = orjson.loads(await request.read())
        review["query"] = dict(request.query)
        self.reviews.append(review)
        return review

    async def _broken(self, request: web.Request) -> web.Response:
        await self._review(request)
        return web.Response(body=b"not a review")

    async def _validate(self, request: web.Request) -> web.Response:
        review = await self._review(request)
        obj = review["request"]["object"] or review["request"]["oldObject"]
        denied = (obj["metadata"].get("labels") or {}).get("deny") == "yes"
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": not denied}
        if denied:
            response["status"] = {"code": 403, "message": "objects labelled deny=yes are not allowed here"}
        return web.json_response(
            {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
        )

    async def _mutate(self, request: web.Request) -> web.Response:
        review = await self._review(request)
        patch = [{"op": "add", "path": "/metadata/labels/mutated", "value": "by-webhook"}]
        if not (review["request"]["object"]["metadata"].get("labels")):
            patch = [{"op": "add", "path": "/metadata/labels", "value": {"mutated": "by-webhook"}}]
        return web.json_response(
            {
                "apiVersion": review["apiVersion"],
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[WebhookServer]:
    server = WebhookServer(tmp_path / "webhook-pki")
    server.start()
    yield server
    server.stop()


def _configuration(kind: str, name: str, namespace: str, url: str, ca_bundle: str, **hook: Any) -> dict:
    webhook = {
        "name": f"{name}.example.com",
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [
            {
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["configmaps"],
            }
        ],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        **hook,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [webhook],
    }


@pytest.fixture
def configure(shared_apiserver: testing.ApiServerProcess) -> Iterator[Any]:
    created: list[tuple[str, str]] = []

    def apply(configuration: dict) -> None:
        shared_apiserver.kubectl("apply", "-f", "-", input=json.dumps(configuration))
        created.append((configuration["kind"].lower(), configuration["metadata"]["name"]))

    yield apply
    for kind, name in created:
        shared_apiserver.kubectl("delete", kind, name, "--ignore-not-found")


def _configmap(namespace: str, name: str, labels: dict[str, str] | None = None) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "data": {"k": "v"},
        }
    )


def test_a_validating_webhook_denies_and_allows(
    shared_apiserver: testing.ApiServerProcess, namespace: str, webhook_server: WebhookServer, configure: Any
) -> None:
    name = f"deny-{uuid.uuid4().hex[:6]}"
    configure(
        _configuration(
            "ValidatingWebhookConfiguration",
            name,
            namespace,
            webhook_server.url("/validate"),
            webhook_server.ca_bundle,
        )
    )
    k = shared_apiserver.kubectl
    refused = k("apply", "-f", "-", input=_configmap(namespace, "bad", {"deny": "yes"}), check=False)
    assert refused.returncode == 1
    assert (
        f'admission webhook "{name}.example.com" denied the request: objects labelled deny=yes are not '
        "allowed here"
    ) in refused.stderr
    assert k("get", "configmap", "bad", "-n", namespace, check=False).returncode == 1
    k("apply", "-f", "-", input=_configmap(namespace, "good"))
    review = webhook_server.reviews[-1]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["query"] == {"timeout": "5s"}
    request = review["request"]
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", namespace, "good")
    assert request["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    assert request["userInfo"]["username"] == "system:admin" and request["dryRun"] is False
    assert request["object"]["data"] == {"k": "v"} and request["oldObject"] is None
    assert request["options"] == {
        "kind": "CreateOptions",
        "apiVersion": "meta.k8s.io/v1",
        "fieldManager": "kubectl-client-side-apply",
    }
    # An update that adds the label is refused too; a delete is reviewed with the old object.
    relabel = k("label", "configmap", "good", "-n", namespace, "deny=yes", check=False)
    assert relabel.returncode == 1 and "denied the request" in relabel.stderr
    k("delete", "configmap", "good", "-n", namespace)
    assert webhook_server.reviews[-1]["request"]["operation"] == "DELETE"
    assert webhook_server.reviews[-1]["request"]["oldObject"]["metadata"]["name"] == "good"


def test_a_mutating_webhook_patches_the_object(
    shared_apiserver: testing.ApiServerProcess, namespace: str, webhook_server: WebhookServer, configure: Any
) -> None:
    name = f"label-{uuid.uuid4().hex[:6]}"
    configure(
        _configuration(
            "MutatingWebhookConfiguration",
            name,
            namespace,
            webhook_server.url("/mutate"),
            webhook_server.ca_bundle,
            rules=[
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["configmaps"],
                }
            ],
        )
    )
    k = shared_apiserver.kubectl
    k("create", "configmap", "plain", "-n", namespace, "--from-literal=a=b")
    labels = json.loads(k("get", "configmap", "plain", "-n", namespace, "-o", "json").stdout)["metadata"][
        "labels"
    ]
    assert labels == {"mutated": "by-webhook"}
    # Other namespaces are not selected.
    other = f"other-{uuid.uuid4().hex[:6]}"
    k("create", "namespace", other)
    try:
        k("create", "configmap", "plain", "-n", other, "--from-literal=a=b")
        obj = json.loads(k("get", "configmap", "plain", "-n", other, "-o", "json").stdout)
        assert not obj["metadata"].get("labels")
    finally:
        k("delete", "namespace", other, "--wait=false")


def test_failure_policy_and_dry_run(
    shared_apiserver: testing.ApiServerProcess, namespace: str, webhook_server: WebhookServer, configure: Any
) -> None:
    k = shared_apiserver.kubectl
    name = f"broken-{uuid.uuid4().hex[:6]}"
    configure(
        _configuration(
            "ValidatingWebhookConfiguration",
            name,
            namespace,
            webhook_server.url("/broken"),
            webhook_server.ca_bundle,
            failurePolicy="Ignore",
        )
    )
    k("apply", "-f", "-", input=_configmap(namespace, "ignored"))  # Ignore: the broken webhook is skipped
    configure(
        _configuration(
            "ValidatingWebhookConfiguration",
            name,
            namespace,
            webhook_server.url("/broken"),
            webhook_server.ca_bundle,
            failurePolicy="Fail",
        )
    )
    failed = k("apply", "-f", "-", input=_configmap(namespace, "failed"), check=False)
    assert failed.returncode == 1
    assert (
        f'Internal error occurred: failed calling webhook "{name}.example.com": received invalid webhook '
        "response" in failed.stderr
    )
    # TLS is verified: the same server with another CA is a failed call.
    other_ca = base64.b64encode(
        pki.generate(Path(webhook_server.pki.serving_ca_file).parent / "other").serving_ca_file.read_bytes()
    ).decode()
    configure(
        _configuration(
            "ValidatingWebhookConfiguration", name, namespace, webhook_server.url("/validate"), other_ca
        )
    )
    untrusted = k("apply", "-f", "-", input=_configmap(namespace, "untrusted"), check=False)
    assert untrusted.returncode == 1 and "certificate verify failed" in untrusted.stderr
    # A dry run is reviewed as one (v1 webhooks all declare they have no side effects).
    configure(
        _configuration(
            "ValidatingWebhookConfiguration",
            name,
            namespace,
            webhook_server.url("/validate"),
            webhook_server.ca_bundle,
        )
    )
    k("apply", "--dry-run=server", "-f", "-", input=_configmap(namespace, "dry"))
    assert webhook_server.reviews[-1]["request"]["dryRun"] is True
    assert k("get", "configmap", "dry", "-n", namespace, check=False).returncode == 1


def test_a_write_a_webhook_refuses_is_never_charged_to_a_quota(
    shared_apiserver: testing.ApiServerProcess, namespace: str, webhook_server: WebhookServer, configure: Any
) -> None:
    """ValidatingAdmissionWebhook sits just before ResourceQuota, as upstream orders them."""
    k = shared_apiserver.kubectl
    # kube-root-ca.crt is one of the namespace's ConfigMaps already.
    k("create", "quota", "cms", "-n", namespace, "--hard=configmaps=3")
    name = f"deny-{uuid.uuid4().hex[:6]}"
    configure(
        _configuration(
            "ValidatingWebhookConfiguration", name, namespace, webhook_server.url("/validate"),
            webhook_server.ca_bundle,
        )
    )

    def used() -> str:
        return k("get", "quota", "cms", "-n", namespace, "-o", "jsonpath={.status.used.configmaps}").stdout

    deadline = time.monotonic() + 30
    while used() != "1":
        assert time.monotonic() < deadline, used()
        time.sleep(0.1)
    k("apply", "-f", "-", input=_configmap(namespace, "good"))
    assert used() == "2"
    for attempt in range(3):
        bad = _configmap(namespace, f"bad-{attempt}", {"deny": "yes"})
        refused = k("apply", "-f", "-", input=bad, check=False)
        assert "denied the request" in refused.stderr
        assert used() == "2"
    k("apply", "-f", "-", input=_configmap(namespace, "last"))
    over = k("apply", "-f", "-", input=_configmap(namespace, "over"), check=False)
    assert (
        'configmaps "over" is forbidden: exceeded quota: cms, requested: configmaps=1, used: configmaps=3, '
        "limited: configmaps=3"
    ) in over.stderr
