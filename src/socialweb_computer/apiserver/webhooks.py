"""Calling admission webhooks: MutatingWebhookConfigurations and ValidatingWebhookConfigurations.

Why: operators install webhooks (policy engines, cert-manager, sidecar injectors) and expect
them to be called on every matching write, as kube-apiserver's MutatingAdmissionWebhook and
ValidatingAdmissionWebhook plugins do. The store calls this module in two places of its
write path (see store.py): `mutate` after defaults and before validation, `validate` after
validation and just before the write (and for deletes, before the delete).

What it does, as upstream does:
- matching: `rules` (operations, apiGroups, apiVersions, resources with `x/y` subresources
  and `*`, scope), `namespaceSelector` (the namespace's labels; a Namespace's own; always
  for other cluster-scoped objects), `objectSelector` (new or old object's labels);
  webhooks never see admissionregistration.k8s.io objects, so a broken webhook cannot lock
  its own configuration;
- the call: POST of an `admission.k8s.io/v1` AdmissionReview (v1beta1 when that is all
  `admissionReviewVersions` allows) to `clientConfig.url` with `?timeout=<n>s`, TLS verified
  against `clientConfig.caBundle` (or the system roots), in `timeoutSeconds`;
- mutating webhooks one after another in name order, each `JSONPatch` applied; validating
  webhooks at once (asyncio.gather);
- a denial is upstream's Status (`admission webhook "x" denied the request: ...`, code from
  the webhook, at least 400); a failed call under `failurePolicy: Fail` is a 500
  `failed calling webhook "x": ...`, under `Ignore` the webhook is skipped; a dry-run request
  to a webhook with side effects is refused (`does not support dry run`).

Not done (docs/api-engine.md): `clientConfig.service` (the server cannot reach Services'
cluster IPs: such a call fails, and `failurePolicy` decides), `matchConditions` (CEL; the
webhook is called as if they held), `reinvocationPolicy: IfNeeded`, the webhooks' warnings,
and ValidatingAdmissionPolicies.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds, selectors
from socialweb_computer.apiserver.patching import jsonpatch
from socialweb_computer.auth import policy

log = logging.getLogger(__name__)
Object = dict[str, Any]
GROUP = "admissionregistration.k8s.io"
MUTATING, VALIDATING = "mutatingwebhookconfigurations", "validatingwebhookconfigurations"
NO_SIDE_EFFECTS = ("None", "NoneOnDryRun")
_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


@dataclass(frozen=True)
class Request:
    """One write as webhooks see it."""

    kind: kinds.KindInfo
    operation: str  # CREATE, UPDATE, DELETE
    namespace: str
    name: str
    subresource: str
    new: Object | None
    old: Object | None
    dry_run: bool
    field_manager: str = ""


class WebhookError(Exception):
    """The call did not produce an answer (connection, TLS, timeout, malformed response)."""


def _rule_matches(rule: Object, request: Request) -> bool:
    kind = request.kind
    if not _any_of(rule.get("operations"), request.operation):
        return False
    if not _any_of(rule.get("apiGroups"), kind.group) or not _any_of(rule.get("apiVersions"), kind.version):
        return False
    scope = rule.get("scope") or "*"
    if scope != "*" and scope != ("Namespaced" if kind.namespaced else "Cluster"):
        return False
    for resource in rule.get("resources") or []:
        main, _, sub = str(resource).partition("/")
        if main not in ("*", kind.plural):
            continue
        if (sub == "" and not request.subresource) or sub == "*" or (sub and sub == request.subresource):
            return True
    return False


def _any_of(values: Any, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def _labels(obj: Object | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _selects(selector: Any, labels: dict[str, str]) -> bool:
    try:
        return selectors.from_label_selector_object(selector if selector is not None else {}).matches(labels)
    except ValueError:
        return False


class WebhookAdmission:
    """Kept by the store's write hooks: the webhook configurations, and the calls to them."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.configurations: dict[str, dict[str, Object]] = {MUTATING: {}, VALIDATING: {}}
        self._session: aiohttp.ClientSession | None = None
        store.after_write.append(self._after_write)

    async def start(self) -> None:
        from socialweb_computer.apiserver import store as store_mod

        for plural in (MUTATING, VALIDATING):
            kind = self.store.registry.lookup(GROUP, "v1", plural)
            if kind is None:
                continue
            listed = await self.store.list(kind, "", store_mod.ListOptions())
            for item in listed["items"]:
                self.configurations[plural][item["metadata"]["name"]] = item

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group != GROUP or kind.plural not in self.configurations:
            return
        if event == "DELETED":
            self.configurations[kind.plural].pop((old or {}).get("metadata", {}).get("name", ""), None)
        elif new is not None:
            self.configurations[kind.plural][new["metadata"]["name"]] = new

    @property
    def active(self) -> bool:
        return any(self.configurations.values())

    # ------------------------------------------------------------ entry points

    async def mutate(self, request: Request) -> Object | None:
        """The object after every matching mutating webhook (None when none matched)."""
        if not self.configurations[MUTATING] or request.kind.group == GROUP:
            return None
        obj, changed = request.new, False
        for hook in await self._matching(MUTATING, request):
            current = Request(**{**request.__dict__, "new": obj})
            response = await self._call_or_fail(hook, current)
            if response is None:
                continue
            patch = response.get("patch")
            if patch and response.get("patchType") == "JSONPatch":
                try:
                    patched = jsonpatch.json_patch(obj, base64.b64decode(patch))
                except (errors.StatusError, ValueError) as e:
                    raise errors.internal(f'failed calling webhook "{hook["name"]}": JSONPatch could not be '
                                          f"applied: {getattr(e, 'message', e)}") from None
                if not isinstance(patched, dict):
                    raise errors.internal(f'failed calling webhook "{hook["name"]}": the patched object is '
                                          "not an object")
                obj, changed = patched, True
        return obj if changed else None

    async def validate(self, request: Request) -> None:
        if not self.configurations[VALIDATING] or request.kind.group == GROUP:
            return
        hooks = await self._matching(VALIDATING, request)
        if hooks:
            await asyncio.gather(*(self._call_or_fail(hook, request) for hook in hooks))

    # ------------------------------------------------------------ matching

    async def _matching(self, plural: str, request: Request) -> list[Object]:
        found = []
        namespace_labels: dict[str, str] | None = None
        for name in sorted(self.configurations[plural]):
            for hook in self.configurations[plural][name].get("webhooks") or []:
                if not isinstance(hook, dict) or not any(
                        _rule_matches(r, request) for r in hook.get("rules") or [] if isinstance(r, dict)):
                    continue
                if not (_selects(hook.get("objectSelector"), _labels(request.new))
                        or _selects(hook.get("objectSelector"), _labels(request.old))):
                    continue
                if namespace_labels is None:
                    namespace_labels = await self._namespace_labels(request)
                if not _selects(hook.get("namespaceSelector"), namespace_labels):
                    continue
                found.append(hook)
        return found

    async def _namespace_labels(self, request: Request) -> dict[str, str]:
        if request.kind.group == "" and request.kind.plural == "namespaces":
            return _labels(request.new or request.old)
        if not request.kind.namespaced:
            return {}
        kind = self.store.registry.lookup("", "v1", "namespaces")
        try:
            namespace = await self.store.get(kind, "", request.namespace)
        except errors.StatusError:
            return {}
        return _labels(namespace)

    # ------------------------------------------------------------ calling

    async def _call_or_fail(self, hook: Object, request: Request) -> Object | None:
        """The webhook's allowed response, None when it was skipped; raises a denial or failure."""
        name = str(hook.get("name") or "")
        if request.dry_run and hook.get("sideEffects") not in NO_SIDE_EFFECTS:
            raise errors.bad_request(f'admission webhook "{name}" does not support dry run')
        try:
            response = await self._call(hook, request)
        except WebhookError as e:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("failed calling webhook %r (ignored by its failurePolicy): %s", name, e)
                return None
            raise errors.internal(f'failed calling webhook "{name}": {e}') from None
        if not response.get("allowed"):
            raise _denied(name, response.get("status"))
        return response

    async def _call(self, hook: Object, request: Request) -> Object:
        config = hook.get("clientConfig") or {}
        url = config.get("url")
        if not url:
            raise WebhookError("clientConfig.service is not reached by this server (it cannot route to "
                               "Services); give the webhook a clientConfig.url")
        timeout = int(hook.get("timeoutSeconds") or 10)
        versions = [v for v in hook.get("admissionReviewVersions") or [] if v in ("v1", "v1beta1")]
        if not versions:
            raise WebhookError(f"webhook does not accept v1 or v1beta1 AdmissionReview: "
                               f"{hook.get('admissionReviewVersions')}")
        uid = str(uuid.uuid4())
        review = {"apiVersion": f"admission.k8s.io/{versions[0]}", "kind": "AdmissionReview",
                  "request": _review_request(uid, request)}
        target = f"{url}{'&' if '?' in url else '?'}timeout={timeout}s"
        try:
            async with self._client().post(
                    target, data=orjson.dumps(review),
                    headers={"Content-Type": "application/json", "Accept": "application/json"},
                    ssl=_tls(config.get("caBundle")), timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
                body = await answer.read()
                if answer.status != 200:
                    raise WebhookError(f"the server responded with the status code {answer.status} but "
                                       "did not return an AdmissionReview")
        except TimeoutError:
            deadline = "context deadline exceeded"
            raise WebhookError(f'failed to call webhook: Post "{target}": {deadline}') from None
        except (aiohttp.ClientError, ssl.SSLError, OSError) as e:
            raise WebhookError(f'failed to call webhook: Post "{target}": {e}') from None
        try:
            answer_review = orjson.loads(body)
            response = answer_review["response"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise WebhookError("received invalid webhook response: the response is not an AdmissionReview "
                               "with a response") from None
        if not isinstance(response, dict):
            raise WebhookError("received invalid webhook response: response is not an object")
        if response.get("uid") != uid:
            raise WebhookError(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
        return response

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session


def _tls(ca_bundle: Any) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_bundle:
        try:
            context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
        except (ValueError, ssl.SSLError) as e:
            raise WebhookError(f"the caBundle is not a PEM certificate bundle: {e}") from None
    return context


def _user_info() -> Object:
    context = policy.REQUEST.get()
    if context is None:
        return {"username": "system:apiserver", "groups": ["system:masters"]}
    user = context.attrs.user
    info: Object = {"username": user.name, "groups": list(user.groups)}
    if user.uid:
        info["uid"] = user.uid
    extra = dict(user.extra) if user.extra else {}
    if extra:
        info["extra"] = {k: list(v) for k, v in extra.items()}
    return info


def _typed(request: Request, obj: Object | None) -> Object | None:
    if obj is None:
        return None
    return {**obj, "apiVersion": request.kind.api_version, "kind": request.kind.kind}


def _review_request(uid: str, request: Request) -> Object:
    kind = request.kind
    gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
    gvr = {"group": kind.group, "version": kind.version, "resource": kind.plural}
    out: Object = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr}
    if request.subresource:
        out["subResource"] = out["requestSubResource"] = request.subresource
    if request.name:
        out["name"] = request.name
    if request.namespace:
        out["namespace"] = request.namespace
    out.update({"operation": request.operation, "userInfo": _user_info(),
                "object": _typed(request, request.new), "oldObject": _typed(request, request.old),
                "dryRun": request.dry_run})
    options: Object = {"kind": _OPTIONS_KIND[request.operation], "apiVersion": "meta.k8s.io/v1"}
    if request.field_manager and request.operation != "DELETE":
        options["fieldManager"] = request.field_manager
    out["options"] = options
    return out


def _denied(name: str, status: Any) -> errors.StatusError:
    """webhookerrors.ToStatusErr."""
    status = status if isinstance(status, dict) else {}
    denied = f'admission webhook "{name}" denied the request'
    code = status.get("code") if isinstance(status.get("code"), int) else 0
    message = str(status.get("message") or "")
    reason = str(status.get("reason") or "")
    text = f"{denied}: {message}" if message else (f"{denied}: {reason}" if reason else
                                                   f"{denied} without explanation")
    details = status.get("details") if isinstance(status.get("details"), dict) else None
    return errors.StatusError(max(code, 400), reason, text, details)
