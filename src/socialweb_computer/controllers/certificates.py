"""CertificateSigningRequests after admission: the `kubernetes.io/kube-apiserver-client`,
`kubernetes.io/kube-apiserver-client-kubelet` and `kubernetes.io/kubelet-serving` signers and
the cleaner, as kube-controller-manager's csrsigning and csrcleaner do.

Signing: an Approved (and not Denied or Failed) CSR for `kubernetes.io/kube-apiserver-client`
without a certificate is signed with the cluster's ClientCA (the `Signer` the cluster is
wired with), so the certificate is a credential for this cluster and no other: its
CommonName is the user, its Organizations the groups, held to RBAC. The usages must be
`client auth` with optionally `digital signature` and `key encipherment`; otherwise, and for
a request naming `system:masters` (admission already refuses those at creation; this is the
second line), the CSR gets `Failed` (SignerValidationFailure) with the reason. Validity:
`spec.expirationSeconds` or one year, never past the CA.

The two kubelet signers sign with the same ClientCA (a kubelet's client certificate is a
credential for this cluster; kube-controller-manager's default `--cluster-signing-*` files
serve all three signers too) after upstream's checks of what a node may ask for
(`KUBELET_RULES`): the organization exactly `system:nodes`, a common name
`system:node:<name>`, the usages of a client (or serving) certificate, and for serving
certificates a DNS or IP name and no email or URI. A failed check is `Failed`
(SignerValidationFailure) with upstream's words. `kubernetes.io/legacy-unknown` and other
signer names are left to whoever serves them (none here). Auto-approval of node CSRs
(kube-controller-manager's csrapproving) is not done: an operator approves them.

Cleaning: issued or denied CSRs go an hour after their last condition update, failed ones
too, pending ones after 24 hours, and any whose certificate has expired; one timer per CSR.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509
from cryptography.x509.oid import NameOID

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.strategies import certificates as csr_strategy
from socialweb_computer.controllers import framework

Object = dict[str, Any]
MANAGER = "kube-controller-manager"
KUBE_APISERVER_CLIENT = "kubernetes.io/kube-apiserver-client"
KUBELET_CLIENT = "kubernetes.io/kube-apiserver-client-kubelet"
KUBELET_SERVING = "kubernetes.io/kubelet-serving"
NODES_GROUP = "system:nodes"
NODE_PREFIX = "system:node:"
SUPERUSER_GROUP = "system:masters"
_CLIENT_USAGES = ("digital signature", "key encipherment")
APPROVED_TTL = datetime.timedelta(hours=1)
DENIED_TTL = datetime.timedelta(hours=1)
PENDING_TTL = datetime.timedelta(hours=24)


class Signer(Protocol):
    def sign(self, request: x509.CertificateSigningRequest, usages: list[str], *,
             duration: datetime.timedelta = ...) -> bytes: ...


def _true(csr: Object, kind: str) -> Object | None:
    for cond in (csr.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def approved(csr: Object) -> bool:
    return _true(csr, "Approved") is not None and _true(csr, "Denied") is None


def usage_problem(usages: list[str]) -> str:
    """validAPIServerClientUsages: "" when the usages make a client certificate."""
    for usage in usages:
        if usage not in (*_CLIENT_USAGES, "client auth"):
            return f"invalid usage for client certificate: {usage}"
    if "client auth" not in usages:
        return "missing required usage for client certificate: client auth"
    return ""


@dataclass(frozen=True)
class KubeletRule:
    """What one kubelet signer accepts (ValidateKubeletClientCSR / ValidateKubeletServingCSR)."""

    usage_sets: tuple[frozenset[str], ...]  # the usages, exactly one of these sets
    needs_dns_or_ip: bool  # at least one DNS or IP SAN (serving), or none of them (client)


KUBELET_RULES: dict[str, KubeletRule] = {
    KUBELET_CLIENT: KubeletRule(
        (frozenset({"digital signature", "key encipherment", "client auth"}),
         frozenset({"digital signature", "client auth"})), needs_dns_or_ip=False),
    KUBELET_SERVING: KubeletRule(
        (frozenset({"digital signature", "key encipherment", "server auth"}),
         frozenset({"digital signature", "server auth"})), needs_dns_or_ip=True),
}


def _go_list(values: frozenset[str]) -> str:
    return "[" + " ".join(sorted(values)) + "]"


def kubelet_problem(rule: KubeletRule, request: x509.CertificateSigningRequest, usages: list[str]) -> str:
    """"" when a kubelet signer may sign `request`; otherwise upstream's error text."""
    orgs = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if orgs != [NODES_GROUP]:
        return "subject organization is not system:nodes"
    try:
        sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = x509.SubjectAlternativeName([])
    dns, ips = sans.get_values_for_type(x509.DNSName), sans.get_values_for_type(x509.IPAddress)
    if rule.needs_dns_or_ip:
        if not dns and not ips:
            return "DNS or IP subjectAltName is required"
    elif dns:
        return "DNS subjectAltNames are not allowed"
    elif ips:
        return "IP subjectAltNames are not allowed"
    if sans.get_values_for_type(x509.RFC822Name):
        return "Email subjectAltNames are not allowed"
    if sans.get_values_for_type(x509.UniformResourceIdentifier):
        return "URI subjectAltNames are not allowed"
    names = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if not names or not names[0].startswith(NODE_PREFIX):
        return "subject common name does not begin with system:node:"
    if frozenset(usages) not in rule.usage_sets:
        return f"usages did not match {_go_list(rule.usage_sets[0])}"
    return ""


class CertificateController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 signer: Signer | None) -> None:
        self.store = store
        self.clock = clock
        self.signer = signer
        self.queue = framework.WorkQueue(clock)
        self.requests = informers.get("certificates.k8s.io", "certificatesigningrequests")
        self.requests.handlers.append(self._on_csr)

    def _on_csr(self, event: str, new: Object | None, old: Object | None) -> None:
        if new is not None:
            self.queue.add(framework.key_of(new))

    async def sync(self, key: tuple[str, str]) -> None:
        csr = self.requests.get(*key)
        if csr is None:
            return
        if await self._clean(csr):
            return
        status = csr.get("status") or {}
        if not approved(csr) or _true(csr, "Failed") or status.get("certificate") or self.signer is None:
            return
        spec = csr.get("spec") or {}
        signer_name = spec.get("signerName")
        if signer_name != KUBE_APISERVER_CLIENT and signer_name not in KUBELET_RULES:
            return
        try:
            request = csr_strategy.parse_request(csr_strategy.request_pem(csr))
        except ValueError as e:
            await self._fail(csr, f'unable to parse csr "{csr["metadata"]["name"]}": {e}')
            return
        usages = [str(u) for u in spec.get("usages") or []]
        rule = KUBELET_RULES.get(str(signer_name))
        problem = kubelet_problem(rule, request, usages) if rule is not None else usage_problem(usages)
        orgs = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        if not problem and SUPERUSER_GROUP in orgs:
            problem = (f"refusing to sign a client certificate for {SUPERUSER_GROUP}: that group bypasses "
                       "every RBAC rule, and a credential signed by the ClientCA through the API is always a "
                       "scoped one; the cluster's superuser credential is its admin kubeconfig")
        if problem:
            await self._fail(csr, problem)
            return
        expiration = spec.get("expirationSeconds")
        duration = datetime.timedelta(seconds=expiration) if isinstance(expiration, int) else None
        certificate = self.signer.sign(request, usages, duration=duration) if duration else \
            self.signer.sign(request, usages)
        updated = framework.clone(csr)
        updated.setdefault("status", {})["certificate"] = base64.b64encode(certificate).decode()
        await self._write_status(updated)

    async def _fail(self, csr: Object, message: str) -> None:
        updated = framework.clone(csr)
        now = objects.rfc3339(self.clock.now())
        conditions = updated.setdefault("status", {}).setdefault("conditions", [])
        conditions.append({"type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                           "message": message, "lastUpdateTime": now, "lastTransitionTime": now})
        await self._write_status(updated)

    async def _write_status(self, csr: Object) -> None:
        try:
            await self.store.update(self.requests.kind, "", csr["metadata"]["name"], csr,
                                    store_mod.WriteOptions(field_manager=MANAGER, subresource="status",
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    # ------------------------------------------------------------ cleaner

    def _expires(self, csr: Object) -> datetime.datetime | None:
        """When the cleaner removes this CSR."""
        stamp = csr["metadata"].get("creationTimestamp")
        created = objects.parse_time(stamp) if stamp else self.clock.now()
        status = csr.get("status") or {}
        due: list[datetime.datetime] = []
        certificate = status.get("certificate")
        if certificate:
            try:
                cert = x509.load_pem_x509_certificate(base64.b64decode(certificate))
                due.append(cert.not_valid_after_utc)
            except ValueError:
                pass
        for kind, ttl in (("Approved", APPROVED_TTL), ("Denied", DENIED_TTL), ("Failed", APPROVED_TTL)):
            cond = _true(csr, kind)
            if cond is None or (kind == "Approved" and not certificate):
                continue
            when = cond.get("lastUpdateTime") or cond.get("lastTransitionTime")
            due.append((objects.parse_time(when) if when else created) + ttl)
        if not due and not status.get("conditions"):
            due.append(created + PENDING_TTL)
        return min(due) if due else None

    async def _clean(self, csr: Object) -> bool:
        due = self._expires(csr)
        if due is None:
            return False
        now = self.clock.now()
        if due > now:
            self.queue.add_after(framework.key_of(csr), (due - now).total_seconds())
            return False
        try:
            await self.store.delete(self.requests.kind, "", csr["metadata"]["name"],
                                    store_mod.DeleteOptions(precondition_uid=csr["metadata"]["uid"]))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise
        return True
