"""Workload identity over HTTP: TokenRequest, TokenReview and the OIDC discovery documents.

`POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token` (a TokenRequest: what
`kubectl create token` sends, and what a node agent sends with a `boundObjectRef` to the
pod whose projected volume it fills) answers 201 with `status.token` and
`status.expirationTimestamp`, with upstream's defaults (the API audiences, 3600 s), checks
(at least 10 minutes, at most 2^32 s; a bound Pod must run as that ServiceAccount; a given
UID must match) and wording. A Pod-bound request for exactly 3607 s with the API audiences
gets upstream's extended lifetime (a year, with `warnafter` at 3607 s), as kube-apiserver
does with `--service-account-extend-token-expiration`.

`POST /apis/authentication.k8s.io/v1/tokenreviews` says whether a token authenticates and
as whom. `GET /.well-known/openid-configuration` and `GET /openid/v1/jwks` publish the
issuer and its public keys, so a token can be verified (federated) elsewhere; RBAC grants
them to `system:serviceaccounts` (`system:service-account-issuer-discovery`).
Called from `handlers` (discovery paths, review kinds) and `subresources.HANDLERS`.
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson
from aiohttp import web

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import requests as req
from socialweb_computer.auth import serviceaccounts, tokens

Object = dict[str, Any]

GROUP = "authentication.k8s.io"
MIN_EXPIRATION_SECONDS = 10 * 60
MAX_EXPIRATION_SECONDS = 1 << 32
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"
_BINDABLE = {"Pod": "pods", "Secret": "secrets", "Node": "nodes"}


def _token_request_invalid(name: str, field: str, value: Any, why: str) -> errors.StatusError:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    cause = errors.Cause("FieldValueInvalid", f"Invalid value: {shown}: {why}", field)
    return errors.invalid("TokenRequest", name, [cause], GROUP)


async def handle_token(request: web.Request, cluster: Any, kind: kinds.KindInfo,
                       rr: req.ResourceRequest) -> web.StreamResponse:
    from socialweb_computer.apiserver import handlers

    if request.method != "POST":
        raise errors.method_not_allowed()
    body, _ = await handlers.decode_object(request, "TokenRequest")
    await cluster.auth.admit_token_request(body)  # NodeRestriction runs before the registry's checks
    return handlers.json_response(await create_token(cluster, rr.namespace, rr.name, body), 201)


async def create_token(cluster: Any, namespace: str, name: str, body: Object) -> Object:
    """TokenREST.Create: the TokenRequest answer for ServiceAccount `namespace/name`."""
    service: serviceaccounts.TokenService = cluster.tokens
    store = cluster.store
    meta = dict(body.get("metadata") or {})
    if meta.get("name") and meta["name"] != name:
        raise _token_request_invalid(name, "metadata.name", meta["name"],
                                     "must match the service account name if specified")
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise _token_request_invalid(name, "metadata.namespace", meta["namespace"],
                                     "must match the service account namespace if specified")
    account = await store.get(store.registry.lookup("", "v1", "serviceaccounts"), namespace, name)
    account_uid = account["metadata"].get("uid", "")
    if meta.get("uid") and meta["uid"] != account_uid:
        raise errors.conflict("TokenRequest", name, GROUP,
                              f"the UID in the token request ({meta['uid']}) does not match the UID of the "
                              f"service account ({account_uid})")
    spec = dict(body.get("spec") or {})
    audiences = [str(a) for a in spec.get("audiences") or []] or list(service.audiences)
    expiration = spec.get("expirationSeconds")
    if expiration is None:
        expiration = serviceaccounts.DEFAULT_EXPIRATION_SECONDS
    if not isinstance(expiration, int) or isinstance(expiration, bool):
        raise errors.bad_request(f"spec.expirationSeconds: expected an integer, got {expiration!r}")
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    if expiration < MIN_EXPIRATION_SECONDS:
        raise _token_request_invalid("", "spec.expirationSeconds", expiration,
                                     "may not specify a duration less than 10 minutes")
    if expiration > MAX_EXPIRATION_SECONDS:
        raise _token_request_invalid("", "spec.expirationSeconds", expiration,
                                     "may not specify a duration larger than 2^32 seconds")
    pod, secret, node = await _bound_objects(cluster, namespace, name, spec.get("boundObjectRef"))
    token_seconds, warn_after = expiration, 0
    if (pod is not None and expiration == serviceaccounts.WARN_ONLY_EXPIRATION_SECONDS
            and service.is_api_audiences(audiences)):
        token_seconds, warn_after = serviceaccounts.EXTENDED_EXPIRATION_SECONDS, expiration
    issued = service.issue(account, audiences=audiences, expiration_seconds=token_seconds, pod=pod,
                           secret=secret, node=node, warn_after_seconds=warn_after, now=now)
    out_meta = {"name": name, "namespace": namespace, "uid": account_uid,
                "creationTimestamp": objects.rfc3339(now)}
    out_spec: Object = {"audiences": audiences, "expirationSeconds": expiration,
                        "boundObjectRef": spec.get("boundObjectRef")}
    status = {"token": issued.token,
              "expirationTimestamp": objects.rfc3339(now + datetime.timedelta(seconds=expiration))}
    return {"kind": "TokenRequest", "apiVersion": f"{GROUP}/v1", "metadata": out_meta, "spec": out_spec,
            "status": status}


async def _bound_objects(cluster: Any, namespace: str, account: str,
                         ref: Any) -> tuple[Object | None, Object | None, Object | None]:
    if not ref:
        return None, None, None
    if not isinstance(ref, dict):
        raise errors.bad_request("spec.boundObjectRef: expected an object")
    api_version, kind_name = str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    version = api_version.rpartition("/")[2]
    plural = _BINDABLE.get(kind_name) if group == "" else None
    if plural is None:
        raise errors.bad_request(f"cannot bind token to object of type {group}/{version}, Kind={kind_name}")
    store = cluster.store
    obj = await store.get(store.registry.lookup("", "v1", plural), "" if plural == "nodes" else namespace,
                          str(ref.get("name") or ""))
    pod = secret = node = None
    if plural == "pods":
        pod = obj
        if (obj.get("spec") or {}).get("serviceAccountName") != account:
            raise errors.bad_request(f'cannot bind token for serviceaccount "{account}" to pod running with '
                                     "different serviceaccount name.")
        node_name = (obj.get("spec") or {}).get("nodeName")
        if node_name:
            try:
                node = await store.get(store.registry.lookup("", "v1", "nodes"), "", node_name)
            except errors.StatusError as e:
                if e.code != 404:
                    raise
                node = {"metadata": {"name": node_name}}  # named in the claims even when gone
    elif plural == "secrets":
        secret = obj
    else:
        node = obj
    uid = obj["metadata"].get("uid", "")
    if ref.get("uid") and ref["uid"] != uid:
        raise errors.conflict(kind_name, str(ref.get("name") or ""), "",
                              f"the UID in the bound object reference ({ref['uid']}) does not match the UID "
                              "in record. The object might have been deleted and then recreated")
    return pod, secret, node


async def token_review(cluster: Any, kind: kinds.KindInfo, body: Object) -> Object:
    spec = body.get("spec") or {}
    token = spec.get("token")
    if not token:
        raise errors.bad_request(f"token is required for TokenReview in {GROUP}")
    service: serviceaccounts.TokenService = cluster.tokens
    status: Object = {"user": {}}
    try:
        result = await service.authenticate(str(token), tuple(str(a) for a in spec.get("audiences") or ()))
    except tokens.NotOurs:
        pass
    except tokens.TokenInvalid as e:
        status["error"] = f"[invalid bearer token, {e}]"
    else:
        status = {"authenticated": True, "user": result.user.to_dict(), "audiences": list(result.audiences)}
    return {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": {"creationTimestamp": None},
            "spec": spec, "status": status}


def discovery_document(service: serviceaccounts.TokenService) -> Object:
    return {
        "issuer": service.issuer,
        "jwks_uri": f"{service.issuer}{JWKS_PATH}",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [tokens.ALGORITHM],
    }


async def handle_discovery(request: web.Request, cluster: Any) -> web.StreamResponse:
    """The two OIDC documents; only GET, and only for an issuer that is an https URL (as upstream)."""
    service: serviceaccounts.TokenService = cluster.tokens
    if not service.issuer.startswith("https://"):
        raise errors.resource_not_found_message()
    if request.method != "GET":
        raise errors.method_not_allowed()
    headers = {"Cache-Control": "public, max-age=3600"}
    if request.path.rstrip("/") == DISCOVERY_PATH:
        return web.Response(body=orjson.dumps(discovery_document(service)), content_type="application/json",
                            headers=headers)
    return web.Response(body=orjson.dumps(service.keys.jwks()), content_type="application/jwk-set+json",
                        headers=headers)


def is_discovery_path(path: str) -> bool:
    return path.rstrip("/") in (DISCOVERY_PATH, JWKS_PATH)
