"""Who is asking: the user a request is made as.

A client certificate chained to the cluster's ClientCA names the user (CommonName)
and groups (Organizations); `system:authenticated` is added. No certificate means
`system:anonymous` in `system:unauthenticated`.
"""

from __future__ import annotations

import dataclasses
import ssl

from cryptography import x509
from cryptography.x509.oid import NameOID

ANONYMOUS = "system:anonymous"
UNAUTHENTICATED = "system:unauthenticated"
AUTHENTICATED = "system:authenticated"
MASTERS = "system:masters"


@dataclasses.dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def is_anonymous(self) -> bool:
        return self.name == ANONYMOUS

    @property
    def is_superuser(self) -> bool:
        return MASTERS in self.groups

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


ANONYMOUS_USER = UserInfo(ANONYMOUS, (UNAUTHENTICATED,))


def from_certificate(cert: x509.Certificate) -> UserInfo:
    subject = cert.subject
    names = [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    groups = (*(str(o) for o in orgs), AUTHENTICATED)
    return UserInfo(str(names[0]) if names else "", groups)


def from_ssl_object(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> UserInfo:
    if ssl_object is None:
        return ANONYMOUS_USER
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return ANONYMOUS_USER
    return from_certificate(x509.load_der_x509_certificate(der))
