"""Kubernetes `Status` errors.

Every failure a client can see is raised as `StatusError` and rendered as a
`Status` object, so the wording, code and reason match a real kube-apiserver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One entry of `details.causes` (the JSON key for `type` is `reason`)."""

    reason: str
    message: str
    field: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"reason": self.reason, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


@dataclass
class StatusError(Exception):
    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    causes: list[Cause] = field(default_factory=list)
    retry_after: int | None = None

    def __str__(self) -> str:
        return self.message

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        details = dict(self.details or {})
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        if details or self.details is not None:
            status["details"] = details
        if not self.reason:
            del status["reason"]
        return status


def _details(resource: str, name: str, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"kind": resource}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found', _details(resource, name, group)
    )


def already_exists(resource: str, name: str, group: str = "") -> StatusError:
    return StatusError(
        409,
        "AlreadyExists",
        f'{_qualified(resource, group)} "{name}" already exists',
        _details(resource, name, group),
    )


def conflict(resource: str, name: str, group: str, why: str) -> StatusError:
    message = f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}'
    return StatusError(409, "Conflict", message, _details(resource, name, group))


STALE_OBJECT = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, name: str, causes: list[Cause], group: str = "") -> StatusError:
    """422 Invalid; the message lists the field errors the way apimachinery joins them."""
    summary = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
    if len(causes) > 1:
        summary = "[" + ", ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    return StatusError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details, causes=causes)


def bad_request(message: str) -> StatusError:
    return StatusError(400, "BadRequest", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> StatusError:
    return StatusError(405, "MethodNotAllowed", message)


ACCEPTED_BODY_TYPES = "application/json, application/yaml, application/vnd.kubernetes.protobuf"


def unsupported_media_type(accepted: str = ACCEPTED_BODY_TYPES) -> StatusError:
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {accepted}",
    )


def not_acceptable(message: str) -> StatusError:
    return StatusError(406, "NotAcceptable", message)


def entity_too_large(message: str = "Request entity too large: limit is 3145728") -> StatusError:
    return StatusError(413, "RequestEntityTooLarge", message)


def insufficient_storage() -> StatusError:
    """The store's disk is full: nothing was written (507; not retried, so jobs fail fast)."""
    return StatusError(507, "InsufficientStorage",
                       "the gateway's store is out of disk space: writes are refused until the operator "
                       "frees space on its disk (reads and deletes still work)")


def gone(message: str) -> StatusError:
    return StatusError(410, "Expired", message)


def forbidden(message: str, resource: str = "", name: str = "", group: str = "") -> StatusError:
    return StatusError(403, "Forbidden", message, _details(resource, name, group) if resource else None)


def unauthorized() -> StatusError:
    return StatusError(401, "Unauthorized", "Unauthorized")


def internal(message: str) -> StatusError:
    return StatusError(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )


def too_many_requests(message: str, retry_after: int | None = None) -> StatusError:
    return StatusError(429, "TooManyRequests", message, retry_after=retry_after)


def resource_not_found_message() -> StatusError:
    """What a real server answers for an unknown resource path.

    kubectl turns it into "the server doesn't have a resource type"."""
    return StatusError(
        404,
        "NotFound",
        "the server could not find the requested resource",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )
