"""Fixtures for the authentication/authorization suites: a server per module, certificates
minted from that server's own ClientCA, kubeconfigs for them, and raw HTTPS calls.

Why here: every auth test needs to act as someone other than system:admin, the way an
operator does (a certificate signed by the cluster's ClientCA, or kubectl --as), and to
see the exact status and Status body. The product's own minting command belongs to a
later issue; `Identity.mint` only signs with the CA key in the server's state directory.
"""

from __future__ import annotations

import datetime
import http.client
import json
import ssl
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from socialweb_computer import testing
from socialweb_computer.auth import kubeconfig, pki

HOUR = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Identity:
    """A client certificate (and kubeconfig) for one server."""

    cert_file: Path
    key_file: Path
    kubeconfig: Path

    def ssl_context(self, ca_file: Path) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def mint(
    server: testing.ApiServerProcess,
    name: str,
    common_name: str,
    organizations: tuple[str, ...] = (),
    *,
    not_before: datetime.timedelta = -HOUR,
    not_after: datetime.timedelta = HOUR,
    usage: x509.ObjectIdentifier | None = ExtendedKeyUsageOID.CLIENT_AUTH,
    ca: pki.KeyPair | None = None,
) -> Identity:
    """A certificate signed by the server's ClientCA (or `ca`), valid from now+not_before to now+not_after."""
    pki_dir = server.state_dir / "pki"
    ca = ca or pki.KeyPair.load(str(pki_dir / "client-ca.crt"), str(pki_dir / "client-ca.key"))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    if common_name:
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + not_before)
        .not_valid_after(now + not_after)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    directory = server.state_dir.parent / "identities"
    directory.mkdir(exist_ok=True)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    identity = Identity(
        directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.kubeconfig"
    )
    identity.cert_file.write_bytes(cert_pem)
    pki.write_private(str(identity.key_file), key_pem)
    kubeconfig.write(
        str(identity.kubeconfig),
        cluster="tenant",
        server=server.url,
        ca_pem=server.ca_file.read_bytes(),
        user=common_name or name,
        cert_pem=cert_pem,
        key_pem=key_pem,
    )
    return identity


def kubectl_as(
    server: testing.ApiServerProcess, identity: Identity, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl with the identity's kubeconfig (never raises on a non-zero exit)."""
    argv = [str(testing.tool_path("kubectl")), f"--kubeconfig={identity.kubeconfig}", *args]
    return subprocess.run(
        argv,
        input=input,
        capture_output=True,
        text=True,
        env=server.tool_env(),
        timeout=60,
        check=False,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


class Client:
    """Raw HTTPS to one server with one certificate (or none), on a kept-alive connection."""

    def __init__(self, server: testing.ApiServerProcess, identity: Identity | str | None = "admin") -> None:
        self.server = server
        if identity == "admin":
            self.context = server.ssl_context()
        elif identity is None:
            self.context = ssl.create_default_context(cafile=str(server.ca_file))
        else:
            assert isinstance(identity, Identity)
            self.context = identity.ssl_context(server.ca_file)
        self._connection: http.client.HTTPSConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or [])
        for attempt in range(2):
            connection = self._connect()
            try:
                connection.putrequest(method, path)
                given = {key.lower() for key, _ in pairs}
                defaults = [] if "content-type" in given else [("Content-Type", "application/json")]
                for key, value in [*defaults, *pairs]:
                    connection.putheader(key, value)
                if data is not None:
                    connection.putheader("Content-Length", str(len(data)))
                connection.endheaders(data)
                response = connection.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def _connect(self) -> http.client.HTTPSConnection:
        if self._connection is None:
            self._connection = http.client.HTTPSConnection(
                "127.0.0.1", self.server.port, context=self.context, timeout=30
            )
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def ssar(
        self,
        attributes: Mapping[str, str],
        *,
        non_resource: bool = False,
        headers: list[tuple[str, str]] | None = None,
    ) -> tuple[int, Any]:
        key = "nonResourceAttributes" if non_resource else "resourceAttributes"
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {key: dict(attributes)},
        }
        return self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body, headers)


def impersonating(user: str, groups: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The headers kubectl sends for --as=user --as-group=g ..."""
    return [("Impersonate-User", user), *(("Impersonate-Group", g) for g in groups)]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testing.ApiServerProcess]:
    """A server of this module's own: auth tests write cluster-wide RBAC objects."""
    try:
        testing.tool_path("kubectl")
    except testing.ToolMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    server = testing.ApiServerProcess.start(tmp_path_factory.mktemp("auth") / "state")
    yield server
    died = server.returncode
    server.stop()
    if died is not None:
        pytest.fail(f"auth apiserver exited with {died}\n{server.logs()}", pytrace=False)


@pytest.fixture
def admin(auth_server: testing.ApiServerProcess) -> Iterator[Client]:
    client = Client(auth_server)
    yield client
    client.close()


class Kit:
    """The helpers above, handed to test modules as a fixture (test files cannot import conftest)."""

    Client = Client
    Identity = Identity
    mint = staticmethod(mint)
    kubectl_as = staticmethod(kubectl_as)
    impersonating = staticmethod(impersonating)


@pytest.fixture(scope="session")
def kit() -> type[Kit]:
    return Kit
