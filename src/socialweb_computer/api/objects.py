"""Small helpers over JSON-shaped Kubernetes objects: metadata access, timestamps,
uids, and the name formats apimachinery validates (with its exact messages)."""

from __future__ import annotations

import datetime
import re
import secrets
import uuid
from typing import Any

Object = dict[str, Any]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
              "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
              "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
                  "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
                  "regex used for validation is "
                  "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def meta(obj: Object) -> dict[str, Any]:
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = {}
        obj["metadata"] = m
    return m


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def rfc3339(t: datetime.datetime) -> str:
    return t.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def new_uid() -> str:
    return str(uuid.uuid4())


_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's: no vowels, no look-alikes


def generate_name(base: str) -> str:
    """`generateName` + 5 random characters, as apiserver's SimpleNameGenerator does."""
    base = base[: 63 - 5]
    return base + "".join(secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))


def dns1123_label_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _DNS1123_LABEL.match(value):
        errors.append(_LABEL_MSG)
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append(_SUBDOMAIN_MSG)
    return errors


def path_segment_errors(value: str) -> list[str]:
    """Names that are not DNS-constrained still may not break a URL path."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    for bad in ("/", "%"):
        if bad in value:
            return [f"may not contain '{bad}'"]
    return []


_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QN_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
           "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
           "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
_LV_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
           "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
           "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def qualified_name_errors(value: str) -> list[str]:
    """Label and annotation keys: optional DNS-subdomain prefix, '/', name of at most 63 characters."""
    prefix, _, name = value.rpartition("/")
    errors = []
    if "/" in value and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        errors.extend("prefix part " + e for e in dns1123_subdomain_errors(prefix))
    if not name:
        errors.append("name part must be non-empty")
    else:
        if len(name) > 63:
            errors.append("name part must be no more than 63 characters")
        if not _QUALIFIED_NAME.match(name):
            errors.append(_QN_MSG)
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errors.append(_LV_MSG)
    return errors
