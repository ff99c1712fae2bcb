"""CertificateSigningRequests: upstream's validation and the three ways a CSR changes.

- the main resource never changes a CSR's spec or status (both are carried over, as
  upstream's strategy does, so a client's edits there are ignored);
- `approval` (what `kubectl certificate approve|deny` writes) changes only the Approved and
  Denied conditions;
- `status` (what a signer writes) changes the certificate and the other conditions, never
  Approved or Denied.

Condition timestamps are the server's: lastUpdateTime when missing, lastTransitionTime when
a condition is new or changes status. Who created a CSR (`spec.username`, groups, uid,
extra) is stamped by admission (`auth/certificates.py`), which also enforces who may
approve and sign. Signing is the certificates controller's.
"""

from __future__ import annotations

import base64
import binascii
import copy

from cryptography import x509

from socialweb_computer.api import gofmt, objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base
from socialweb_computer.apiserver.strategies.base import Object

USAGES = [
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
]
APPROVAL_TYPES = ("Approved", "Denied")
STATUSES = ["False", "True", "Unknown"]
MIN_EXPIRATION = 600


def go_bytes(data: bytes) -> gofmt.GoSyntax:
    """`%#v` of a []byte, as validation prints a bad request."""
    return gofmt.GoSyntax("[]byte{" + ", ".join(f"0x{b:x}" for b in data) + "}")


def request_pem(obj: Object) -> bytes:
    raw = (obj.get("spec") or {}).get("request") or ""
    try:
        return base64.b64decode(raw, validate=True) if isinstance(raw, str) else b""
    except (binascii.Error, ValueError):
        return b""


def parse_request(pem: bytes) -> x509.CertificateSigningRequest:
    """certificates.ParseCSR: one PEM CERTIFICATE REQUEST block with a valid signature; ValueError
    carries upstream's wording."""
    text = pem.decode("latin-1")
    if "-----BEGIN CERTIFICATE REQUEST-----" not in text:
        raise ValueError("PEM block type must be CERTIFICATE REQUEST")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as e:
        raise ValueError(f"asn1: structure error: {e}") from None
    if not csr.is_signature_valid:
        raise ValueError(
            "x509: ECDSA verification failure"
            if "EC" in type(csr.public_key()).__name__
            else "crypto/rsa: verification error"
        )
    return csr


def _signer_name_causes(name: object) -> list[Cause]:
    path = "spec.signerName"
    if not name:
        return [base.required(path)]
    if not isinstance(name, str):
        return []
    domain, _, rest = name.partition("/")
    if not rest:
        return [
            base.invalid(
                path, name, "must be a fully qualified domain and path of the form 'example.com/signer-name'"
            )
        ]
    causes = [
        base.invalid(path, name, "validating domain component:\n" + m)
        for m in objects.dns1123_subdomain_errors(domain)
    ]
    if len(name) > 571:
        causes.append(Cause("FieldValueTooLong", "Too long: may not be more than 571 bytes", path))
    return causes


def _condition_causes(conditions: list[Object]) -> list[Cause]:
    causes: list[Cause] = []
    seen: set[str] = set()
    for i, cond in enumerate(conditions):
        where = f"status.conditions[{i}]"
        kind = cond.get("type")
        if not kind:
            causes.append(base.required(f"{where}.type"))
            continue
        status = cond.get("status")
        if not status:
            causes.append(base.required(f"{where}.status"))
        elif kind in (*APPROVAL_TYPES, "Failed") and status != "True":
            causes.append(base.not_supported(f"{where}.status", status, ["True"]))
        elif status not in STATUSES:
            causes.append(base.not_supported(f"{where}.status", status, STATUSES))
        if kind in seen:
            causes.append(
                Cause("FieldValueDuplicate", f"Duplicate value: {gofmt.quote(kind)}", f"{where}.type")
            )
        seen.add(kind)
    if "Approved" in seen and "Denied" in seen:
        index = next(
            i
            for i, c in enumerate(conditions)
            if c.get("type") in APPROVAL_TYPES
            and any(
                o.get("type") != c.get("type") and o.get("type") in APPROVAL_TYPES for o in conditions[:i]
            )
        )
        causes.append(
            base.invalid(
                f"status.conditions[{index}].type",
                conditions[index]["type"],
                "Approved and Denied conditions are mutually exclusive",
            )
        )
    return causes


def _stamp_conditions(new: Object, old: Object) -> None:
    """populateConditionTimestamps."""
    now = objects.rfc3339(objects.now())
    before = {c.get("type"): c for c in (old.get("status") or {}).get("conditions") or []}
    for cond in (new.get("status") or {}).get("conditions") or []:
        if not isinstance(cond, dict):
            continue
        if not cond.get("lastUpdateTime"):
            cond["lastUpdateTime"] = now
        if not cond.get("lastTransitionTime"):
            previous = before.get(cond.get("type"))
            if (
                previous is not None
                and previous.get("status") == cond.get("status")
                and previous.get("lastTransitionTime")
            ):
                cond["lastTransitionTime"] = previous["lastTransitionTime"]
            else:
                cond["lastTransitionTime"] = now


class CertificateSigningRequestStrategy(base.Strategy):
    name_format = "path"  # "We don't care what you call your certificate requests" (upstream)
    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {}

    def prepare_for_update(self, new: Object, old: Object) -> None:
        new["spec"] = copy.deepcopy(old.get("spec") or {})
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)

    def prepare_for_status_update(self, new: Object, old: Object) -> None:
        new["spec"] = copy.deepcopy(old.get("spec") or {})
        _stamp_conditions(new, old)

    def prepare_for_subresource_update(self, subresource: str, new: Object, old: Object) -> None:
        if subresource == "approval":
            new["spec"] = copy.deepcopy(old.get("spec") or {})
            _stamp_conditions(new, old)

    def validate_subresource_update(self, subresource: str, new: Object, old: Object) -> list[Cause]:
        if subresource == "approval":
            return approval_changes(new, old)
        if subresource == "status":
            return status_changes(new, old)
        return []

    def validate(self, obj: Object) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        pem = request_pem(obj)
        try:
            parse_request(pem)
        except ValueError as e:
            causes.append(base.invalid("spec.request", go_bytes(pem), str(e)))
        usages = spec.get("usages")
        if not usages:
            causes.append(
                Cause("FieldValueRequired", "Required value: usages must be provided", "spec.usages")
            )
        for i, usage in enumerate(usages or []):
            if usage not in USAGES:
                causes.append(base.not_supported(f"spec.usages[{i}]", usage, USAGES))
        causes.extend(_signer_name_causes(spec.get("signerName")))
        expiration = spec.get("expirationSeconds")
        if isinstance(expiration, int) and expiration < MIN_EXPIRATION:
            causes.append(
                base.invalid(
                    "spec.expirationSeconds",
                    expiration,
                    "may not specify a duration less than 600 seconds (10 minutes)",
                )
            )
        causes.extend(
            _condition_causes(
                [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
            )
        )
        certificate = (obj.get("status") or {}).get("certificate")
        if certificate:
            causes.extend(_certificate_causes(certificate))
        return causes

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        causes = self.validate(new)
        old_cert = (old.get("status") or {}).get("certificate")
        new_cert = (new.get("status") or {}).get("certificate")
        if old_cert and new_cert != old_cert:
            causes.append(
                base.forbidden("status.certificate", "updates may not modify existing certificate content")
            )
        return causes


def _certificate_causes(certificate: str) -> list[Cause]:
    try:
        raw = base64.b64decode(certificate, validate=True)
        certs = x509.load_pem_x509_certificates(raw)
    except (binascii.Error, ValueError):
        return [
            base.invalid(
                "status.certificate", "<certificate data>", "must contain at least one CERTIFICATE PEM block"
            )
        ]
    return (
        []
        if certs
        else [
            base.invalid(
                "status.certificate", "<certificate data>", "must contain at least one CERTIFICATE PEM block"
            )
        ]
    )


def approval_changes(new: Object, old: Object) -> list[Cause]:
    """What an approval or status write may not do to the Approved/Denied conditions."""

    def kinds(obj: Object) -> set[str]:
        return {
            c.get("type", "")
            for c in (obj.get("status") or {}).get("conditions") or []
            if isinstance(c, dict)
        }

    causes = []
    for kind in APPROVAL_TYPES:
        if kind in kinds(old) and kind not in kinds(new):
            causes.append(
                base.forbidden(
                    "status.conditions", f"updates may not remove a condition of type {gofmt.quote(kind)}"
                )
            )
    return causes


def status_changes(new: Object, old: Object) -> list[Cause]:
    causes = approval_changes(new, old)
    before = {
        c.get("type"): c for c in (old.get("status") or {}).get("conditions") or [] if isinstance(c, dict)
    }
    for cond in (new.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") in APPROVAL_TYPES and cond.get("type") not in before:
            causes.append(
                base.forbidden(
                    "status.conditions",
                    f"updates may not add a condition of type {gofmt.quote(cond['type'])}",
                )
            )
    return causes


STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    ("certificates.k8s.io", "CertificateSigningRequest"): CertificateSigningRequestStrategy(),
}
