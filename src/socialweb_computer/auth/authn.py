"""Client-certificate authentication, with the 401 a real cluster gives for a bad certificate.

kube-apiserver asks every client for a certificate but lets the TLS handshake finish
whatever is presented; its x509 authenticator then verifies the chain against the
ClientCA and answers 401 Unauthorized (a `Status`) when it fails. Python's `ssl` has no
verify callback, so a context that requests certificates and verifies them would kill
the handshake instead (kubectl then prints a TLS alert, not "Unauthorized").

`server_ssl_context()` therefore installs, through ctypes on the context's own
`SSL_CTX`, an OpenSSL verify callback that lets the handshake finish, and
`ClientCertAuthenticator` verifies the peer certificate in the application with
`cryptography`: signed by this listener's ClientCA, inside its validity window (and the
CA's), usable for clientAuth. A failure is a 401, never a silent anonymous request.
If the callback cannot be installed safely (the pointer check fails), the context stays
in OpenSSL's strict mode: bad certificates then fail the handshake, which is refusal
too, only worded differently.

Called by `cli/apiserver.py` (the context) and `apiserver/app.py` (the middleware).
"""

from __future__ import annotations

import _ssl
import ctypes
import datetime
import logging
import ssl
import threading
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID

from socialweb_computer.auth import identity

log = logging.getLogger(__name__)

_SSL_VERIFY_PEER = 1
_VERIFY_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


@_VERIFY_CALLBACK
def _finish_handshake(preverify_ok: int, store_ctx: int) -> int:
    # Verification happens in ClientCertAuthenticator, where a failure can become a 401. A
    # failed check leaves OpenSSL's reasons (a signature that does not verify: "[ASN1] EVP
    # lib") on the thread's error queue, where the connection's next read finds them and
    # fails: the look-alike-CA certificate was dropped without its 401. Clear them.
    if not preverify_ok:
        _LibSsl.get().ERR_clear_error()
    return 1


class _LibSsl:
    """The libssl that CPython's `_ssl` module is linked against (never a second copy)."""

    _lock = threading.Lock()
    _lib: ctypes.CDLL | None = None

    @classmethod
    def get(cls) -> ctypes.CDLL:
        with cls._lock:
            if cls._lib is None:
                lib = ctypes.CDLL(_ssl.__file__)  # symbol lookup falls through to its libssl
                lib.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VERIFY_CALLBACK]
                lib.SSL_CTX_set_verify.restype = None
                lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
                lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
                lib.ERR_clear_error.argtypes = []
                lib.ERR_clear_error.restype = None
                cls._lib = lib
            return cls._lib


def _ssl_ctx_pointer(context: ssl.SSLContext, lib: ctypes.CDLL) -> int | None:
    """The `SSL_CTX *` inside a CPython SSLContext, or None unless it is proven to be one.

    CPython's PySSLContext starts with the object header followed by the SSL_CTX pointer.
    The guess is accepted only if OpenSSL reports back the verify modes Python sets on it.
    """
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer:
        return None
    observed = []
    for mode in (ssl.CERT_REQUIRED, ssl.CERT_OPTIONAL):
        context.verify_mode = mode
        observed.append(lib.SSL_CTX_get_verify_mode(pointer))
    return pointer if observed == [3, 1] else None


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str) -> ssl.SSLContext:
    """A TLS server context that requests a client certificate and lets the app judge it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.load_verify_locations(client_ca_file)
    context.verify_mode = ssl.CERT_OPTIONAL
    try:
        lib = _LibSsl.get()
        pointer = _ssl_ctx_pointer(context, lib)
    except (OSError, AttributeError, ValueError) as e:
        log.warning(
            "cannot reach OpenSSL through ctypes (%s); bad client certificates will fail the "
            "TLS handshake instead of getting 401",
            e,
        )
        return context
    if pointer is None:
        log.warning(
            "unexpected SSLContext layout; bad client certificates will fail the TLS handshake "
            "instead of getting 401"
        )
        return context
    lib.SSL_CTX_set_verify(pointer, _SSL_VERIFY_PEER, _finish_handshake)
    context.__dict__["_socialweb_app_verifies"] = True
    return context


def app_verifies(context: ssl.SSLContext) -> bool:
    """Whether `server_ssl_context` handed client-certificate verification to the app."""
    return bool(context.__dict__.get("_socialweb_app_verifies"))


class Unauthenticated(Exception):
    """The client presented a certificate this cluster does not accept (→ 401)."""


@dataclass(frozen=True)
class _Verified:
    user: identity.UserInfo | None
    not_before: datetime.datetime
    not_after: datetime.datetime


class ClientCertAuthenticator:
    """Verifies peer certificates against one cluster's ClientCA and names their user."""

    _CACHE_LIMIT = 4096

    def __init__(self, client_cas: list[x509.Certificate]) -> None:
        if not client_cas:
            raise ValueError("a listener needs its cluster's ClientCA")
        self.client_cas = client_cas
        self._cache: dict[bytes, _Verified] = {}

    @classmethod
    def from_pem_file(cls, path: str) -> ClientCertAuthenticator:
        with open(path, "rb") as f:
            return cls(x509.load_pem_x509_certificates(f.read()))

    def authenticate(self, der: bytes | None) -> identity.UserInfo:
        """The request's user; raises Unauthenticated for a certificate that does not verify."""
        if not der:
            return identity.ANONYMOUS_USER
        now = datetime.datetime.now(datetime.UTC)
        verified = self._cache.get(der)
        if verified is None:
            verified = self._verify(der, now)
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            self._cache[der] = verified
        if not verified.not_before <= now <= verified.not_after:
            raise Unauthenticated(_expired(now, verified))
        return verified.user or identity.ANONYMOUS_USER

    def _verify(self, der: bytes, now: datetime.datetime) -> _Verified:
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError as e:
            raise Unauthenticated(f"x509: malformed certificate: {e}") from None
        ca = self._issuer(cert)
        not_before = max(cert.not_valid_before_utc, ca.not_valid_before_utc)
        not_after = min(cert.not_valid_after_utc, ca.not_valid_after_utc)
        _check_client_auth(cert)
        try:
            user = identity.from_certificate(cert)
        except identity.CertificateIdentityError as e:
            raise Unauthenticated(str(e)) from None
        verified = _Verified(user, not_before, not_after)
        if not not_before <= now <= not_after:
            raise Unauthenticated(_expired(now, verified))
        return verified

    def _issuer(self, cert: x509.Certificate) -> x509.Certificate:
        for ca in self.client_cas:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return ca
        raise Unauthenticated("x509: certificate signed by unknown authority")


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (bearertoken.New); None without one."""
    parts = authorization.strip().split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


def _check_client_auth(cert: x509.Certificate) -> None:
    # Go's verifier: no ExtendedKeyUsage extension means any usage; otherwise clientAuth
    # (or anyExtendedKeyUsage) must be listed.
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    if ExtendedKeyUsageOID.CLIENT_AUTH in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages:
        return
    raise Unauthenticated("x509: certificate specifies an incompatible key usage")


def _expired(now: datetime.datetime, verified: _Verified) -> str:
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    if now < verified.not_before:
        return (
            f"x509: certificate has expired or is not yet valid: current time {now.strftime(stamp)} "
            f"is before {verified.not_before.strftime(stamp)}"
        )
    return (
        f"x509: certificate has expired or is not yet valid: current time {now.strftime(stamp)} "
        f"is after {verified.not_after.strftime(stamp)}"
    )
