"""Stored bytes: the layout the store writes, and reads that serve it without decoding."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from socialweb_computer.apiserver import kinds, registry, stored
from socialweb_computer.storage import base as storage


def _kind(group: str, version: str, plural: str) -> kinds.KindInfo:
    kind = registry.Registry().lookup(group, version, plural)
    assert kind is not None
    return kind


CONFIGMAP = _kind("", "v1", "configmaps")


def test_encode_puts_type_and_metadata_first_and_drops_the_resource_version() -> None:
    obj = {"data": {"a": "1"}, "metadata": {"name": "x", "resourceVersion": "7"}, "kind": "ConfigMap"}
    value = stored.encode(obj, CONFIGMAP)
    assert value.startswith(b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}')
    assert obj["metadata"]["resourceVersion"] == "7", "the caller's object is left as it was"
    assert list(orjson.loads(value)) == ["apiVersion", "kind", "metadata", "data"]


@pytest.mark.parametrize("obj", [
    {"metadata": {"name": "x", "labels": {"a": "b"}}, "data": {"k": "v"}},
    {"metadata": {}, "data": {}},
    {"metadata": {"name": "ünïcode", "annotations": {"q": "\"quoted\" \\ back"}}},
])
def test_serve_equals_decode_and_finish(obj: dict) -> None:
    value = stored.encode(obj, CONFIGMAP)
    served = orjson.loads(stored.serve(value, 42, stored.header_of(CONFIGMAP)))
    decoded = stored.decode(storage.KeyValue("k", value, 1, 42))
    assert served == decoded
    assert served["metadata"]["resourceVersion"] == "42"
    assert list(served)[:3] == ["apiVersion", "kind", "metadata"]


def test_serve_writes_the_header_of_the_version_asked_for() -> None:
    # Every served version of a kind shares its stored objects (a CRD with two versions).
    v1 = dataclasses.replace(CONFIGMAP, group="example.com", version="v1", kind="Widget", custom=True)
    v2 = dataclasses.replace(v1, version="v2")
    value = stored.encode({"metadata": {"name": "h"}, "spec": {}}, v2)
    served = orjson.loads(stored.serve(value, 3, stored.header_of(v1)))
    assert served["apiVersion"] == "example.com/v1" and served["kind"] == "Widget"


@pytest.mark.parametrize("legacy", [
    b'{"data":{"k":"v"},"metadata":{"name":"x"},"kind":"ConfigMap","apiVersion":"v1"}',
    b'{"metadata":{"name":"x"},"data":{"k":"v"}}',
    b'{"kind":"ConfigMap","metadata":{"name":"x"},"data":{"k":"v"}}',
])
def test_bytes_written_before_this_layout_read_the_same(legacy: bytes) -> None:
    served = orjson.loads(stored.serve(legacy, 9, stored.header_of(CONFIGMAP)))
    assert served == {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"resourceVersion": "9", "name": "x"}, "data": {"k": "v"}}
