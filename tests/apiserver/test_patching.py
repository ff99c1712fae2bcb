"""Tests for the JSON, merge and strategic merge patch types.

Besides fixed expectations, the real kubectl (at .tools/bin/kubectl) serves as an
oracle: `kubectl patch --local` runs apimachinery's own patch code on a file, so
for each case our result (or error message) must equal what it prints.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.api.errors import StatusError
from socialweb_computer.apiserver import patching, schemas
from socialweb_computer.apiserver.patching import jsonpatch, mergepatch, strategic

REJECTED = "the server rejected our request due to an error in our request"


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web", "tier": "fe"},
                     "finalizers": ["a.io/x", "b.io/y"],
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "containers": [
                    {"name": "app", "image": "nginx:1",
                     "ports": [{"containerPort": 80, "protocol": "TCP"},
                               {"containerPort": 443, "protocol": "TCP"}],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                             {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     "args": ["--x", "--y"]},
                    {"name": "side", "image": "busybox", "command": ["sleep", "3600"]},
                ],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
                "tolerations": [{"key": "k1", "operator": "Exists"},
                                {"key": "k2", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
                "nodeSelector": {"disk": "ssd"},
            }},
        },
    }


def pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def configmap(**metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", **metadata},
            "data": {"k": "v"}}


def schema_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    group, _, version = obj["apiVersion"].rpartition("/")
    return schemas.for_kind(group, version, obj["kind"])


def smp(obj: dict[str, Any], patch: Any) -> dict[str, Any]:
    return patching.strategic_merge_patch(obj, patch, schema_of(obj))


def template_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def raises(fn: Any, *args: Any, **kwargs: Any) -> StatusError:
    with pytest.raises(StatusError) as info:
        fn(*args, **kwargs)
    return info.value


# --- Content-Type ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("content_type", "kind"), [
    ("application/json-patch+json", "json"),
    ("application/merge-patch+json", "merge"),
    ("application/strategic-merge-patch+json", "strategic"),
    ("application/apply-patch+yaml", "apply"),
    ("application/merge-patch+json; charset=utf-8", "merge"),
])
def test_patch_type_names_the_accepted_types(content_type: str, kind: str) -> None:
    assert patching.patch_type(content_type) == kind


@pytest.mark.parametrize("content_type", ["application/json", "", "application/apply-patch+cbor",
                                          "application/yaml", "APPLICATION/MERGE-PATCH+JSON"])
def test_builtin_routes_refuse_other_types_like_go_restful(content_type: str) -> None:
    err = raises(patching.patch_type, content_type)
    assert err.to_status()["code"] == 415
    assert err.reason == "UnsupportedMediaType"
    assert err.message == "415: Unsupported Media Type"


def test_handler_refusal_lists_the_patch_types_when_the_route_let_it_through() -> None:
    # go-restful trims the space before ";", the patch handler does not.
    err = raises(patching.patch_type, "application/merge-patch+json ;charset=utf-8")
    assert err.message == ("the body of the request was in an unknown format - accepted media types include: "
                           "application/json-patch+json, application/merge-patch+json, "
                           "application/strategic-merge-patch+json, application/apply-patch+yaml")


def test_custom_resources_refuse_strategic_merge_patch() -> None:
    expected = ("the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml")
    for content_type in ("application/strategic-merge-patch+json", "application/json"):
        err = raises(patching.patch_type, content_type, custom_resource=True)
        assert (err.code, err.reason, err.message) == (415, "UnsupportedMediaType", expected)
    assert patching.patch_type("application/merge-patch+json", custom_resource=True) == "merge"
    status = patching.strategic_not_supported("widgets.example.com").to_status()
    assert status["message"] == expected and status["code"] == 415 and "details" not in status


# --- JSON patch --------------------------------------------------------------------------------------

def jp(obj: dict[str, Any], ops: Any, **kwargs: Any) -> dict[str, Any]:
    return patching.json_patch(obj, json.dumps(ops).encode(), **kwargs)


def test_json_patch_applies_operations_without_touching_the_input() -> None:
    obj = deployment()
    before = copy.deepcopy(obj)
    out = jp(obj, [
        {"op": "replace", "path": "/spec/replicas", "value": 5},
        {"op": "add", "path": "/metadata/labels/new", "value": "x"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "c.io/z"},
        {"op": "test", "path": "/spec/replicas", "value": 5},
        {"op": "copy", "from": "/metadata/labels", "path": "/spec/template/metadata/labels"},
        {"op": "move", "from": "/spec/template/spec/nodeSelector", "path": "/spec/template/spec/ns"},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "slash"},
    ])
    assert obj == before
    assert out["spec"]["replicas"] == 5
    assert out["metadata"]["finalizers"] == ["b.io/y", "c.io/z"]
    assert out["spec"]["template"]["metadata"]["labels"] == out["metadata"]["labels"]
    assert "nodeSelector" not in template_spec(out) and template_spec(out)["ns"] == {"disk": "ssd"}
    assert out["metadata"]["annotations"]["a/b"] == "slash"


def test_json_patch_follows_evanphx_v4_quirks() -> None:
    obj = configmap()
    # replace of a missing member adds it; test of a missing member against null passes;
    # add without a value writes null.
    out = jp(obj, [{"op": "replace", "path": "/metadata/labels", "value": {"a": "b"}},
                   {"op": "test", "path": "/metadata/nothing", "value": None},
                   {"op": "add", "path": "/data/empty"}])
    assert out["metadata"]["labels"] == {"a": "b"} and out["data"]["empty"] is None
    assert jp(obj, None) == obj  # a null body is no operations at all
    assert jp(obj, []) == obj


@pytest.mark.parametrize("ops", [
    [{"op": "test", "path": "/metadata/name", "value": "other"}],
    [{"op": "remove", "path": "/metadata/labels"}],
    [{"op": "add", "path": "/no/such/parent", "value": 1}],
    [{"op": "replace", "path": "/metadata/finalizers/3", "value": "x"}],
    [{"op": "append", "path": "/metadata/name", "value": "x"}],
    [{"op": "bogus", "path": "/x"}],
    [{"path": "/x", "value": 1}],
    [{"op": "add", "value": 1}],
    [{"op": "add", "path": "", "value": {}}],
    [None],
    [{"op": "test", "path": "/metadata/nothing", "value": "x"}],
])
def test_json_patch_failures_are_the_generic_422(ops: Any) -> None:
    err = raises(jp, configmap(finalizers=["a"]), ops)
    assert err.to_status() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": REJECTED, "reason": "Invalid", "code": 422, "details": {}}


@pytest.mark.parametrize(("body", "strict", "lenient"), [
    (b'{"op":"add"}', "json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp",
     "json: cannot unmarshal object into Go value of type jsonpatch.Patch"),
    (b'"x"', "json: cannot unmarshal string into Go value of type []handlers.jsonPatchOp",
     "json: cannot unmarshal string into Go value of type jsonpatch.Patch"),
    (b"[1]", "json: cannot unmarshal number into Go value of type handlers.jsonPatchOp",
     "json: cannot unmarshal number into Go value of type jsonpatch.Operation"),
    (b"[", "unexpected end of JSON input", "unexpected end of JSON input"),
    (b"[{]", "invalid character ']' looking for beginning of object key string",
     "invalid character ']' looking for beginning of object key string"),
])
def test_json_patch_body_errors_are_400(body: bytes, strict: str, lenient: str) -> None:
    err = raises(patching.json_patch, configmap(), body)
    assert (err.code, err.reason, err.message) == (400, "BadRequest", "error decoding patch: " + strict)
    err = raises(patching.json_patch, configmap(), body, field_validation="Ignore")
    assert (err.code, err.message) == (400, lenient)


def test_json_patch_op_fields_must_be_strings_when_decoding_strictly() -> None:
    err = raises(jp, configmap(), [{"op": 1, "path": "/a"}])
    assert err.message == ("error decoding patch: json: cannot unmarshal number into Go struct field "
                           "jsonPatchOp.op of type string")
    # Without strict decoding the op is merely unknown: the generic 422.
    assert raises(jp, configmap(), [{"op": 1, "path": "/a"}], field_validation="Ignore").code == 422


def test_json_patch_operation_limit() -> None:
    ops = [{"op": "test", "path": "/metadata/name", "value": "c"}] * patching.MAX_JSON_PATCH_OPERATIONS
    assert jp(configmap(), ops)["metadata"]["name"] == "c"
    err = raises(jp, configmap(), [*ops, ops[0]])
    assert (err.code, err.reason) == (413, "RequestEntityTooLarge")
    assert err.message == ("Request entity too large: The allowed maximum operations in a JSON patch "
                           "is 10000, got 10001")


# --- JSON merge patch ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("target", "patch", "result"), [  # RFC 7386 appendix A, object documents
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
])
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(target)
    assert patching.merge_patch(target, patch) == result
    assert target == before


def test_merge_patch_prunes_nulls_like_evanphx_v4() -> None:
    doc = {"obj": {"x": 1}, "nul": None}
    out = patching.merge_patch(doc, {"new": [None, {"a": None, "b": 1}], "obj": [None, {"q": None}],
                                     "nul": {"a": 1, "b": None}})
    # New values lose null members (even inside arrays); an array replacing an object is kept as sent.
    assert out == {"obj": [None, {"q": None}], "nul": {"a": 1}, "new": [None, {"b": 1}]}


DECODE_MAP = "error decoding patch: json: cannot unmarshal {} into Go value of type map[string]interface {{}}"


@pytest.mark.parametrize(("body", "strict", "lenient"), [
    (b"[1]", DECODE_MAP.format("array"), None),
    (b'"x"', DECODE_MAP.format("string"), "Invalid JSON Patch"),
    (b"null", "Invalid JSON Patch", "Invalid JSON Patch"),
    (b"{x", "error decoding patch: invalid character 'x' looking for beginning of object key string",
     "Invalid JSON Patch"),
])
def test_merge_patch_body_errors(body: bytes, strict: str, lenient: str | None) -> None:
    err = raises(mergepatch.decode_merge_patch, body)
    assert (err.code, err.message) == (400, strict)
    if lenient is None:
        # Go lets an array through and it replaces the document (nulls pruned).
        doc = patching.patch_object("merge", configmap(), b"[1, null]", field_validation="Ignore")
        assert doc == [1, None]
    else:
        assert raises(mergepatch.decode_merge_patch, body, field_validation="Ignore").message == lenient


# --- strategic merge patch: what kubectl sends ----------------------------------------------------------

def test_kubectl_apply_image_change() -> None:
    patch = {"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
                "containers": [{"image": "nginx:2", "name": "app"}]}}},
             "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": '{"v":2}'}}}
    obj = deployment()
    out = smp(obj, patch)
    expected = deployment()
    template_spec(expected)["containers"][0]["image"] = "nginx:2"
    expected["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = '{"v":2}'
    assert out == expected
    assert obj == deployment()  # inputs untouched
    assert patch["spec"]["template"]["spec"]["$setElementOrder/containers"] == [
        {"name": "app"}, {"name": "side"}]


def test_kubectl_apply_removes_a_container() -> None:
    out = smp(deployment(), {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "app"}],
        "containers": [{"$patch": "delete", "name": "side"}]}}}})
    assert [c["name"] for c in template_spec(out)["containers"]] == ["app"]


def test_env_changes_keep_the_requested_order() -> None:
    out = smp(deployment(), {"spec": {"template": {"spec": {"containers": [{
        "name": "app",
        "$setElementOrder/env": [{"name": "A"}, {"name": "D"}, {"name": "C"}],
        "env": [{"name": "A", "value": "9"}, {"name": "D", "value": "4"},
                {"$patch": "delete", "name": "B"}]}]}}}})
    assert template_spec(out)["containers"][0]["env"] == [
        {"name": "A", "value": "9"}, {"name": "D", "value": "4"},
        {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]


def test_labels_null_deletes_and_finalizers_union() -> None:
    out = smp(deployment(), {"metadata": {"labels": {"tier": None, "new": "x"},
                                          "finalizers": ["c.io/z", "a.io/x"]}})
    assert out["metadata"]["labels"] == {"app": "web", "new": "x"}
    assert out["metadata"]["finalizers"] == ["c.io/z", "a.io/x", "b.io/y"]
    out = smp(deployment(), {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.io/x"]}})
    assert out["metadata"]["finalizers"] == ["b.io/y"]


def test_retain_keys_on_deployment_strategy() -> None:
    out = smp(deployment(), {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": None,
                                                   "type": "Recreate"}}})
    assert out["spec"]["strategy"] == {"type": "Recreate"}
    err = raises(smp, deployment(), {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}})
    assert (err.code, err.reason, err.message) == (400, "BadRequest", "invalid patch format of retainKeys")


def test_tolerations_are_replaced_and_ports_merge_by_container_port() -> None:
    out = smp(deployment(), {"spec": {"template": {"spec": {
        "tolerations": [{"key": "k3", "operator": "Exists"}],
        "containers": [{"name": "app",
                        "ports": [{"containerPort": 8080}, {"containerPort": 80, "name": "http"}]}],
    }}}})
    assert template_spec(out)["tolerations"] == [{"key": "k3", "operator": "Exists"}]
    assert template_spec(out)["containers"][0]["ports"] == [
        {"containerPort": 8080}, {"containerPort": 80, "protocol": "TCP", "name": "http"},
        {"containerPort": 443, "protocol": "TCP"}]


def test_map_directives() -> None:
    out = smp(deployment(), {"spec": {
        "template": {"spec": {"nodeSelector": {"$patch": "replace", "zone": "a"}}},
        "strategy": {"$patch": "delete"}}})
    assert template_spec(out)["nodeSelector"] == {"zone": "a"}
    assert out["spec"]["strategy"] == {}
    replaced = smp(pod(containers=[{"name": "a"}, {"name": "b"}]),
                   {"spec": {"containers": [{"name": "only"}, {"$patch": "replace"}]}})
    assert replaced["spec"]["containers"] == [{"name": "only"}]


def test_without_a_schema_maps_merge_and_lists_are_replaced() -> None:
    obj = {"spec": {"a": {"b": 1, "c": 2}, "list": [{"name": "x", "v": 1}]}}
    out = patching.strategic_merge_patch(obj, {"spec": {"a": {"c": None, "d": 3},
                                                        "list": [{"name": "x", "w": 2}]}}, None)
    assert out == {"spec": {"a": {"b": 1, "d": 3}, "list": [{"name": "x", "w": 2}]}}
    assert patching.strategic_merge_patch(obj, None, None) == obj


# --- strategic merge patch: errors ------------------------------------------------------------------------

@pytest.mark.parametrize(("patch", "code", "message"), [
    ({"spec": {"template": {"spec": {"volumes": [{"hostPath": {"path": "/var/lib/kubelet/pods"}}]}}}}, 400,
     "map: map[hostPath:map[path:/var/lib/kubelet/pods]] does not contain declared merge key: name"),
    ({"spec": {"strategy": {"$patch": "merge"}}}, 400, "unknown patch type: merge in map: map[$patch:merge]"),
    ({"spec": {"template": {"spec": {"containers": [{"name": "app", "$patch": "merge"}]}}}}, 400,
     "merging lists cannot yet be specified in the patch"),
    ({"spec": {"template": {"spec": {"containers": [{"name": "app", "$patch": 7}]}}}}, 400,
     "unknown patch type: %!s(int64=7) in map: map[$patch:7 name:app]"),
    ({"spec": {"template": {"spec": {"containers": [{"name": "x"}, "y"]}}}}, 400,
     "list element types are not identical: [[map[args:[--x --y] "
     "env:[map[name:A value:1] map[name:B value:2] "
     "map[name:C valueFrom:map[fieldRef:map[fieldPath:metadata.name]]]] image:nginx:1 name:app "
     "ports:[map[containerPort:80 protocol:TCP] map[containerPort:443 protocol:TCP]]] "
     "map[command:[sleep 3600] image:busybox name:side]] [map[name:x] y]]"),
    ({"metadata": {"$deleteFromPrimitiveList": ["a"]}}, 400, "invalid patch format of primitive list"),
    ({"metadata": {"$setElementOrderfinalizers": ["a"]}}, 400,
     "invalid patch format of setElementOrder list"),
    ({"metadata": {"$setElementOrder/finalizers": "a"}}, 400,
     "expected a []interface {}, but received a string"),
    ({"spec": {"template": {"spec": {"$setElementOrder/foo": []}}}}, 400,
     'unable to find api field in struct PodSpec for the json field "foo"'),
    ({"spec": {"template": {"spec": {"$deleteFromPrimitiveList/tolerations": [{"key": "k1"}]}}}}, 400,
     "cannot merge lists without merge key for struct"),
    ({"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "side"}],
                                     "containers": [{"name": "app", "image": "q"}]}}}}, 400,
     "The order in patch list:\n[map[image:q name:app]]\n doesn't match $setElementOrder list:\n"
     "[map[name:side]]\n"),
])
def test_strategic_errors_match_the_server(patch: Any, code: int, message: str) -> None:
    err = raises(smp, deployment(), patch)
    assert (err.code, err.message) == (code, message)
    # Upstream answers the merge code's plain errors with a 500; they are the patch's fault: 400.
    assert err.reason == {400: "BadRequest", 422: "Invalid"}[code]


def test_lists_of_lists_are_the_generic_422() -> None:
    err = raises(smp, pod(containers=[]), {"spec": {"containers": [["a"]]}})
    assert (err.code, err.reason, err.message) == (422, "Invalid", REJECTED)


def test_strategic_errors_name_the_go_types() -> None:
    revision = {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "r"},
                "revision": 1, "data": {"a": {"b": 1}}}
    assert raises(smp, revision, {"data": {"a": {"c": 2}}}).message == (
        'unable to find api field in struct RawExtension for the json field "a"')
    cm = configmap(labels={"a": {"x": 1}})
    assert raises(smp, cm, {"metadata": {"labels": {"a": {"y": 2}}}}).message == (
        "merging an object in json but data type is not struct, instead is: map")
    odd = deployment()
    odd["extra"] = {"a": 1}
    assert raises(smp, odd, {"extra": {"b": 2}}).message == (
        'unable to find api field in struct Deployment for the json field "extra"')


def test_strategic_body_errors() -> None:
    schema = schema_of(configmap())
    for body, message in [(b"[1]", DECODE_MAP.format("array").removeprefix("error decoding patch: ")),
                          (b"", "unexpected end of JSON input"),
                          (b"{\"a\" 1}", "invalid character '1' after object key")]:
        err = raises(patching.patch_object, "strategic", configmap(), body, schema=schema)
        assert (err.code, err.message) == (400, message)
    assert patching.patch_object("strategic", configmap(), b"null", schema=schema) == configmap()


# --- Go formatting and JSON syntax wording ------------------------------------------------------------------

@pytest.mark.parametrize(("value", "text"), [
    (1.5, "1.5"), (0.00001, "1e-05"), (2.5e-7, "2.5e-07"), (123456.5, "123456.5"),
    (1234567.5, "1.2345675e+06"),
    (3.0, "3"), (-0.25, "-0.25"), (1e21, "1e+21"), (100.0, "100"),
    ({"b": [1, None, True], "a": "x"}, "map[a:x b:[1 <nil> true]]"),
])
def test_go_fmt(value: Any, text: str) -> None:
    assert strategic.go_fmt(value) == text


@pytest.mark.parametrize(("body", "message"), [
    (b"", "unexpected end of JSON input"),
    (b"  ", "unexpected end of JSON input"),
    (b"x", "invalid character 'x' looking for beginning of value"),
    (b'{"a":1,}', "invalid character '}' looking for beginning of object key string"),
    (b"[1,]", "invalid character ']' looking for beginning of value"),
    (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
    (b"[1 2]", "invalid character '2' after array element"),
    (b"{}}", "invalid character '}' after top-level value"),
    (b"01", "invalid character '1' after top-level value"),
    (b"tru e", "invalid character ' ' in literal true (expecting 'e')"),
    (b"1.x", "invalid character 'x' after decimal point in numeric literal"),
    (b"1ex", "invalid character 'x' in exponent of numeric literal"),
    (b'"\x01"', "invalid character '\\x01' in string literal"),
    (b'"\\q"', "invalid character 'q' in string escape code"),
    (b"\xef\xbb\xbf{}", "invalid character '\u00ef' looking for beginning of value"),
    (b"NaN", "invalid character 'N' looking for beginning of value"),
])
def test_body_syntax_errors_use_go_wording(body: bytes, message: str) -> None:
    with pytest.raises(jsonpatch.GoJSONError) as info:
        jsonpatch.decode_json(body)
    assert str(info.value) == message


def test_invalid_patch_result_message() -> None:
    status = patching.invalid_patch("merge", {"b": 1, "a": "x"}, "decode failed").to_status()
    assert status["code"] == 422 and status["reason"] == "Invalid"
    body = 'Invalid value: "{\\"a\\":\\"x\\",\\"b\\":1}": decode failed'
    assert status["message"] == ' "" is invalid: patch: ' + body
    assert status["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "patch", "message": body}]
    smp_status = patching.invalid_patch("strategic", {"spec": {"replicas": "x"}}, "bad").to_status()
    assert smp_status["message"] == ' "" is invalid: patch: Invalid value: "map[spec:map[replicas:x]]": bad'


# --- kubectl as the oracle ---------------------------------------------------------------------------------

ORACLE_CASES: list[tuple[str, str, dict[str, Any], Any]] = [
    ("apply image", "strategic", deployment(), {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
        "containers": [{"image": "nginx:2", "name": "app"}]}}}}),
    ("delete container", "strategic", deployment(),
     {"spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}}),
    ("env", "strategic", deployment(), {"spec": {"template": {"spec": {"containers": [{
        "name": "app",
        "env": [{"name": "C", "value": "x", "valueFrom": None}, {"name": "Z", "value": "z"}]}]}}}}),
    ("finalizer order", "strategic", deployment(),
     {"metadata": {"$setElementOrder/finalizers": ["b.io/y", "c", "a.io/x"], "finalizers": ["c"]}}),
    ("volume retainKeys", "strategic", deployment(), {"spec": {"template": {"spec": {"volumes": [
        {"name": "cfg", "$retainKeys": ["name", "secret"], "secret": {"secretName": "s"}}]}}}}),
    ("new container with nulls", "strategic", deployment(), {"spec": {"template": {"spec": {"containers": [
        {"name": "new", "image": "x", "args": None, "env": [{"name": "Q", "value": None}]}]}}}}),
    ("new list element keeps directives", "strategic", deployment(), {"spec": {"template": {"spec": {
        "containers": [{"name": "new", "env": [{"name": "a", "$patch": "delete"}],
                        "$setElementOrder/env": [{"name": "a"}]}]}}}}),
    ("interleave", "strategic", pod(containers=[{"name": n} for n in "abcd"]),
     {"spec": {"containers": [{"name": "e"}, {"name": "b", "image": "x"}, {"name": "z"}]}}),
    ("interleave reversed", "strategic", pod(containers=[{"name": n} for n in "abcd"]),
     {"spec": {"containers": [{"name": "d", "image": "x"}, {"name": "a", "image": "y"}]}}),
    ("duplicate merge keys", "strategic", pod(containers=[{"name": "c"}]),
     {"spec": {"containers": [{"name": "c", "image": "1"}, {"name": "c", "args": ["x"]}, {"name": "d"}]}}),
    ("scalars interleave", "strategic", configmap(finalizers=["a", "b", "c", "d"]),
     {"metadata": {"finalizers": ["d", "q", "a"]}}),
    ("scalar duplicates", "strategic", configmap(finalizers=["a", "b", "a", "c"]),
     {"metadata": {"finalizers": ["b", "b", "e"]}}),
    ("pdb selector replace", "strategic",
     {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "p"},
      "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}}},
     {"spec": {"selector": {"matchLabels": {"x": "y"}}}}),
    ("service ports by port", "strategic",
     {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
      "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "m", "port": 9090}]}},
     {"spec": {"ports": [{"port": 443, "targetPort": 8443}, {"port": 80, "name": "web"}]}}),
    ("owner references by uid", "strategic",
     configmap(ownerReferences=[{"uid": "u1", "name": "n1", "kind": "K", "apiVersion": "v1"}]),
     {"metadata": {"ownerReferences": [{"uid": "u2", "name": "n2", "kind": "K", "apiVersion": "v1"},
                                       {"uid": "u1", "name": "renamed"}]}}),
    ("type change and unknown field", "strategic", deployment(),
     {"spec": {"replicas": "x", "selector": "y", "foo": {"bar": None, "baz": 1}}}),
    ("directive in scalar slot", "strategic", deployment(),
     {"spec": {"replicas": [{"$patch": "delete"}, {"a": 1}]}}),
    ("retainKeys with nulls", "strategic", deployment(),
     {"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": None}}}),
    ("delete list on merge list of maps", "strategic", deployment(), {"spec": {"template": {"spec": {
        "$deleteFromPrimitiveList/containers": [{"name": "side", "image": "zzz"}]}}}}),
    ("float in message", "strategic", deployment(), {"spec": {"template": {"spec": {"volumes": [
        {"x": 1.5, "y": 0.00001, "w": 123456.5, "v": 1234567.5}]}}}}),
    ("setElementOrder not matching", "strategic", deployment(), {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "side"}], "containers": [{"name": "app", "image": "q"}]}}}}),
    ("setElementOrder item without key", "strategic", deployment(), {"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"nam": "app"}], "containers": [{"name": "app", "image": "q"}]}}}}),
    ("merge", "merge", deployment(), {"metadata": {"labels": {"tier": None}},
                                      "spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}}),
    ("merge nulls", "merge", deployment(), {"spec": {"new": {"a": None, "b": [None, {"c": None}]},
                                                     "strategy": [None, {"q": None}]}}),
    ("json quirks", "json", deployment(), [{"op": "replace", "path": "/metadata/newkey", "value": "v"},
                                           {"op": "test", "path": "/metadata/nokey", "value": None},
                                           {"op": "add", "path": "/metadata/labels/x"}]),
]


@pytest.mark.parametrize(("kind", "obj", "patch"), [c[1:] for c in ORACLE_CASES],
                         ids=[c[0] for c in ORACLE_CASES])
def test_kubectl_patch_local_agrees(tmp_path: Path, kind: str, obj: dict[str, Any], patch: Any) -> None:
    try:
        kubectl = testing.tool_path("kubectl")
    except testing.ToolMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    source = tmp_path / "obj.json"
    source.write_text(json.dumps(obj))
    (tmp_path / "kubeconfig").write_text("")
    run = subprocess.run([str(kubectl), "patch", "-f", str(source), "--local", "--type", kind,
                          "-p", json.dumps(patch), "-o", "json"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig")})
    try:
        ours: Any = patching.patch_object(kind, obj, json.dumps(patch).encode(), schema=schema_of(obj))
    except StatusError as err:
        assert run.returncode == 1, run.stdout
        # kubectl prints the server-side message of the same Go error (it trims the last newline).
        assert run.stderr.strip() == "error: " + err.message.rstrip("\n")
    else:
        assert run.returncode == 0, run.stderr
        assert ours == json.loads(run.stdout)
