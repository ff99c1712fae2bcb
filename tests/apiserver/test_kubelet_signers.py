"""The kubelet CSR signers (`kube-apiserver-client-kubelet`, `kubelet-serving`) with kubectl and openssl.

A node's client and serving certificates are requested with openssl, approved with `kubectl
certificate approve`, read back with openssl, and the client one is used as a credential.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from pathlib import Path

import yaml

from socialweb_computer import testing


def _request(tmp_path: Path, name: str, subject: str, sans: str = "") -> tuple[Path, bytes]:
    key, csr = tmp_path / f"{name}.key", tmp_path / f"{name}.csr"
    command = [
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
        subject,
    ]
    if sans:
        command += ["-addext", f"subjectAltName={sans}"]
    subprocess.run(command, check=True, capture_output=True)
    return key, csr.read_bytes()


def _submit(server: testing.ApiServerProcess, name: str, pem: bytes, signer: str, usages: list[str]) -> None:
    server.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {"name": name},
                "spec": {"request": base64.b64encode(pem).decode(), "signerName": signer, "usages": usages},
            }
        ),
    )
    server.kubectl("certificate", "approve", name)


def _settled(server: testing.ApiServerProcess, name: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        csr = json.loads(server.kubectl("get", "csr", name, "-o", "json").stdout)
        status = csr.get("status") or {}
        if status.get("certificate") or any(c["type"] == "Failed" for c in status.get("conditions") or []):
            return csr
        assert time.monotonic() < deadline, f"CSR {name} was neither issued nor failed: {status}"
        time.sleep(0.2)


def _issuer(cert: Path) -> str:
    return subprocess.run(
        ["openssl", "x509", "-noout", "-issuer", "-in", str(cert)], check=True, capture_output=True, text=True
    ).stdout


def _failure(csr: dict) -> dict:
    return next(c for c in csr["status"]["conditions"] if c["type"] == "Failed")


def test_kubelet_serving_certificate(shared_apiserver: testing.ApiServerProcess, tmp_path: Path) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    _, pem = _request(
        tmp_path, "serving", f"/O=system:nodes/CN=system:node:{node}", f"DNS:{node},IP:127.0.0.1"
    )
    name = f"serving-{node}"
    _submit(
        shared_apiserver, name, pem, "kubernetes.io/kubelet-serving", ["digital signature", "server auth"]
    )
    csr = _settled(shared_apiserver, name)
    assert "Approved,Issued" in shared_apiserver.kubectl("get", "csr", name).stdout
    cert = tmp_path / "serving.crt"
    cert.write_bytes(base64.b64decode(csr["status"]["certificate"]))
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(cert)], check=True, capture_output=True, text=True
    ).stdout
    assert (
        "TLS Web Server Authentication" in text and f"DNS:{node}" in text and "IP Address:127.0.0.1" in text
    )
    # Signed by the ClientCA, the issuer of the admin's own client certificate.
    assert _issuer(cert) == _issuer(shared_apiserver.cert_file)
    # Without a DNS or IP name, and with an email address, upstream's refusals.
    _, bare = _request(tmp_path, "bare", f"/O=system:nodes/CN=system:node:{node}")
    _submit(
        shared_apiserver,
        f"bare-{node}",
        bare,
        "kubernetes.io/kubelet-serving",
        ["digital signature", "server auth"],
    )
    failed = _failure(_settled(shared_apiserver, f"bare-{node}"))
    assert (failed["reason"], failed["message"]) == (
        "SignerValidationFailure",
        "DNS or IP subjectAltName is required",
    )
    _, mail = _request(tmp_path, "mail", f"/O=system:nodes/CN=system:node:{node}", f"DNS:{node},email:a@b.c")
    _submit(
        shared_apiserver,
        f"mail-{node}",
        mail,
        "kubernetes.io/kubelet-serving",
        ["digital signature", "server auth"],
    )
    assert (
        _failure(_settled(shared_apiserver, f"mail-{node}"))["message"]
        == "Email subjectAltNames are not allowed"
    )


def test_kubelet_client_certificate_is_a_node_credential(
    shared_apiserver: testing.ApiServerProcess, tmp_path: Path
) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    key, pem = _request(tmp_path, "client", f"/O=system:nodes/CN=system:node:{node}")
    name = f"client-{node}"
    _submit(
        shared_apiserver,
        name,
        pem,
        "kubernetes.io/kube-apiserver-client-kubelet",
        ["digital signature", "client auth"],
    )
    csr = _settled(shared_apiserver, name)
    cert = tmp_path / "client.crt"
    cert.write_bytes(base64.b64decode(csr["status"]["certificate"]))
    kubeconfig = tmp_path / "node.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "node",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": shared_apiserver.url,
                            "certificate-authority": str(shared_apiserver.ca_file),
                        },
                    }
                ],
                "users": [
                    {"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}
                ],
                "contexts": [{"name": "node", "context": {"cluster": "c", "user": "node"}}],
            }
        )
    )
    whoami = subprocess.run(
        [str(testing.tool_path("kubectl")), "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"],
        env=shared_apiserver.tool_env(),
        capture_output=True,
        text=True,
    )
    assert whoami.returncode == 0, whoami.stderr
    info = json.loads(whoami.stdout)["status"]["userInfo"]
    assert info["username"] == f"system:node:{node}" and "system:nodes" in info["groups"]


def test_kubelet_client_refusals(shared_apiserver: testing.ApiServerProcess, tmp_path: Path) -> None:
    node = f"node-{uuid.uuid4().hex[:6]}"
    cases = [
        (f"/O=devs/CN=system:node:{node}", "", ["client auth"], "subject organization is not system:nodes"),
        (
            f"/O=system:nodes/CN={node}",
            "",
            ["client auth"],
            "subject common name does not begin with system:node:",
        ),
        (
            f"/O=system:nodes/CN=system:node:{node}",
            f"DNS:{node}",
            ["client auth"],
            "DNS subjectAltNames are not allowed",
        ),
        (
            f"/O=system:nodes/CN=system:node:{node}",
            "",
            ["client auth", "server auth"],
            "usages did not match [client auth digital signature key encipherment]",
        ),
    ]
    for i, (subject, sans, usages, message) in enumerate(cases):
        _, pem = _request(tmp_path, f"bad{i}", subject, sans)
        name = f"bad{i}-{node}"
        _submit(shared_apiserver, name, pem, "kubernetes.io/kube-apiserver-client-kubelet", usages)
        failed = _failure(_settled(shared_apiserver, name))
        assert (failed["reason"], failed["message"]) == ("SignerValidationFailure", message)
