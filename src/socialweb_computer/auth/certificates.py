"""Admission for CertificateSigningRequests: who asked, who may approve, who may sign, and
no superuser client certificates.

The four pieces a 1.37 kube-apiserver runs on CSRs, as one store `before_write` hook
(created by `apiserver.cluster.LogicalCluster`):

- the requester's identity (`spec.username`, `uid`, `groups`, `extra`) stamped on create,
  so a signer and an approver see who asked (upstream's strategy does this);
- CertificateSubjectRestriction: a CSR for the `kubernetes.io/kube-apiserver-client` signer
  naming the `system:masters` organization is refused at creation, `use of
  kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed`. It
  is the same line `internal tenantcredential` holds: a superuser credential never comes
  from the ClientCA through the API;
- CertificateApproval: changing Approved/Denied (`.../approval`) needs `approve` on
  `signers` (`certificates.k8s.io`) for the signer's name or `<domain>/*`;
- CertificateSigning: setting `status.certificate` needs `sign` on the same.

Writes made without a request in context (the cluster's own controllers) are not checked.
"""

from __future__ import annotations

from typing import Any

from cryptography.x509.oid import NameOID

from socialweb_computer.api import errors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.apiserver.strategies import certificates as csr_strategy
from socialweb_computer.auth import attributes, identity, policy

Object = dict[str, Any]
GROUP, PLURAL = "certificates.k8s.io", "certificatesigningrequests"
KUBE_APISERVER_CLIENT = "kubernetes.io/kube-apiserver-client"


def _forbidden(obj: Object, why: str) -> errors.StatusError:
    name = (obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or ""
    return errors.forbidden(f'{PLURAL}.{GROUP} "{name}" is forbidden: {why}', PLURAL, name, GROUP)


def requests_superuser(obj: Object) -> bool:
    """Whether the CSR's subject names the system:masters organization (an unparseable request
    is left to validation)."""
    try:
        csr = csr_strategy.parse_request(csr_strategy.request_pem(obj))
    except ValueError:
        return False
    orgs = [str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    return identity.MASTERS in orgs


class CsrAdmission:
    def __init__(self, store: store_mod.Store, cluster_policy: policy.ClusterPolicy) -> None:
        self.policy = cluster_policy
        store.before_write.append(self._before_write)

    def _before_write(self, kind: Any, new: Object, old: Object | None) -> None:
        if kind.group != GROUP or kind.plural != PLURAL:
            return
        context = policy.REQUEST.get()
        user = context.attrs.user if context is not None and context.policy is self.policy else None
        spec = new.get("spec") if isinstance(new.get("spec"), dict) else {}
        signer = str(spec.get("signerName") or "")
        if old is None:
            if signer == KUBE_APISERVER_CLIENT and requests_superuser(new):
                raise _forbidden(new, f"use of {KUBE_APISERVER_CLIENT} signer with {identity.MASTERS} group "
                                      "is not allowed")
            if user is not None:
                self._stamp(spec, user)
            return
        if user is None:
            return
        signer = str((old.get("spec") or {}).get("signerName") or signer)
        subresource = store_mod.ADMITTING_SUBRESOURCE.get()
        if subresource == "approval" and _approvals(new) != _approvals(old):
            self._require(user, "approve", signer, new)
        elif subresource == "status" and (new.get("status") or {}).get("certificate") != \
                (old.get("status") or {}).get("certificate"):
            self._require(user, "sign", signer, new)

    @staticmethod
    def _stamp(spec: Object, user: identity.UserInfo) -> None:
        for field in ("username", "uid", "groups", "extra"):
            spec.pop(field, None)
        spec["username"] = user.name
        if user.uid:
            spec["uid"] = user.uid
        if user.groups:
            spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}

    def _require(self, user: identity.UserInfo, verb: str, signer: str, obj: Object) -> None:
        names = [signer]
        if "/" in signer:
            names.append(signer.split("/", 1)[0] + "/*")
        for name in names:
            attrs = attributes.Attributes(user=user, verb=verb, resource_request=True, api_group=GROUP,
                                          api_version="*", resource="signers", name=name)
            if self.policy.authorize(attrs).allowed:
                return
        raise _forbidden(obj, f'user not permitted to {verb} requests with signerName "{signer}"')


def _approvals(obj: Object) -> list[tuple[str, str]]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return sorted((c.get("type", ""), c.get("status", "")) for c in conditions
                  if isinstance(c, dict) and c.get("type") in csr_strategy.APPROVAL_TYPES)
