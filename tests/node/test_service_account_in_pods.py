"""A pod's own identity on a real node: ServiceAccount admission adds `kube-api-access-*`
exactly as upstream does, and the agent fills it (a token bound to this pod and its node,
through TokenRequest; the cluster's CA; the namespace), read-only; a pod that opts out gets
nothing. The official Python client using that volume through `kubernetes.default.svc` is
tests/node/test_networking.py (testing/networking.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _pod(name: str, image: str, script: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": image, "command": script}],
            **spec,
        },
    }


def _claims(token_payload: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(token_payload + "=" * (-len(token_payload) % 4)))


def test_the_mounted_token_ca_and_namespace_are_the_pods(tenant, ns, image) -> None:
    script = (
        f"cat {SA_DIR}/namespace; echo; cut -d. -f2 {SA_DIR}/token; "
        f"touch {SA_DIR}/x 2>/dev/null && echo writable || echo read-only; cat {SA_DIR}/ca.crt"
    )
    tenant.apply(json.dumps(_pod("files", image, ["sh", "-c", script])), ns)
    tenant.apply(json.dumps(_pod(
        "opted-out", image, ["sh", "-c", f"test -e {SA_DIR} && echo present || echo absent"],
        automountServiceAccountToken=False,
    )), ns)
    done = tenant.wait_phase("files", ns, ("Succeeded", "Failed"), timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]

    # What ServiceAccount admission put in the spec, as upstream does.
    assert done["spec"]["serviceAccountName"] == "default"
    volume = next(v for v in done["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    assert len(volume["name"]) == len("kube-api-access-") + 5
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
    assert sources[1]["configMap"] == {
        "name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]
    }
    assert sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.namespace"
    mount = done["spec"]["containers"][0]["volumeMounts"][0]
    assert mount == {"name": volume["name"], "mountPath": SA_DIR, "readOnly": True}

    # What the agent wrote there: the namespace, a token bound to this pod, the cluster's CA.
    lines = tenant.kubectl("logs", "files", "-n", ns).stdout.splitlines()
    assert lines[0] == ns
    claims = _claims(lines[1])
    assert claims["sub"] == f"system:serviceaccount:{ns}:default"
    bound = claims["kubernetes.io"]
    assert bound["namespace"] == ns
    assert bound["pod"] == {"name": "files", "uid": done["metadata"]["uid"]}
    assert bound["node"]["name"] == done["spec"]["nodeName"]
    # 3607 s asked for: kube-apiserver's extended lifetime (a year), warning after 3607 s.
    assert bound["warnafter"] - claims["iat"] == 3607
    assert claims["exp"] - claims["iat"] == 365 * 24 * 3600
    assert lines[2] == "read-only"
    root_ca = tenant.get("configmap", "kube-root-ca.crt", ns)["data"]["ca.crt"]
    assert "\n".join(lines[3:]).strip() == root_ca.strip()

    opted_out = tenant.wait_phase("opted-out", ns, ("Succeeded", "Failed"), timeout=120)
    assert not any(v["name"].startswith("kube-api-access-") for v in opted_out["spec"].get("volumes", []))
    assert tenant.kubectl("logs", "opted-out", "-n", ns).stdout == "absent\n"
