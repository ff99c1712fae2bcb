"""/openapi/v2 in protobuf (gnostic's openapi.v2.Document), read back by protoc and used by kubectl.

protoc decodes the bytes with gnostic's own `OpenAPIv2.proto` (from the same Debian package the
build step reads), so the wire encoding is checked by an independent parser; kubectl then uses
the document the way it does against a real cluster: the REST mapper's `no matches for kind`
for a kind the server does not serve, and client-side validation for a create-only kind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer import debian, testing
from socialweb_computer.apiserver import kinds, openapi
from socialweb_computer.apiserver.protobuf import build, openapi_v2

ACCEPT = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


@pytest.fixture(scope="module")
def gnostic_proto() -> Iterator[Path]:
    """gnostic's OpenAPIv2.proto, unpacked from the cached Debian package the build step used."""
    debs = debian.cached_debs(["golang-github-google-gnostic-models-dev"], build.default_cache_dir())
    assert debs, "run `python -m socialweb_computer.apiserver.protobuf.build` first"
    tmp = Path(tempfile.mkdtemp(prefix="gnostic-"))
    debian.extract(debs[0], tmp)
    yield tmp / build.GNOSTIC_V2
    shutil.rmtree(tmp)


def _protoc_decode(proto: Path, data: bytes) -> str:
    protoc = shutil.which("protoc")
    assert protoc, "protoc is missing (scripts/bootstrap.sh --test installs protobuf-compiler)"
    command = [protoc, "-I/usr/include", f"-I{proto.parent}", "--decode=openapi.v2.Document", proto.name]
    out = subprocess.run(command, input=data, capture_output=True, check=True, timeout=120)
    return out.stdout.decode()


def test_every_key_of_the_served_document_has_a_field() -> None:
    encoder = openapi_v2.Encoder()
    encoder.document(openapi.v2_document(kinds.BUILTIN_KINDS))
    assert encoder.unknown == []


def test_protoc_reads_the_document_with_gnostics_proto(gnostic_proto: Path) -> None:
    doc = openapi.v2_document(kinds.BUILTIN_KINDS)
    text = _protoc_decode(gnostic_proto, openapi_v2.encode(doc))
    assert text.startswith('swagger: "2.0"\ninfo {\n  title: "Kubernetes"')
    assert text.count("\n    name: \"io.k8s.") == len(doc["definitions"])  # one NamedSchema each
    assert '_ref: "#/definitions/io.k8s.api.core.v1.Pod"' in text
    # Vendor extensions are YAML in an Any, as gnostic's compiler writes them.
    assert 'name: "x-kubernetes-group-version-kind"' in text
    assert '{\\"group\\":\\"\\",\\"kind\\":\\"Pod\\",\\"version\\":\\"v1\\"}' in text
    # Oneofs: a body parameter, a path parameter, a boolean additionalProperties.
    assert "body_parameter {" in text and "path_parameter_sub_schema {" in text
    assert 'security_definitions {\n  additional_properties {\n    name: "BearerToken"' in text


async def test_encodings_are_shared_by_document() -> None:
    doc = openapi.v2_document(kinds.BUILTIN_KINDS)
    first = await openapi_v2.encode_cached(doc)
    assert openapi_v2.encoded(doc) is first and await openapi_v2.encode_cached(doc) is first
    assert openapi_v2.encoded(dict(doc)) is None  # an equal but other document is not a hit


def test_encoding_of_small_values(gnostic_proto: Path) -> None:
    doc = {
        "swagger": "2.0",
        "info": {"title": "t", "version": "v"},
        "paths": {},
        "definitions": {"a.B": {
            "type": "object", "required": ["x"],
            "properties": {
                "x": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 2.5, "default": 0},
                "m": {"type": "object", "additionalProperties": False},
                "l": {"type": ["array", "null"], "items": {"type": "string"}, "enum": ["a", 1]},
            },
            "x-kubernetes-preserve-unknown-fields": True,
        }},
    }
    text = _protoc_decode(gnostic_proto, openapi_v2.encode(doc))
    assert "minimum" not in text  # proto3: zero scalars are left out
    assert "maximum: 2.5" in text
    assert 'default {\n              yaml: "0\\n"' in text
    assert "additional_properties {\n              boolean: false" in text  # kept: oneof member
    assert 'type {\n              value: "array"\n              value: "null"' in text
    assert 'yaml: "1\\n"' in text


def _get(server: testing.ApiServerProcess, accept: str, etag: str = "") -> subprocess.CompletedProcess[bytes]:
    headers = ["-H", f"Accept: {accept}"] + (["-H", f"If-None-Match: {etag}"] if etag else [])
    return subprocess.run(["curl", "-sS", "--cacert", str(server.ca_file), "--cert", str(server.cert_file),
                           "--key", str(server.key_file), "-D", "-", *headers, f"{server.url}/openapi/v2"],
                          capture_output=True, check=True, timeout=120)


def test_served_with_upstreams_content_type_and_an_etag(shared_apiserver: testing.ApiServerProcess,
                                                        gnostic_proto: Path) -> None:
    head, _, body = _get(shared_apiserver, ACCEPT).stdout.partition(b"\r\n\r\n")
    assert b"200" in head.split(b"\r\n")[0]
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert headers[b"Content-Type"] == b"application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    assert _protoc_decode(gnostic_proto, body).startswith('swagger: "2.0"')
    again = _get(shared_apiserver, ACCEPT, headers[b"ETag"].decode()).stdout
    assert again.split(b"\r\n")[0].endswith(b"304 Not Modified")
    # JSON stays the answer for everyone else; an Accept naming neither is refused as upstream does.
    assert json.loads(_get(shared_apiserver, "application/json").stdout.partition(b"\r\n\r\n")[2])["swagger"]
    refused = _get(shared_apiserver, "application/vnd.kubernetes.protobuf").stdout
    assert b" 406 " in refused.split(b"\r\n")[0]


def test_kubectl_apply_of_an_unknown_kind_says_no_matches(shared_apiserver: testing.ApiServerProcess,
                                                           namespace: str) -> None:
    manifest = {"apiVersion": "example.com/v1", "kind": "Gizmo",
                "metadata": {"name": "g", "namespace": namespace}}
    out = shared_apiserver.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
    assert out.returncode == 1
    assert 'no matches for kind "Gizmo" in version "example.com/v1"' in out.stderr
    assert "ensure CRDs are installed first" in out.stderr


def test_kubectl_validates_a_create_only_kind_from_openapi_v2(
        shared_apiserver: testing.ApiServerProcess) -> None:
    # TokenReview has no PATCH operation in v3, so kubectl validates it client-side from v2.
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": "not-a-token", "bogus": 1}}
    out = shared_apiserver.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review), check=False)
    assert out.returncode == 1
    assert 'unknown field "bogus"' in out.stderr
    assert "io.k8s.api.authentication.v1.TokenReviewSpec" in out.stderr
    del review["spec"]["bogus"]
    out = shared_apiserver.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    assert json.loads(out.stdout)["kind"] == "TokenReview"
