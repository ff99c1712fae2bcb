"""ServiceAccount tokens of one logical cluster: issuing them and authenticating with them.

Bound tokens (TokenRequest, `kubectl create token`, the projected `kube-api-access-*`
volume) carry upstream's claims: `iss`, `sub`, `aud`, `exp`/`iat`/`nbf`, a `jti`, and
under `kubernetes.io` the namespace, the ServiceAccount and the object the token is bound
to (a Pod, with its Node; a Secret; a Node). Legacy tokens (the `kubernetes.io/
service-account-token` Secret) carry the old `kubernetes.io/serviceaccount/...` claims and
issuer `kubernetes/serviceaccount`, and never expire: they are valid while their Secret is.

A token authenticates as `system:serviceaccount:<ns>:<name>` (UID the ServiceAccount's) in
`system:serviceaccounts`, `system:serviceaccounts:<ns>` and `system:authenticated`, with
the pod/node and credential-id extras, only while everything it names still exists with
the UID it names: delete the ServiceAccount, the Secret or the Pod and the token is a 401
(a Pod being deleted keeps its tokens for 60 s, as upstream). Its audiences must meet the
API audiences (the issuer); times are checked with go-jose's one-minute leeway.

Tokens never reach a log: failures log the reason only. Created by
`apiserver.cluster.LogicalCluster`; used by the authentication middleware, TokenRequest
(`apiserver/tokenrequest.py`), TokenReview, and the token Secret controller.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import hmac
import uuid
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.auth import identity, tokens

Object = dict[str, Any]

DEFAULT_ISSUER = "https://kubernetes.default.svc.cluster.local"
LEGACY_ISSUER = "kubernetes/serviceaccount"
# What the ServiceAccount admission plugin asks for, and the extended lifetime a kube-audience
# pod-bound token of exactly that length gets (kube-apiserver's --service-account-extend-token-expiration).
WARN_ONLY_EXPIRATION_SECONDS = 3607
EXTENDED_EXPIRATION_SECONDS = 365 * 24 * 3600
DEFAULT_EXPIRATION_SECONDS = 3600
LEEWAY = datetime.timedelta(minutes=1)
DELETION_GRACE = datetime.timedelta(seconds=60)
LEGACY_INVALID_SINCE = "kubernetes.io/legacy-token-invalid-since"

EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"
EXTRA_NODE_UID = "authentication.kubernetes.io/node-uid"

_INVALIDATED = "service account token has been invalidated"


@dataclasses.dataclass(frozen=True)
class Authenticated:
    user: identity.UserInfo
    audiences: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Issued:
    token: str
    expiration: datetime.datetime


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _epoch(moment: datetime.datetime) -> int:
    return int(moment.timestamp())


def _ref(obj: Object) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    return {"name": meta.get("name", ""), "uid": meta.get("uid", "")}


def _go_strings(values: tuple[str, ...] | list[str]) -> str:
    """Go's %q of a []string: ["a" "b"]."""
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


class TokenService:
    """Issues and checks the tokens of one cluster; `issuer` is set once its URL is known."""

    def __init__(self, store: Any, keys: tokens.KeySet) -> None:
        self.store = store
        self.keys = keys
        self.issuer = DEFAULT_ISSUER

    @property
    def audiences(self) -> tuple[str, ...]:
        """The API audiences: what a token must be for to authenticate to this cluster."""
        return (self.issuer,)

    def is_api_audiences(self, audiences: list[str]) -> bool:
        return bool(audiences) and set(audiences) <= set(self.audiences)

    # ------------------------------------------------------------------ issuing

    def issue(
        self,
        account: Object,
        *,
        audiences: list[str],
        expiration_seconds: int,
        pod: Object | None = None,
        secret: Object | None = None,
        node: Object | None = None,
        warn_after_seconds: int = 0,
        now: datetime.datetime | None = None,
    ) -> Issued:
        """A bound token (token.Claims upstream); at most one of pod/secret binds, a node rides along."""
        now = now or _now()
        expiry = now + datetime.timedelta(seconds=expiration_seconds)
        meta = account["metadata"]
        private: Object = {"namespace": meta["namespace"], "serviceaccount": _ref(account)}
        if pod is not None:
            private["pod"] = _ref(pod)
            if node is not None:
                private["node"] = {k: v for k, v in _ref(node).items() if v}
        elif secret is not None:
            private["secret"] = _ref(secret)
        elif node is not None:
            private["node"] = _ref(node)
        if warn_after_seconds:
            private["warnafter"] = _epoch(now + datetime.timedelta(seconds=warn_after_seconds))
        claims = {
            "aud": list(audiences),
            "exp": _epoch(expiry),
            "iat": _epoch(now),
            "iss": self.issuer,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": private,
            "nbf": _epoch(now),
            "sub": identity.service_account_username(meta["namespace"], meta["name"]),
        }
        return Issued(self.keys.sign(claims), expiry)

    def issue_legacy(self, account: Object, secret: Object) -> str:
        """The never-expiring token of a `kubernetes.io/service-account-token` Secret."""
        meta = account["metadata"]
        claims = {
            "iss": LEGACY_ISSUER,
            "kubernetes.io/serviceaccount/namespace": meta["namespace"],
            "kubernetes.io/serviceaccount/secret.name": secret["metadata"]["name"],
            "kubernetes.io/serviceaccount/service-account.name": meta["name"],
            "kubernetes.io/serviceaccount/service-account.uid": meta.get("uid", ""),
            "sub": identity.service_account_username(meta["namespace"], meta["name"]),
        }
        return self.keys.sign(claims)

    # ------------------------------------------------------------------ authenticating

    async def authenticate(
        self, token: str, audiences: tuple[str, ...] = (), *, now: datetime.datetime | None = None
    ) -> Authenticated:
        """Who `token` is; raises tokens.NotOurs or tokens.TokenInvalid (both mean 401)."""
        claims = self.keys.verify(token, (self.issuer, LEGACY_ISSUER))
        now = now or _now()
        if claims.get("iss") == LEGACY_ISSUER:
            return await self._legacy(token, claims, audiences)
        return await self._bound(claims, audiences, now)

    def _audiences(self, claimed: Any, requested: tuple[str, ...]) -> tuple[str, ...]:
        token_audiences = [claimed] if isinstance(claimed, str) else list(claimed or [])
        if not token_audiences:
            token_audiences = list(self.audiences)
        wanted = requested or self.audiences
        matched = tuple(a for a in token_audiences if a in wanted)
        if not matched:
            raise tokens.TokenInvalid(
                f"token audiences {_go_strings(token_audiences)} is invalid for the target audiences "
                f"{_go_strings(wanted)}"
            )
        return matched

    @staticmethod
    def _check_times(claims: Object, now: datetime.datetime) -> None:
        stamp = now.timestamp()
        leeway = LEEWAY.total_seconds()
        exp, nbf, iat = claims.get("exp"), claims.get("nbf"), claims.get("iat")
        if isinstance(nbf, int | float) and stamp + leeway < nbf:
            raise tokens.TokenInvalid("service account token is not valid yet")
        if isinstance(exp, int | float) and stamp - leeway > exp:
            raise tokens.TokenInvalid("service account token has expired")
        if isinstance(iat, int | float) and stamp + leeway < iat:
            raise tokens.TokenInvalid("service account token is issued in the future")

    async def _bound(
        self, claims: Object, audiences: tuple[str, ...], now: datetime.datetime
    ) -> Authenticated:
        self._check_times(claims, now)
        matched = self._audiences(claims.get("aud"), audiences)
        private = claims.get("kubernetes.io")
        if not isinstance(private, dict) or not isinstance(private.get("serviceaccount"), dict):
            raise tokens.TokenInvalid("token could not be validated.")
        namespace = str(private.get("namespace", ""))
        account_ref, pod_ref = private["serviceaccount"], private.get("pod")
        secret_ref, node_ref = private.get("secret"), private.get("node")
        if pod_ref and secret_ref:
            raise tokens.TokenInvalid("pod and secret both set in private claim")
        account = await self._live("serviceaccounts", namespace, account_ref, "service account", now)
        extra: list[tuple[str, tuple[str, ...]]] = []
        if isinstance(pod_ref, dict):
            await self._live("pods", namespace, pod_ref, "pod", now)
            extra += [(EXTRA_POD_NAME, (pod_ref["name"],)), (EXTRA_POD_UID, (pod_ref["uid"],))]
        if isinstance(secret_ref, dict):
            await self._live("secrets", namespace, secret_ref, "secret", now)
        if isinstance(node_ref, dict):
            if not pod_ref:  # a node-bound token lives as long as its node; a pod's only names it
                await self._live("nodes", "", node_ref, "node", now)
            extra.append((EXTRA_NODE_NAME, (node_ref.get("name", ""),)))
            if node_ref.get("uid"):
                extra.append((EXTRA_NODE_UID, (node_ref["uid"],)))
        if claims.get("jti"):
            extra.append((identity.CREDENTIAL_ID, (f"JTI={claims['jti']}",)))
        return Authenticated(self._user(account, tuple(sorted(extra))), matched)

    async def _legacy(self, token: str, claims: Object, audiences: tuple[str, ...]) -> Authenticated:
        matched = self._audiences(claims.get("aud"), audiences)
        namespace = str(claims.get("kubernetes.io/serviceaccount/namespace", ""))
        secret_name = str(claims.get("kubernetes.io/serviceaccount/secret.name", ""))
        account_name = str(claims.get("kubernetes.io/serviceaccount/service-account.name", ""))
        account_uid = str(claims.get("kubernetes.io/serviceaccount/service-account.uid", ""))
        if not namespace or not secret_name or not account_name:
            raise tokens.TokenInvalid("token could not be validated.")
        now = _now()
        secret = await self._get("secrets", namespace, secret_name)
        if secret is None or self._deleted_long_ago(secret, now):
            raise tokens.TokenInvalid(_INVALIDATED)
        stored = _secret_token(secret)
        if stored is None or not hmac.compare_digest(stored, token.encode()):
            raise tokens.TokenInvalid(_INVALIDATED)
        account = await self._live("serviceaccounts", namespace, {"name": account_name, "uid": account_uid},
                                   "service account", now)
        if LEGACY_INVALID_SINCE in ((secret.get("metadata") or {}).get("labels") or {}):
            raise tokens.TokenInvalid(
                f"the token in secret {namespace}/{secret_name} for service account "
                f"{namespace}/{account_name} has been marked invalid. Use tokens from the TokenRequest "
                f"API or manually created secret-based tokens, or remove the '{LEGACY_INVALID_SINCE}' "
                "label from the secret to re-enable it"
            )
        return Authenticated(self._user(account, ()), matched)

    @staticmethod
    def _user(account: Object, extra: identity.Extra) -> identity.UserInfo:
        meta = account["metadata"]
        groups = (*identity.service_account_groups(meta["namespace"]), identity.AUTHENTICATED)
        return identity.UserInfo(identity.service_account_username(meta["namespace"], meta["name"]),
                                 groups, meta.get("uid", ""), extra)

    async def _get(self, plural: str, namespace: str, name: str) -> Object | None:
        kind = self.store.registry.lookup("", "v1", plural)
        try:
            return await self.store.get(kind, namespace, name)
        except errors.StatusError as e:
            if e.code == 404:
                return None
            raise

    async def _live(
        self, plural: str, namespace: str, ref: Object, what: str, now: datetime.datetime
    ) -> Object:
        """The object a claim names, if it still exists with the claimed UID and is not long deleted."""
        obj = await self._get(plural, namespace, str(ref.get("name", "")))
        if obj is None or self._deleted_long_ago(obj, now):
            raise tokens.TokenInvalid(_INVALIDATED)
        uid = obj["metadata"].get("uid", "")
        claimed = str(ref.get("uid", ""))
        if claimed and uid != claimed:
            suffix = "claim" if what == "service account" else f"service account {what} ref claim"
            label = "service account" if what == "service account" else what
            raise tokens.TokenInvalid(f"{label} UID ({uid}) does not match {suffix} ({claimed})")
        return obj

    @staticmethod
    def _deleted_long_ago(obj: Object, now: datetime.datetime) -> bool:
        stamp = (obj.get("metadata") or {}).get("deletionTimestamp")
        if not stamp:
            return False
        deleted = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        return deleted < now - DELETION_GRACE


def _secret_token(secret: Object) -> bytes | None:
    encoded = (secret.get("data") or {}).get("token")
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
