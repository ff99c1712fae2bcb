"""Throwaway certificates for test and benchmark servers that speak mTLS on loopback.

The project's own PKI lives in `socialweb_computer.auth.pki`; this module is deliberately
independent of it so that stand-in servers (the fake apiserver that proves the process helper,
the bench baseline echo server) do not share code, or bugs, with the thing they stand in for.
Called by tests/testing/ and bench/common.py.

Layout mirrors a real cluster: a serving CA signs the server certificate (SAN 127.0.0.1 and
localhost), a separate client CA signs the client certificate.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class LocalPki:
    """PEM files of one throwaway PKI (keys are written 0600)."""

    serving_ca_file: Path
    client_ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path

    def server_ssl_context(self) -> ssl.SSLContext:
        """A server context that requires a client certificate signed by the client CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(str(self.server_cert_file), str(self.server_key_file))
        return context

    def client_ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server and presents the client certificate."""
        context = ssl.create_default_context(cafile=str(self.serving_ca_file))
        context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context

    def kubeconfig(self, server_url: str, *, name: str = "test") -> dict[str, object]:
        """A kubeconfig (as a dict) with the credentials embedded, as the real server writes it."""

        def data(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {
                "server": server_url, "certificate-authority-data": data(self.serving_ca_file)}}],
            "users": [{"name": name, "user": {
                "client-certificate-data": data(self.client_cert_file),
                "client-key-data": data(self.client_key_file)}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }


def generate(directory: Path, *, client_name: str = "admin", client_groups: tuple[str, ...] = (
        "system:masters",)) -> LocalPki:
    """Create a fresh PKI in `directory` (created if needed) and return its file paths."""
    directory.mkdir(parents=True, exist_ok=True)
    serving_ca = _self_signed_ca("test-serving-ca")
    client_ca = _self_signed_ca("test-client-ca")
    server = _leaf(serving_ca, _name("127.0.0.1"), ExtendedKeyUsageOID.SERVER_AUTH, sans=[
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client = _leaf(client_ca, _name(client_name, client_groups), ExtendedKeyUsageOID.CLIENT_AUTH, sans=[])
    paths = LocalPki(
        serving_ca_file=directory / "serving-ca.pem",
        client_ca_file=directory / "client-ca.pem",
        server_cert_file=directory / "server.pem",
        server_key_file=directory / "server-key.pem",
        client_cert_file=directory / "client.pem",
        client_key_file=directory / "client-key.pem",
    )
    _write(paths.serving_ca_file, _cert_pem(serving_ca[0]))
    _write(paths.client_ca_file, _cert_pem(client_ca[0]))
    _write(paths.server_cert_file, _cert_pem(server[0]))
    _write(paths.server_key_file, _key_pem(server[1]), private=True)
    _write(paths.client_cert_file, _cert_pem(client[0]))
    _write(paths.client_key_file, _key_pem(client[1]), private=True)
    return paths


_Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name,
             key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY))


def _self_signed_ca(common_name: str) -> _Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (_builder(name, name, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(issuer: _Issued, subject: x509.Name, usage: x509.ObjectIdentifier,
          sans: list[x509.GeneralName]) -> _Issued:
    issuer_cert, issuer_key = issuer
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(subject, issuer_cert.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    # Keys are 0600 from creation on, so there is no window where they are world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
