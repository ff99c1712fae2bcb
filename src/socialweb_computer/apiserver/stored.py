"""Objects as the store keeps them, and how reads serve those bytes without decoding them.

The store writes an object as JSON whose first members are `apiVersion`, `kind` and
`metadata`, in that order, without `metadata.resourceVersion` (the revision of the write
is the resourceVersion, and nobody knows it before the write). That fixed start is what
lets a read answer with the stored bytes as they are: `serve()` puts the type header of
the version asked for in front (every served version shares the stored object, see
`keys`) and splices `"resourceVersion":"N"` in as the first member of `metadata`. No
decode and no re-encode: a list, a GET and a watch event all cost a copy of the bytes.

Stored bytes that do not start that way (written before this layout) are decoded and
re-encoded by `serve()` instead, so old data reads the same, only slower.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson

from socialweb_computer.apiserver import kinds
from socialweb_computer.storage import base as storage

Object = dict[str, Any]

# The stored start: an optional type header (names and versions never hold a quote or a
# backslash), then the metadata object opening.
_START = re.compile(rb'\{(?:"apiVersion":"[^"\\]*",)?(?:"kind":"[^"\\]*",)?"metadata":\{')
_TYPE_MEMBERS = ("apiVersion", "kind")


@functools.lru_cache(maxsize=1024)
def type_header(api_version: str, kind: str) -> bytes:
    """`{"apiVersion":...,"kind":...,` — the start of every object of that kind and version."""
    return b'{"apiVersion":' + orjson.dumps(api_version) + b',"kind":' + orjson.dumps(kind) + b","


def header_of(kind: kinds.KindInfo) -> bytes:
    return type_header(kind.api_version, kind.kind)


def encode(obj: Object, kind: kinds.KindInfo) -> bytes:
    """The bytes to store for `obj`: type header and metadata first, no resourceVersion."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    rv = meta.pop("resourceVersion", None)
    try:
        ordered: Object = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}
        for key, value in obj.items():
            if key not in ordered:
                ordered[key] = value
        return orjson.dumps(ordered)
    finally:
        if rv is not None:
            meta["resourceVersion"] = rv


def serve(value: bytes, revision: int, header: bytes) -> bytes:
    """The response bytes of a stored object at `revision` under `header` (see `header_of`)."""
    start = _START.match(value)
    if start is None:
        return _reencode(value, revision, header)
    at = start.end()
    member = b'"metadata":{"resourceVersion":"' + str(revision).encode()
    # An empty metadata object closes at once; anything else needs a separating comma.
    member += b'"' if value[at : at + 1] == b"}" else b'",'
    return b"".join((header, member, memoryview(value)[at:]))


def decode(kv: storage.KeyValue) -> Object:
    """The stored object as a dict, with its resourceVersion (and the stored type header)."""
    obj = orjson.loads(kv.value)
    obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
    return obj


def _reencode(value: bytes, revision: int, header: bytes) -> bytes:
    obj = orjson.loads(value)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    meta = {"resourceVersion": str(revision), **{k: v for k, v in meta.items() if k != "resourceVersion"}}
    rest = {k: v for k, v in obj.items() if k not in _TYPE_MEMBERS and k != "metadata"}
    body = orjson.dumps({"metadata": meta, **rest})
    return header + body[1:]
