"""Protobuf request bodies: the wire reader, the decoder, and real kubectl 1.37 traffic.

The end-to-end half runs the pinned kubectl against a small recording HTTPS server
(aiohttp on 127.0.0.1, throwaway certificates) that answers discovery and echoes
created objects back as JSON. Each protobuf body kubectl sent is decoded and compared
with what the same command prints with `--dry-run=client -o json`, which is the JSON
kubectl would have sent. Commands without a dry-run (auth can-i, whoami) are checked
by shape.

Needs the generated field table: the test scripts run
`python -m socialweb_computer.apiserver.protobuf.build` first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from socialweb_computer import debian
from socialweb_computer.api import errors
from socialweb_computer.apiserver import protobuf
from socialweb_computer.apiserver.protobuf import build, decoder, gotypes, protofile, table, wire
from socialweb_computer.testing import pki

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
PB = "application/vnd.kubernetes.protobuf"


@pytest.fixture(scope="module", autouse=True)
def _field_table() -> None:
    try:
        protobuf.check_table()
    except protobuf.TableMissingError as exc:
        pytest.fail(str(exc), pytrace=False)


# ---------------------------------------------------------------- message building helpers

def key(number: int, wire_type: int) -> bytes:
    return wire.encode_varint(number << 3 | wire_type)


def varint_field(number: int, value: int) -> bytes:
    return key(number, wire.VARINT) + wire.encode_varint(value)


def bytes_field(number: int, value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return key(number, wire.LEN) + wire.encode_varint(len(raw)) + raw


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = bytes_field(1, api_version) + bytes_field(2, kind)
    # kubectl writes contentEncoding and contentType too, as empty strings.
    unknown = bytes_field(1, type_meta) + bytes_field(2, raw) + bytes_field(3, "") + bytes_field(4, "")
    return b"k8s\x00" + unknown


def object_meta(name: str = "", namespace: str = "") -> bytes:
    return bytes_field(1, name) + bytes_field(3, namespace)


# ---------------------------------------------------------------- wire reader

def test_varints_one_to_ten_bytes() -> None:
    for value in (0, 1, 127, 128, 300, 2**31 - 1, 2**32, 2**63, 2**64 - 1):
        encoded = wire.encode_varint(value)
        assert wire.read_varint(encoded, 0) == (value, len(encoded))
    assert wire.read_varint(bytes([0xAC, 0x02]), 0) == (300, 2)


def test_negative_int32_is_ten_byte_varint() -> None:
    encoded = wire.encode_varint(-5)
    assert len(encoded) == 10
    value, _ = wire.read_varint(encoded, 0)
    assert wire.as_int32(value) == -5
    assert wire.as_int64(value) == -5


def test_zigzag_is_available_though_kubernetes_does_not_use_it() -> None:
    assert [wire.zigzag(v) for v in (0, 1, 2, 3, 4)] == [0, -1, 1, -2, 2]


def test_fields_in_wire_order_with_all_wire_types() -> None:
    data = (varint_field(1, 150) + bytes_field(2, "hi") + key(3, wire.FIXED64) + (1).to_bytes(8, "little")
            + key(4, wire.FIXED32) + (7).to_bytes(4, "little") + varint_field(1, 3))
    fields = wire.parse(data)
    assert [f.value for f in fields[1]] == [150, 3]
    assert fields[2][0].value == b"hi"
    assert fields[3][0].value == 1
    assert fields[4][0].value == 7


def test_packed_repeated() -> None:
    packed = b"".join(wire.encode_varint(v) for v in (1, 300, 5))
    assert wire.unpack_varints(packed) == [1, 300, 5]
    assert wire.unpack_fixed((1).to_bytes(4, "little") + (2).to_bytes(4, "little"), 4) == [1, 2]
    with pytest.raises(wire.WireError):
        wire.unpack_fixed(b"\x01\x02\x03", 4)


@pytest.mark.parametrize("data", [
    b"\x08",  # key without value
    b"\x08\xff\xff",  # unterminated varint
    b"\x12\x05ab",  # length past the end
    b"\x0b",  # group start (wire type 3)
    b"\x00\x01",  # field number 0
    b"\x08" + b"\xff" * 11,  # varint too long
    b"\x0d\x01\x02",  # truncated fixed32
])
def test_malformed_wire_data(data: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.parse(data)


# ---------------------------------------------------------------- .proto reader

def test_proto_parser_reads_proto3_fields_and_their_oneof() -> None:
    parsed = protofile.parse("""
        syntax = "proto3";
        package openapi.v2;
        message Item {
          string plain = 3;
          oneof oneof {
            Item item = 1;
            bool boolean = 2;
          }
        }
    """)
    (item,) = parsed.messages
    assert [(f.name, f.number, f.label, f.oneof) for f in item.fields] == [
        ("plain", 3, "optional", ""), ("item", 1, "optional", "oneof"), ("boolean", 2, "optional", "oneof")]


def test_proto_parser_handles_the_generated_syntax() -> None:
    parsed = protofile.parse("""
        // comment
        syntax = "proto2";
        package k8s.io.api.demo.v1;
        import "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto";
        option go_package = "k8s.io/api/demo/v1";
        /* block
           comment */
        message Demo {
          optional k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta metadata = 1;
          repeated string names = 2;
          map<string, Inner> byName = 3;
          optional int32 count = 4 [default = 0];
          repeated int32 packed = 5 [packed = true];
          message Inner { optional bytes raw = 1; }
          reserved 6;
        }
    """)
    assert parsed.package == "k8s.io.api.demo.v1"
    assert parsed.imports == ["k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto"]
    demo, inner = parsed.messages
    assert demo.full_name == "k8s.io.api.demo.v1.Demo"
    assert inner.full_name == "k8s.io.api.demo.v1.Demo.Inner"
    assert [(f.name, f.number, f.label) for f in demo.fields] == [
        ("metadata", 1, "optional"), ("names", 2, "repeated"), ("byName", 3, "map"), ("count", 4, "optional"),
        ("packed", 5, "repeated")]
    assert demo.fields[2].value_type == "Inner"
    assert demo.fields[4].packed
    known = {"k8s.io.api.demo.v1.Demo", "k8s.io.api.demo.v1.Demo.Inner",
             "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    assert protofile.resolve_type("Inner", demo.full_name, known) == "k8s.io.api.demo.v1.Demo.Inner"
    assert protofile.resolve_type("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", demo.full_name, known) \
        == "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def test_proto_parser_rejects_groups() -> None:
    with pytest.raises(protofile.ProtoSyntaxError):
        protofile.parse("message A { optional group G = 1 { optional int32 x = 1; } }")


# ---------------------------------------------------------------- build step (offline parts)

DEMO_PROTO = """
syntax = "proto2";
package k8s.io.api.demo.v1;
import "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto";
message Widget {
  optional .k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta metadata = 1;
  optional int32 replicas = 2;
  optional int32 minReady = 3;
  optional string uID = 4;
  optional Source source = 5;
  map<string, Extra> extra = 6;
}
message Source { optional string path = 1; }
message Extra { repeated string items = 1; }
"""
DEMO_GO = """
package v1

// Widget is a demo.
type Widget struct {
\tmetav1.TypeMeta `json:",inline"`
\tmetav1.ObjectMeta `json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`
\t// replicas is a pointer
\tReplicas *int32 `json:"replicas,omitempty" protobuf:"varint,2,opt,name=replicas"`
\tMinReady int32 `json:"minReady,omitempty" protobuf:"varint,3,opt,name=minReady"`
\tUID types.UID `json:"uid" protobuf:"bytes,4,opt,name=uID,casttype=k8s.io/apimachinery/pkg/types.UID"`
\tSource `json:",inline" protobuf:"bytes,5,opt,name=source"`
\tExtra map[string]Extra `json:"extra,omitempty" protobuf:"bytes,6,rep,name=extra"`
}

type Source struct {
\tPath string `json:"path,omitempty" protobuf:"bytes,1,opt,name=path"`
}

type Extra []string
"""
DEMO_REGISTER = """
package v1
const GroupName = "demo.example.com"
func addKnownTypes(scheme *runtime.Scheme) error {
\tscheme.AddKnownTypes(SchemeGroupVersion,
\t\t&Widget{},
\t)
\treturn nil
}
"""
META_PROTO = """
syntax = "proto2";
package k8s.io.apimachinery.pkg.apis.meta.v1;
message ObjectMeta { optional string name = 1; }
"""


def test_build_table_joins_proto_numbers_with_go_json_tags(tmp_path: Path) -> None:
    src = tmp_path / build.GO_SRC / "k8s.io"
    demo = src / "api" / "demo" / "v1"
    meta = src / "apimachinery" / "pkg" / "apis" / "meta" / "v1"
    for directory, files in ((demo, {"generated.proto": DEMO_PROTO, "types.go": DEMO_GO,
                                     "register.go": DEMO_REGISTER}),
                             (meta, {"generated.proto": META_PROTO})):
        directory.mkdir(parents=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    built, warnings = build.build_table(tmp_path)
    assert built["kinds"] == {"demo.example.com/v1": {"Widget": "k8s.io.api.demo.v1.Widget"}}
    assert built["messages"]["k8s.io.api.demo.v1.Widget"]["f"] == [
        [1, "metadata", "", "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", "", "e"],
        [2, "replicas", "", "int32", "", "pe"],
        [3, "minReady", "", "int32", "", "e"],
        [4, "uid", "", "string", "", ""],  # the Go json tag wins over go-to-protobuf's "uID"
        [5, "", "", "k8s.io.api.demo.v1.Source", "", "i"],
        [6, "extra", "m", "string", "k8s.io.api.demo.v1.Extra", "e"],
    ]
    assert built["messages"]["k8s.io.api.demo.v1.Extra"]["go"] == "slice"
    assert any("ObjectMeta: no Go struct" in w for w in warnings)


def test_go_field_lines() -> None:
    package = gotypes.GoPackage()
    gotypes.parse_source(DEMO_GO, package)
    replicas = package.structs["Widget"][2]
    assert (replicas.go_name, replicas.go_type, replicas.pointer, replicas.omitempty) == (
        "Replicas", "*int32", True, True)
    source = package.structs["Widget"][5]
    assert source.inline and source.json_name == ""
    assert package.slices == {"Extra"}


def test_build_is_a_no_op_when_the_table_is_current(tmp_path: Path) -> None:
    output = tmp_path / "fields.json"
    output.write_text(json.dumps({"stamp": build.builder_stamp("trixie")}))
    # No cached packages and no network needed: nothing to do.
    assert build.build(output, tmp_path / "cache", "trixie") is False


def test_mirror_comes_from_the_system_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
                      "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian\n"
                      "Suites: bookworm bookworm-updates\nComponents: main\n"
                      f"Signed-By: {deb822}\n")
    one_line = tmp_path / "other.list"
    one_line.write_text("deb [signed-by=/nonexistent] http://other.example/debian stable main\n")
    monkeypatch.delenv(debian.MIRROR_ENV, raising=False)
    monkeypatch.setattr(debian, "_apt_source_files", lambda: [deb822, one_line])
    assert debian.system_mirror() == ("http://mirror.example/debian", str(deb822))
    monkeypatch.setattr(debian, "_apt_source_files", lambda: [one_line])
    assert debian.system_mirror() == ("http://other.example/debian", "")
    monkeypatch.setenv(debian.MIRROR_ENV, "http://override.example/debian")
    assert debian.system_mirror() == ("http://override.example/debian", "")


# ---------------------------------------------------------------- decoder, by hand-made bodies

def test_is_protobuf() -> None:
    assert protobuf.is_protobuf(PB)
    assert protobuf.is_protobuf("Application/Vnd.Kubernetes.Protobuf; charset=utf-8")
    assert not protobuf.is_protobuf("application/json")
    assert not protobuf.is_protobuf("")
    assert not protobuf.is_protobuf(None)


def test_configmap_with_zero_values_dropped_and_bytes_as_base64() -> None:
    entry = bytes_field(1, "k") + bytes_field(2, "v")
    binary_entry = bytes_field(1, "b") + bytes_field(2, b"\x00\xff")
    raw = bytes_field(1, object_meta("cm", "default")) + bytes_field(2, entry) + bytes_field(3, binary_entry)
    assert protobuf.decode(envelope("v1", "ConfigMap", raw)) == {
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "cm", "namespace": "default"},
        "data": {"k": "v"},
        "binaryData": {"b": base64.b64encode(b"\x00\xff").decode()},
    }


def test_pointer_zero_is_kept_plain_zero_is_dropped() -> None:
    spec = varint_field(1, 0) + varint_field(5, 0) + varint_field(7, 0)  # replicas, minReadySeconds, paused
    decoded = protobuf.decode(envelope("apps/v1", "Deployment", bytes_field(2, spec)))
    # As Go prints it: selector is a pointer without omitempty; template and strategy are structs.
    assert decoded["spec"] == {"replicas": 0, "selector": None,
                               "template": {"metadata": {}, "spec": {"containers": None}}, "strategy": {}}


def test_well_known_types() -> None:
    meta = (bytes_field(1, "p") + bytes_field(8, varint_field(1, 1704164645))  # creationTimestamp
            + bytes_field(9, varint_field(1, 1704164645) + varint_field(2, 0)))  # deletionTimestamp
    port = bytes_field(1, "http") + varint_field(2, 0) + varint_field(3, 80) + bytes_field(4, "TCP")
    container = bytes_field(1, "c") + bytes_field(2, "img") + bytes_field(6, port)
    resources = bytes_field(1, bytes_field(1, "cpu") + bytes_field(2, bytes_field(1, "250m")))
    container += bytes_field(8, resources)
    pod_spec = bytes_field(2, container) + varint_field(4, 30)
    decoded = protobuf.decode(envelope("v1", "Pod", bytes_field(1, meta) + bytes_field(2, pod_spec)))
    assert decoded["metadata"] == {"name": "p", "creationTimestamp": "2024-01-02T03:04:05Z",
                                   "deletionTimestamp": "2024-01-02T03:04:05Z"}
    assert decoded["spec"]["terminationGracePeriodSeconds"] == 30
    c = decoded["spec"]["containers"][0]
    assert c["ports"] == [{"name": "http", "containerPort": 80, "protocol": "TCP"}]
    assert c["resources"] == {"limits": {"cpu": "250m"}}


def test_int_or_string() -> None:
    by_number = bytes_field(4, varint_field(1, 0) + varint_field(2, 8080))  # ServicePort.targetPort
    by_name = bytes_field(4, varint_field(1, 1) + bytes_field(3, "http"))
    spec = bytes_field(1, varint_field(3, 80) + by_number) + bytes_field(1, varint_field(3, 81) + by_name)
    decoded = protobuf.decode(envelope("v1", "Service", bytes_field(2, spec)))
    assert decoded["spec"]["ports"] == [{"port": 80, "targetPort": 8080}, {"port": 81, "targetPort": "http"}]


def test_micro_time_keeps_microseconds_and_zero_time_is_omitted() -> None:
    renew = varint_field(1, 1704164645) + varint_field(2, 123456789)
    spec = bytes_field(1, "holder") + bytes_field(3, b"") + bytes_field(4, renew)  # acquireTime is zero
    decoded = protobuf.decode(envelope("coordination.k8s.io/v1", "Lease", bytes_field(2, spec)))
    assert decoded["spec"] == {"holderIdentity": "holder", "renewTime": "2024-01-02T03:04:05.123456Z"}
    go_zero = varint_field(1, -62135596800)
    meta = bytes_field(1, "l") + bytes_field(8, go_zero)
    decoded = protobuf.decode(envelope("coordination.k8s.io/v1", "Lease", bytes_field(1, meta)))
    assert decoded["metadata"] == {"name": "l"}


def test_raw_extension_holds_json() -> None:
    raw = bytes_field(1, object_meta("rev")) + bytes_field(2, bytes_field(1, b'{"spec": {"a": [1]}}')) \
        + varint_field(3, 2)
    assert protobuf.decode(envelope("apps/v1", "ControllerRevision", raw)) == {
        "kind": "ControllerRevision", "apiVersion": "apps/v1", "metadata": {"name": "rev"},
        "data": {"spec": {"a": [1]}}, "revision": 2}


def test_embedded_protobuf_objects_and_their_nesting_limit() -> None:
    def config_map(name: str) -> bytes:
        return envelope("v1", "ConfigMap", bytes_field(1, object_meta(name)))

    listed = envelope("v1", "List", bytes_field(2, bytes_field(1, config_map("a"))))
    assert protobuf.decode(listed)["items"] == [{"kind": "ConfigMap", "apiVersion": "v1",
                                                 "metadata": {"name": "a"}}]
    nested = config_map("deep")
    for _ in range(40):
        nested = envelope("v1", "List", bytes_field(2, bytes_field(1, nested)))
    with pytest.raises(errors.StatusError) as caught:
        protobuf.decode(nested)
    assert caught.value.code == 400
    assert "nest more than" in caught.value.message


def test_go_duration_strings() -> None:
    nanos = (0, 1, 1500, 2_000_000, 1_500_000_000, 90 * 10**9, 3_723_000_000_000, -1_000_000_000)
    assert [decoder.go_duration(n) for n in nanos] == [
        "0s", "1ns", "1.5µs", "2ms", "1.5s", "1m30s", "1h2m3s", "-1s"]


def test_inline_struct_is_merged() -> None:
    empty_dir = bytes_field(2, b"")  # VolumeSource.emptyDir = 2
    volume = bytes_field(1, "scratch") + bytes_field(2, empty_dir)
    pod_spec = bytes_field(1, volume)
    decoded = protobuf.decode(envelope("v1", "Pod", bytes_field(2, pod_spec)))
    assert decoded["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]


def test_unknown_field_numbers_are_reported_not_lost_silently(caplog: pytest.LogCaptureFixture) -> None:
    raw = bytes_field(1, object_meta("ns")) + varint_field(999, 7) + bytes_field(2, bytes_field(998, b""))
    with caplog.at_level(logging.DEBUG, logger=decoder.__name__):
        result = protobuf.decode_report(envelope("v1", "Namespace", raw))
    assert result.object == {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "ns"}, "spec": {},
                             "status": {}}
    assert result.unknown_fields == [
        protobuf.UnknownField("spec", "k8s.io.api.core.v1.NamespaceSpec", 998, "length-delimited", 0, True),
        protobuf.UnknownField("", "k8s.io.api.core.v1.Namespace", 999, "varint", 0, False),
    ]
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "#999" in record.getMessage()
    assert "spec#998" in record.getMessage()


def test_unknown_zero_fields_are_logged_quietly(caplog: pytest.LogCaptureFixture) -> None:
    # What a newer Go client sends for a non-pointer field it knows but left unset.
    raw = bytes_field(1, object_meta("ns")) + varint_field(999, 0)
    with caplog.at_level(logging.DEBUG, logger=decoder.__name__):
        result = protobuf.decode_report(envelope("v1", "Namespace", raw))
    assert [u.number for u in result.unknown_fields] == [999]
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_missing_table_tells_the_operator_what_to_run(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(protobuf.TableMissingError, match=r"python -m \S+\.protobuf\.build"):
        table.load(tmp_path / "fields.json")

    def missing() -> table.Table:
        raise table.TableMissingError("run the build step")

    monkeypatch.setattr(table, "load", missing)
    with pytest.raises(errors.StatusError) as caught:
        protobuf.decode(envelope("v1", "Namespace", b""))
    assert caught.value.code == 500
    assert "run the build step" in caught.value.message


@pytest.mark.parametrize(("body", "code", "fragment"), [
    (b"", 400, "empty data"),
    (b"{}", 400, "does not appear to be a protobuf message"),
    (b"k8s\x00", 400, "empty body"),
    (b"k8s\x00\x0a\x05ab", 400, "unable to decode protobuf envelope"),
    (envelope("v1", "ConfigMap", b"\x0a\x10short"), 400, "unable to decode protobuf body"),
    (envelope("v1", "ConfigMap", b"\x08\x01"), 400, "arrived as varint"),
    (envelope("v1", "NoSuchKind", b""), 400, "no protobuf schema for v1, Kind=NoSuchKind"),
    (envelope("example.com/v1", "Widget", b""), 415, "application/json"),
    (envelope("v1", "", b""), 400, "Kind"),
])
def test_bad_bodies_are_status_errors(body: bytes, code: int, fragment: str) -> None:
    with pytest.raises(errors.StatusError) as caught:
        protobuf.decode(body)
    assert caught.value.code == code
    assert fragment in caught.value.message


def test_delete_options_from_meta() -> None:
    raw = varint_field(1, 0) + bytes_field(4, "Background")  # gracePeriodSeconds is a pointer
    assert protobuf.decode(envelope("v1", "DeleteOptions", raw)) == {
        "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
        "propagationPolicy": "Background"}


# ---------------------------------------------------------------- real kubectl against a recording server

@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    name: str
    kind: str
    namespaced: bool = True
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")


# Just what the commands under test resolve; the real discovery lives in the apiserver.
RESOURCES = [
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "nodes", "Node", namespaced=False),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "pods/eviction", "Eviction", verbs=("create",)),
    Resource("", "v1", "resourcequotas", "ResourceQuota"),
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("apps", "v1", "deployments/scale", "Scale", verbs=("get", "patch", "update")),
    Resource("apps", "v1", "replicasets", "ReplicaSet"),
    Resource("batch", "v1", "jobs", "Job"),
    Resource("batch", "v1", "cronjobs", "CronJob"),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
             namespaced=False),
    Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
    Resource("networking.k8s.io", "v1", "ingresses", "Ingress"),
    Resource("certificates.k8s.io", "v1", "certificatesigningrequests", "CertificateSigningRequest",
             namespaced=False),
    Resource("certificates.k8s.io", "v1", "certificatesigningrequests/approval", "CertificateSigningRequest",
             namespaced=False, verbs=("get", "patch", "update")),
    Resource("", "v1", "serviceaccounts/token", "TokenRequest", verbs=("create",)),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview",
             namespaced=False, verbs=("create",)),
    Resource("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview",
             namespaced=False, verbs=("create",)),
    Resource("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview",
             namespaced=False, verbs=("create",)),
]

DEPLOYMENT = {
    "kind": "Deployment", "apiVersion": "apps/v1",
    "metadata": {"name": "web", "namespace": "default", "uid": "d-1", "resourceVersion": "1"},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "nginx", "image": "nginx",
                                                   "ports": [{"containerPort": 8080}]}]}}},
}
NODE = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1", "uid": "n-1", "resourceVersion": "1"},
        "spec": {}}
SCALE = {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "web", "namespace": "default"},
         "spec": {"replicas": 1}, "status": {"replicas": 1}}
CSR = {"kind": "CertificateSigningRequest", "apiVersion": "certificates.k8s.io/v1",
       "metadata": {"name": "csr1", "uid": "c-1", "resourceVersion": "1"},
       "spec": {"request": "", "signerName": "example.com/signer", "usages": ["client auth"]}}
POD = {"kind": "Pod", "apiVersion": "v1",
       "metadata": {"name": "p1", "namespace": "default", "uid": "p-1", "resourceVersion": "1"},
       "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}}


@dataclass
class Recorded:
    method: str
    path: str
    content_type: str
    body: bytes


class RecordingServer:
    """Discovery, a few canned objects, and an echo for writes; records every request."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()

    def take(self) -> list[Recorded]:
        with self.lock:
            taken, self.requests = self.requests, []
        return taken

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self.lock:
            content_type = request.headers.get("Content-Type", "")
            self.requests.append(Recorded(request.method, request.path, content_type, body))
        path = request.path.rstrip("/")
        if request.method == "GET":
            return self.get(path, request)
        if request.method == "POST":
            return self.post(path, request.content_type, body)
        if request.method == "PUT":
            return web.json_response(_body_object(request.headers.get("Content-Type", ""), body))
        if request.method == "PATCH" and path == "/api/v1/nodes/n1":
            return web.json_response({**NODE, "spec": {"unschedulable": True}})
        if request.method == "PATCH" and path.endswith("/scale"):
            return web.json_response(SCALE)
        if request.method == "PATCH":
            return web.json_response(DEPLOYMENT)
        return _status(405, "MethodNotAllowed", "not here")

    def get(self, path: str, request: web.Request) -> web.Response:
        if path == "/api":
            return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                      "serverAddressByClientCIDRs": [
                                          {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
        if path == "/apis":
            return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": _groups()})
        if path == "/version":
            return web.json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.1"})
        resources = _resource_list(path)
        if resources is not None:
            return web.json_response(resources)
        canned = {"/apis/apps/v1/namespaces/default/deployments/web": DEPLOYMENT, "/api/v1/nodes/n1": NODE,
                  "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr1": CSR}
        if path in canned:
            return web.json_response(canned[path])
        if path == "/api/v1/pods":
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [POD]})
        if path == "/apis/apps/v1/namespaces/default/deployments/web/scale":
            return web.json_response(SCALE)
        return _status(404, "NotFound", "the server could not find the requested resource")

    def post(self, path: str, content_type: str, body: bytes) -> web.Response:
        obj = _body_object(content_type, body)
        kind = obj.get("kind", "")
        if kind == "Eviction":
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                      "status": "Success", "code": 201}, status=201)
        obj.setdefault("metadata", {})
        if kind == "SelfSubjectAccessReview":
            obj["status"] = {"allowed": True}
        elif kind == "SelfSubjectRulesReview":
            obj["status"] = {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                             "nonResourceRules": [], "incomplete": False}
        elif kind == "TokenRequest":
            obj["status"] = {"token": "t0ken", "expirationTimestamp": "2030-01-01T00:00:00Z"}
        elif kind == "SelfSubjectReview":
            obj["status"] = {"userInfo": {"username": "admin", "groups": ["system:masters"]}}
        else:
            parts = path.split("/")
            if "namespaces" in parts and parts.index("namespaces") + 1 < len(parts):
                obj["metadata"].setdefault("namespace", parts[parts.index("namespaces") + 1])
            obj["metadata"].update({"uid": str(uuid.uuid4()), "resourceVersion": "1",
                                    "creationTimestamp": "2024-01-02T03:04:05Z"})
        return web.json_response(obj, status=201)


def _body_object(content_type: str, body: bytes) -> dict[str, Any]:
    # kubectl scale's PUT carries JSON without a Content-Type header.
    return protobuf.decode(body) if protobuf.is_protobuf(content_type) else json.loads(body)


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def _groups() -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for r in RESOURCES:
        if r.group:
            gv = {"groupVersion": f"{r.group}/{r.version}", "version": r.version}
            groups.setdefault(r.group, {"name": r.group, "versions": [gv], "preferredVersion": gv})
    return list(groups.values())


def _resource_list(path: str) -> dict[str, Any] | None:
    for r in RESOURCES:
        group_version = f"{r.group}/{r.version}" if r.group else r.version
        prefix = f"/apis/{group_version}" if r.group else "/api/v1"
        if path == prefix:
            break
    else:
        return None
    entries = []
    for r in RESOURCES:
        if (f"/apis/{r.group}/{r.version}" if r.group else "/api/v1") != path:
            continue
        entry = {"name": r.name, "singularName": "" if "/" in r.name else r.kind.lower(),
                 "namespaced": r.namespaced, "kind": r.kind, "verbs": list(r.verbs)}
        if r.name == "pods/eviction":
            entry.update(group="policy", version="v1")
        if r.name == "deployments/scale":
            entry.update(group="autoscaling", version="v1")
        entries.append(entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": entries}


@dataclass
class Cluster:
    server: RecordingServer
    env: dict[str, str]

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), *args], capture_output=True, text=True, env=self.env,
                                timeout=60, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} is missing; run the project's tool install script", pytrace=False)
    home = tmp_path_factory.mktemp("kubectl-home")
    credentials = pki.generate(home / "pki")
    recorder = RecordingServer()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> None:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=credentials.server_ssl_context())
        await site.start()
        state["runner"] = runner
        state["port"] = runner.addresses[0][1]
        started.set()

    def serve() -> None:
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10), "recording server did not start"
    config = credentials.kubeconfig(f"https://127.0.0.1:{state['port']}")
    config["contexts"][0]["context"]["namespace"] = "default"
    kubeconfig = home / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    env = {"HOME": str(home), "KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"}
    try:
        yield Cluster(recorder, env)
    finally:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def protobuf_writes(recorded: list[Recorded]) -> list[Recorded]:
    return [r for r in recorded if r.method in ("POST", "PUT") and protobuf.is_protobuf(r.content_type)]


def sent_object(cluster: Cluster, *args: str) -> tuple[dict[str, Any], list[protobuf.UnknownField]]:
    cluster.server.take()
    cluster.kubectl(*args)
    writes = protobuf_writes(cluster.server.take())
    assert len(writes) == 1, f"expected one protobuf write from kubectl {' '.join(args)}, got {writes}"
    report = protobuf.decode_report(writes[0].body)
    return report.object, report.unknown_fields


TYPED_COMMANDS = [
    ["create", "namespace", "team-a"],
    ["create", "configmap", "cm", "--from-literal=a=1", "--from-literal=b=two"],
    ["create", "secret", "generic", "s", "--from-literal=user=admin", "--type=Opaque"],
    ["create", "secret", "tls", "tls-s", "--cert={cert}", "--key={key}"],
    ["create", "deployment", "web", "--image=nginx", "--replicas=0", "--port=8080"],
    ["create", "deployment", "multi", "--image=nginx", "--image=busybox", "--replicas=3"],
    ["create", "job", "j", "--image=busybox", "--", "echo", "hi"],
    ["create", "cronjob", "cj", "--image=busybox", "--schedule=*/5 * * * *", "--restart=OnFailure"],
    ["create", "role", "reader", "--verb=get,list", "--resource=pods,deployments.apps",
     "--resource-name=a"],
    ["create", "clusterrole", "cr", "--verb=get", "--non-resource-url=/healthz"],
    ["create", "clusterrole", "agg", "--aggregation-rule=rbac.example.com/aggregate=true"],
    ["create", "rolebinding", "rb", "--role=reader", "--user=alice", "--serviceaccount=default:sa"],
    ["create", "clusterrolebinding", "crb", "--clusterrole=cr", "--group=devs"],
    ["create", "serviceaccount", "sa"],
    ["create", "priorityclass", "high", "--value=1000", "--description=important",
     "--preemption-policy=Never"],
    ["create", "priorityclass", "zero", "--value=0", "--global-default=true"],
    ["create", "poddisruptionbudget", "pdb", "--selector=app=web", "--min-available=50%"],
    ["create", "poddisruptionbudget", "pdb2", "--selector=app=web", "--max-unavailable=1"],
    ["create", "quota", "q", "--hard=cpu=1,memory=1G,pods=10", "--scopes=BestEffort"],
    ["create", "service", "clusterip", "svc", "--tcp=80:8080", "--tcp=443"],
    ["create", "service", "clusterip", "headless", "--clusterip=None"],
    ["create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080"],
    ["create", "service", "loadbalancer", "lb", "--tcp=80"],
    ["create", "service", "externalname", "en", "--external-name=example.com"],
    ["create", "ingress", "ing", "--rule=foo.com/bar*=svc:80,tls=cert", "--class=nginx",
     "--annotation=a=b", "--default-backend=def:http"],
    ["create", "secret", "docker-registry", "d", "--docker-username=u", "--docker-password=p"],
]

# Measured with kubectl 1.37.1: these send JSON, not protobuf (and `scale --current-replicas`
# sends its PUT with no Content-Type header at all).
JSON_COMMANDS = [
    (["run", "pod1", "--image=nginx", "--port=80", "--labels=app=x", "--env=A=1", "--restart=Never",
      "--", "sleep", "10"], "POST", "/api/v1/namespaces/default/pods"),
    (["expose", "deployment", "web", "--port=80", "--target-port=8080", "--name=web-svc"],
     "POST", "/api/v1/namespaces/default/services"),
]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    credentials = pki.generate(tmp_path_factory.mktemp("tls"))
    return {"cert": str(credentials.server_cert_file), "key": str(credentials.server_key_file)}


@pytest.mark.parametrize("command", TYPED_COMMANDS, ids=lambda c: "-".join(c[:3]))
def test_kubectl_typed_command_body_matches_dry_run_json(cluster: Cluster, tls_files: dict[str, str],
                                                          command: list[str]) -> None:
    args = [a.format(**tls_files) for a in command]
    split = args.index("--") if "--" in args else len(args)
    dry_run = [*args[:split], "--dry-run=client", "-o", "json", *args[split:]]
    expected = json.loads(cluster.kubectl(*dry_run).stdout)
    decoded, unknown = sent_object(cluster, *args)
    assert decoded == expected
    assert unknown == []


@pytest.mark.parametrize(("command", "method", "path"), JSON_COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_kubectl_commands_that_send_json(cluster: Cluster, command: list[str], method: str,
                                        path: str) -> None:
    split = command.index("--") if "--" in command else len(command)
    expected = json.loads(cluster.kubectl(*command[:split], "--dry-run=client", "-o", "json",
                                          *command[split:]).stdout)
    cluster.server.take()
    cluster.kubectl(*command)
    writes = [r for r in cluster.server.take() if r.method == method and r.path == path]
    assert [w.content_type for w in writes] == ["application/json"]
    assert json.loads(writes[0].body) == expected


def test_kubectl_create_token_sends_token_request(cluster: Cluster) -> None:
    decoded, unknown = sent_object(cluster, "create", "token", "sa", "--duration=1h", "--audience=api",
                                   "--bound-object-kind=Pod", "--bound-object-name=p1",
                                   "--bound-object-uid=u-1")
    assert decoded == {
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1", "metadata": {},
        "spec": {"audiences": ["api"], "expirationSeconds": 3600,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": "u-1"}},
        # Go prints these non-omitempty zero values; TokenRequestStatus is a plain struct.
        "status": {"token": "", "expirationTimestamp": None},
    }
    assert unknown == []


def test_kubectl_certificate_approve_puts_protobuf(cluster: Cluster) -> None:
    cluster.server.take()
    cluster.kubectl("certificate", "approve", "csr1")
    writes = protobuf_writes(cluster.server.take())
    assert [(w.method, w.path) for w in writes] == [
        ("PUT", "/apis/certificates.k8s.io/v1/certificatesigningrequests/csr1/approval")]
    decoded = protobuf.decode(writes[0].body)
    assert decoded["metadata"] == CSR["metadata"]
    assert decoded["spec"] == CSR["spec"]
    (condition,) = decoded["status"]["conditions"]
    assert condition["type"] == "Approved"
    assert condition["status"] == "True"
    assert condition["reason"] == "KubectlApprove"
    assert condition["lastUpdateTime"].endswith("Z")


def test_kubectl_auth_can_i_sends_self_subject_access_review(cluster: Cluster) -> None:
    decoded, unknown = sent_object(cluster, "auth", "can-i", "create", "deployments.apps",
                                   "--subresource=scale", "-n", "prod")
    assert decoded == {
        "kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
        "metadata": {},
        "spec": {"resourceAttributes": {"namespace": "prod", "verb": "create", "group": "apps",
                                        "resource": "deployments", "subresource": "scale"}},
        "status": {"allowed": False},
    }
    assert unknown == []


def test_self_subject_access_review_wire_layout_matches_the_table(cluster: Cluster) -> None:
    """Reads kubectl's bytes with the wire reader alone, against the field numbers measured by hand."""
    cluster.server.take()
    cluster.kubectl("auth", "can-i", "watch", "deployments.apps/web", "--subresource=status", "-n", "prod")
    (write,) = protobuf_writes(cluster.server.take())
    unknown = wire.parse(write.body[4:])
    spec = wire.parse(unknown[2][0].value)[2][0].value  # Unknown.raw → SelfSubjectAccessReview.spec
    attributes = wire.parse(wire.parse(spec)[1][0].value)  # spec.resourceAttributes
    assert {n: attributes[n][0].value for n in range(1, 8)} == {
        1: b"prod", 2: b"watch", 3: b"apps", 4: b"", 5: b"deployments", 6: b"status", 7: b"web"}
    assert protobuf.decode(write.body)["spec"]["resourceAttributes"] == {
        "namespace": "prod", "verb": "watch", "group": "apps", "resource": "deployments",
        "subresource": "status", "name": "web"}


def test_kubectl_auth_can_i_named_resource_and_non_resource_url(cluster: Cluster) -> None:
    named, _ = sent_object(cluster, "auth", "can-i", "get", "pods/p1")
    # kubectl leaves group and version empty for core resources; empty strings are omitted.
    assert named["spec"] == {"resourceAttributes": {"namespace": "default", "verb": "get", "resource": "pods",
                                                    "name": "p1"}}
    url, _ = sent_object(cluster, "auth", "can-i", "get", "/logs")
    assert url["spec"] == {"nonResourceAttributes": {"path": "/logs", "verb": "get"}}


def test_kubectl_auth_can_i_list_sends_self_subject_rules_review(cluster: Cluster) -> None:
    decoded, unknown = sent_object(cluster, "auth", "can-i", "--list", "-n", "prod")
    assert decoded == {
        "kind": "SelfSubjectRulesReview", "apiVersion": "authorization.k8s.io/v1", "metadata": {},
        "spec": {"namespace": "prod"},
        # Non-omitempty nil slices, exactly as Go's encoding/json prints them.
        "status": {"resourceRules": None, "nonResourceRules": None, "incomplete": False},
    }
    assert unknown == []


def test_kubectl_auth_whoami_sends_self_subject_review(cluster: Cluster) -> None:
    decoded, unknown = sent_object(cluster, "auth", "whoami")
    assert decoded == {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1", "metadata": {},
                       "status": {"userInfo": {}}}
    assert unknown == []


def test_kubectl_drain_sends_policy_v1_eviction_as_json(cluster: Cluster) -> None:
    cluster.server.take()
    cluster.kubectl("drain", "n1", "--force", "--ignore-daemonsets", "--timeout=5s", "--grace-period=7")
    (eviction,) = [r for r in cluster.server.take() if r.path.endswith("/eviction")]
    assert eviction.content_type == "application/json"
    assert json.loads(eviction.body) == {
        "kind": "Eviction", "apiVersion": "policy/v1",
        "metadata": {"name": "p1", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 7},
    }


def test_eviction_protobuf_body_decodes() -> None:
    # Other typed clients (client-go users) do send evictions as protobuf.
    delete_options = varint_field(1, 7)
    raw = bytes_field(1, object_meta("p1", "default")) + bytes_field(2, delete_options)
    assert protobuf.decode(envelope("policy/v1", "Eviction", raw)) == {
        "kind": "Eviction", "apiVersion": "policy/v1",
        "metadata": {"name": "p1", "namespace": "default"},
        "deleteOptions": {"gracePeriodSeconds": 7},
    }
