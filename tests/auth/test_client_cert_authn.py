"""Client-certificate authentication: who a certificate names, which certificates a cluster
refuses (401 with a Status, never a dead handshake, never a silent anonymous request), what
an anonymous client may read, and that one cluster's ClientCA means nothing to another.
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
from pathlib import Path
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from socialweb_computer import testing
from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn, identity, pki
from socialweb_computer.storage import memory

UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
HOUR = datetime.timedelta(hours=1)


def test_refused_certificates_get_401_with_a_status(auth_server: testing.ApiServerProcess, kit: Any) -> None:
    foreign_ca = pki.new_ca("someone else's client CA")
    # A CA with the very name of the cluster's ClientCA: OpenSSL finds "it" and checks the
    # signature, which fails; that left errors behind that once dropped the connection silently.
    real = pki.KeyPair.load(str(auth_server.state_dir / "pki" / "client-ca.crt"),
                            str(auth_server.state_dir / "pki" / "client-ca.key"))
    look_alike = pki.new_ca(real.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
    assert look_alike.cert.subject == real.cert.subject
    refused = {
        "another CA": kit.mint(auth_server, "foreign", "system:admin", ("system:masters",), ca=foreign_ca),
        "a look-alike CA": kit.mint(auth_server, "look-alike", "system:admin", ("system:masters",),
                                    ca=look_alike),
        "expired": kit.mint(auth_server, "expired", "bob", not_before=-2 * HOUR, not_after=-HOUR),
        "not yet valid": kit.mint(auth_server, "future", "bob", not_before=HOUR, not_after=2 * HOUR),
        "serverAuth only": kit.mint(
            auth_server, "server-usage", "bob", usage=ExtendedKeyUsageOID.SERVER_AUTH
        ),
    }
    for why, who in refused.items():
        client = kit.Client(auth_server, who)
        try:
            for method, path in (("GET", "/version"), ("GET", "/api/v1/namespaces"), ("POST", WHOAMI)):
                status, body = client.request(method, path, REVIEW if method == "POST" else None)
                assert (status, body) == (401, UNAUTHORIZED), (why, path)
        finally:
            client.close()
    log = auth_server.stderr_path.read_text()
    assert "x509: certificate signed by unknown authority" in log
    assert "x509: certificate specifies an incompatible key usage" in log
    assert "x509: certificate has expired or is not yet valid" in log


def test_kubectl_with_a_foreign_certificate_is_told_unauthorized(
    auth_server: testing.ApiServerProcess, kit: Any
) -> None:
    foreign = kit.mint(
        auth_server, "foreign-kubectl", "system:admin", ("system:masters",), ca=pki.new_ca("x")
    )
    out = kit.kubectl_as(auth_server, foreign, "get", "namespaces")
    assert out.returncode == 1
    assert out.stderr.strip().endswith(
        "error: You must be logged in to the server (the server has asked for the client to provide "
        "credentials)"
    )


def test_certificate_names_user_groups_uid_and_credential(
    auth_server: testing.ApiServerProcess, kit: Any
) -> None:
    runner = kit.mint(auth_server, "whoami", "gitlab-runner", ("gitlab-runner", "ci"))
    client = kit.Client(auth_server, runner)
    try:
        status, body = client.request("POST", WHOAMI, REVIEW)
    finally:
        client.close()
    digest = hashlib.sha256(
        x509.load_pem_x509_certificate(runner.cert_file.read_bytes()).public_bytes(serialization.Encoding.DER)
    ).hexdigest()
    assert status == 201
    assert body["status"] == {
        "userInfo": {
            "username": "gitlab-runner",
            "groups": ["gitlab-runner", "ci", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/credential-id": [f"X509SHA256={digest}"]},
        }
    }
    table = kit.kubectl_as(auth_server, runner, "auth", "whoami").stdout.splitlines()
    assert table[:3] == [
        "ATTRIBUTE                                           VALUE",
        "Username                                            gitlab-runner",
        "Groups                                              [gitlab-runner ci system:authenticated]",
    ]


def test_a_certificate_without_client_usage_list_is_valid_for_any_usage(
    auth_server: testing.ApiServerProcess, kit: Any
) -> None:
    """Go's verifier treats a certificate without ExtendedKeyUsage as valid for every usage."""
    plain = kit.mint(auth_server, "no-eku", "carol", usage=None)
    client = kit.Client(auth_server, plain)
    try:
        status, body = client.request("POST", WHOAMI, REVIEW)
    finally:
        client.close()
    assert status == 201 and body["status"]["userInfo"]["username"] == "carol"


def test_a_certificate_without_common_name_is_anonymous(
    auth_server: testing.ApiServerProcess, kit: Any
) -> None:
    nameless = kit.mint(auth_server, "nameless", "", ("system:masters",))
    client = kit.Client(auth_server, nameless)
    try:
        status, body = client.request("GET", "/api/v1/namespaces")
    finally:
        client.close()
    assert (status, body["message"]) == (
        403,
        'namespaces is forbidden: User "system:anonymous" cannot list '
        'resource "namespaces" in API group "" at the cluster scope',
    )


def test_anonymous_reads_health_and_version_only(auth_server: testing.ApiServerProcess, kit: Any) -> None:
    client = kit.Client(auth_server, None)
    try:
        for path in ("/version", "/healthz", "/livez", "/readyz"):
            status, _ = client.request("GET", path)
            assert status == 200, path
        for path in ("/api", "/apis", "/openapi/v2", "/healthz/ping", "/"):
            status, body = client.request("GET", path)
            assert (status, body) == (
                403,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": f'forbidden: User "system:anonymous" cannot get path "{path}"',
                    "reason": "Forbidden",
                    "details": {},
                    "code": 403,
                },
            ), path
        status, body = client.request("GET", "/api/v1/namespaces/default/pods")
        assert (status, body["message"], body["details"]) == (
            403,
            (
                'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" '
                'in the namespace "default"'
            ),
            {"kind": "pods"},
        )
        status, body = client.request("POST", WHOAMI, REVIEW)
        assert status == 403 and body["details"] == {
            "group": "authentication.k8s.io",
            "kind": "selfsubjectreviews",
        }
    finally:
        client.close()


def test_the_listener_hands_certificate_checks_to_the_app(tmp_path: Path) -> None:
    serving_ca, client_ca = pki.new_ca("s"), pki.new_ca("c")
    serving_ca.save(str(tmp_path / "sca.crt"), str(tmp_path / "sca.key"))
    client_ca.save(str(tmp_path / "cca.crt"), str(tmp_path / "cca.key"))
    pki.new_serving_cert(serving_ca).save(str(tmp_path / "s.crt"), str(tmp_path / "s.key"))
    context = authn.server_ssl_context(
        str(tmp_path / "s.crt"), str(tmp_path / "s.key"), str(tmp_path / "cca.crt")
    )
    assert authn.app_verifies(context)
    assert context.verify_mode == ssl.CERT_OPTIONAL


def test_authenticator_refuses_two_uids_and_reads_one(tmp_path: Path) -> None:
    ca = pki.new_ca("c")
    checker = authn.ClientCertAuthenticator([ca.cert])
    good = pki.new_client_cert(ca, "alice", ("devs",))
    user = checker.authenticate(good.cert.public_bytes(serialization.Encoding.DER))
    assert (user.name, user.groups) == ("alice", ("devs", identity.AUTHENTICATED))
    assert checker.authenticate(None) == identity.ANONYMOUS_USER
    for uids, expected in ((("u-1",), "u-1"), (("u-1", "u-2"), None)):
        subject = x509.Name(
            [x509.NameAttribute(identity.UID_OID, u) for u in uids]
            + [x509.NameAttribute(x509.NameOID.COMMON_NAME, "alice")]
        )
        cert = _sign(ca, subject)
        if expected is None:
            try:
                checker.authenticate(cert)
            except authn.Unauthenticated as e:
                assert "expected 1 UID, but found multiple" in str(e)
            else:
                raise AssertionError("two UIDs must not authenticate")
        else:
            assert checker.authenticate(cert).uid == expected


def _sign(ca: pki.KeyPair, subject: x509.Name) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - HOUR)
        .not_valid_after(now + HOUR)
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


# ---------------------------------------------------------------- two clusters, one process


class _Tenant:
    """One logical cluster with its own serving CA, ClientCA and loopback listener."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory
        directory.mkdir()
        self.serving_ca, self.client_ca = pki.new_ca(f"{name} serving CA"), pki.new_ca(f"{name} client CA")
        self.serving_ca.save(str(directory / "serving-ca.crt"), str(directory / "serving-ca.key"))
        self.client_ca.save(str(directory / "client-ca.crt"), str(directory / "client-ca.key"))
        pki.new_serving_cert(self.serving_ca).save(
            str(directory / "serving.crt"), str(directory / "serving.key")
        )

    async def serve(self, backend: Any) -> None:
        self.cluster = LogicalCluster(self.name, backend)
        await self.cluster.start()
        d = self.directory
        context = app_mod.server_ssl_context(
            str(d / "serving.crt"), str(d / "serving.key"), str(d / "client-ca.crt")
        )
        checker = authn.ClientCertAuthenticator.from_pem_file(str(d / "client-ca.crt"))
        self.runner, self.port = await app_mod.serve(
            app_mod.build_app(self.cluster, authenticator=checker),
            host="127.0.0.1",
            port=0,
            ssl_context=context,
        )

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.cluster.close()

    def client_context(self, credential: pki.KeyPair) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.directory / "serving-ca.crt"))
        (self.directory / "c.crt").write_bytes(credential.cert_pem)
        pki.write_private(str(self.directory / "c.key"), credential.key_pem)
        context.load_cert_chain(str(self.directory / "c.crt"), str(self.directory / "c.key"))
        return context


async def _whoami(tenant: _Tenant, credential: pki.KeyPair) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{tenant.port}{WHOAMI}", json=REVIEW, ssl=tenant.client_context(credential)
        ) as r,
    ):
        return r.status, await r.json()


async def test_a_certificate_from_one_clusters_client_ca_is_refused_by_another(tmp_path: Path) -> None:
    backend = await memory.MemoryBackend.open()
    tenants = [_Tenant("ci", tmp_path / "ci"), _Tenant("prod", tmp_path / "prod")]
    try:
        for tenant in tenants:
            await tenant.serve(backend)
        ci, prod = tenants
        runner = pki.new_client_cert(ci.client_ca, "gitlab-runner", ("gitlab-runner",))
        admin_of_ci = pki.new_client_cert(ci.client_ca, "system:admin", ("system:masters",))
        status, body = await _whoami(ci, runner)
        assert status == 201 and body["status"]["userInfo"]["username"] == "gitlab-runner"
        for credential in (runner, admin_of_ci):
            assert await _whoami(prod, credential) == (401, UNAUTHORIZED)
        status, _ = await _whoami(
            prod, pki.new_client_cert(prod.client_ca, "gitlab-runner", ("gitlab-runner",))
        )
        assert status == 201
    finally:
        for tenant in tenants:
            if hasattr(tenant, "runner"):
                await tenant.close()
        await backend.close()
