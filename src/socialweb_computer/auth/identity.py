"""Who is asking: the user a request is made as.

A verified client certificate names the user (CommonName), the groups (Organizations)
and, when the subject carries it, a UID; `system:authenticated` is added and the
certificate's SHA-256 becomes the `authentication.kubernetes.io/credential-id` extra,
as the real x509 authenticator does. No certificate means `system:anonymous` in
`system:unauthenticated`. Built by `authn.ClientCertAuthenticator`, replaced by
`impersonation`, read by the authorizer and the access reviews.
"""

from __future__ import annotations

import dataclasses
import hashlib

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
AUTHENTICATED = "system:authenticated"
MASTERS = "system:masters"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# The subject attribute Kubernetes reads a user's UID from (asn1util.X509UID).
UID_OID = x509.ObjectIdentifier("1.3.6.1.4.1.57683.2")

Extra = tuple[tuple[str, tuple[str, ...]], ...]


@dataclasses.dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Extra = ()

    @property
    def is_anonymous(self) -> bool:
        return self.name == ANONYMOUS

    @property
    def is_superuser(self) -> bool:
        return MASTERS in self.groups

    def to_dict(self) -> dict[str, object]:
        """The authentication.k8s.io UserInfo shape (empty fields omitted, as Go omits them)."""
        out: dict[str, object] = {"username": self.name}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


ANONYMOUS_USER = UserInfo(ANONYMOUS, (UNAUTHENTICATED,))


class CertificateIdentityError(ValueError):
    """The certificate verified but its subject cannot name a user (e.g. two UIDs)."""


def from_certificate(cert: x509.Certificate) -> UserInfo | None:
    """The user a verified client certificate names; None when it has no CommonName.

    A certificate without a CommonName names nobody, so the request is anonymous, as the
    real authenticator treats it.
    """
    subject = cert.subject
    names = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if not names or not names[0]:
        return None
    orgs = tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    uids = [str(a.value) for a in subject.get_attributes_for_oid(UID_OID)]
    if len(uids) > 1:
        raise CertificateIdentityError(f"expected 1 UID, but found multiple: {uids}")
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    return UserInfo(
        names[0],
        (*orgs, AUTHENTICATED),
        uids[0] if uids else "",
        ((CREDENTIAL_ID, (f"X509SHA256={digest}",)),),
    )


def service_account_username(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def service_account_groups(namespace: str) -> tuple[str, ...]:
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
