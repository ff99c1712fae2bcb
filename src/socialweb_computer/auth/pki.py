"""Certificate authorities and certificates for the loopback listeners.

Each logical cluster has a serving CA (what its listener presents) and a ClientCA
(what signs the client certificates it accepts). Keys are ECDSA P-256 and are written
with mode 0600 from the moment the file exists (never chmod-after-write).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def save(self, cert_path: str, key_path: str, *, sync: bool = True) -> None:
        write_private(key_path, self.key_pem, sync=sync)
        write_public(cert_path, self.cert_pem, sync=sync)

    @classmethod
    def load(cls, cert_path: str, key_path: str) -> KeyPair:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: expected an ECDSA private key")
        return cls(cert, key)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def new_ca(common_name: str, *, validity: datetime.timedelta = CA_VALIDITY) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def _leaf(
    ca: KeyPair,
    subject: x509.Name,
    usage: ExtendedKeyUsageOID,
    *,
    validity: datetime.timedelta,
    sans: list[x509.GeneralName] | None = None,
) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + validity, ca.cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def new_serving_cert(
    ca: KeyPair,
    *,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1"),
    validity: datetime.timedelta = LEAF_VALIDITY,
) -> KeyPair:
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return _leaf(
        ca,
        _name("socialweb-computer-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        validity=validity,
        sans=sans,
    )


def new_client_cert(
    ca: KeyPair,
    common_name: str,
    organizations: tuple[str, ...] = (),
    *,
    validity: datetime.timedelta = LEAF_VALIDITY,
) -> KeyPair:
    return _leaf(ca, _name(common_name, organizations), ExtendedKeyUsageOID.CLIENT_AUTH, validity=validity)


def write_private(path: str, data: bytes, *, sync: bool = True) -> None:
    """Write secret material at 0600 without a window where it is readable by others.

    `sync=False` leaves the fsync to a caller that syncs a whole directory of new files at once.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_public(path: str, data: bytes, *, sync: bool = True) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


# certificates.k8s.io usages → the X.509 extensions a signed certificate carries.
_KEY_USAGES = {"digital signature": "digital_signature", "key encipherment": "key_encipherment",
               "content commitment": "content_commitment", "data encipherment": "data_encipherment",
               "key agreement": "key_agreement", "cert sign": "key_cert_sign", "crl sign": "crl_sign"}
_EXT_USAGES = {"client auth": ExtendedKeyUsageOID.CLIENT_AUTH, "server auth": ExtendedKeyUsageOID.SERVER_AUTH,
               "code signing": ExtendedKeyUsageOID.CODE_SIGNING,
               "email protection": ExtendedKeyUsageOID.EMAIL_PROTECTION,
               "timestamping": ExtendedKeyUsageOID.TIME_STAMPING,
               "ocsp signing": ExtendedKeyUsageOID.OCSP_SIGNING}
# kube-controller-manager's --cluster-signing-duration default.
SIGNING_DURATION = datetime.timedelta(hours=8760)


def sign_request(ca: KeyPair, request: x509.CertificateSigningRequest, usages: list[str], *,
                 duration: datetime.timedelta = SIGNING_DURATION) -> bytes:
    """Sign a CSR as kube-controller-manager's local signer does: the request's subject and SANs,
    the usages asked for, backdated 5 minutes, never past the CA's own expiry. Returns PEM."""
    now = _now()
    flags = {name: False for name in (*_KEY_USAGES.values(), "encipher_only", "decipher_only")}
    for usage in usages:
        if usage in _KEY_USAGES:
            flags[_KEY_USAGES[usage]] = True
    builder = (
        x509.CertificateBuilder()
        .subject_name(request.subject)
        .issuer_name(ca.cert.subject)
        .public_key(request.public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + duration, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    if any(flags.values()):  # Go's x509 writes no KeyUsage extension when no bit is set
        builder = builder.add_extension(x509.KeyUsage(**flags), critical=True)
    extended = [_EXT_USAGES[u] for u in usages if u in _EXT_USAGES]
    if extended:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended), critical=False)
    try:
        sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        builder = builder.add_extension(sans, critical=False)
    except x509.ExtensionNotFound:
        pass
    return builder.sign(ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


class FileSigner:
    """Signs with a CA kept on disk (a cluster's ClientCA), read at each signature so a rotated CA
    is used at once. What `controllers.certificates` calls."""

    def __init__(self, cert_path: str, key_path: str) -> None:
        self.cert_path, self.key_path = cert_path, key_path

    def sign(self, request: x509.CertificateSigningRequest, usages: list[str], *,
             duration: datetime.timedelta = SIGNING_DURATION) -> bytes:
        return sign_request(KeyPair.load(self.cert_path, self.key_path), request, usages, duration=duration)

    def ca_pem(self) -> bytes:
        with open(self.cert_path, "rb") as f:
            return f.read()
