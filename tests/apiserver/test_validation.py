"""Body decoding and fieldValidation, against the strings kube-apiserver's own integration tests
expect (test/integration/apiserver/field_validation_test.go): same findings, same order, same
wrapping per request kind."""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import handlers, schemas, validation

DEPLOYMENT = schemas.for_kind("apps", "v1", "Deployment")
CONFIGMAP = schemas.for_kind("", "v1", "ConfigMap")

INVALID_DEPLOYMENT_JSON = b"""
{
  "apiVersion": "apps/v1",
  "kind": "Deployment",
  "metadata": {
    "name": "dupename",
    "name": "web",
    "labels": {"app": "nginx"},
    "unknownMeta": "metaVal"
  },
  "spec": {
    "unknown1": "val1",
    "unknownDupe": "valDupe",
    "unknownDupe": "valDupe2",
    "paused": true,
    "paused": false,
    "selector": {"matchLabels": {"app": "nginx"}},
    "template": {
      "metadata": {"labels": {"app": "nginx"}},
      "spec": {"containers": [{"name": "nginx", "image": "nginx:latest", "unknownNested": "val1",
                               "imagePullPolicy": "Always", "imagePullPolicy": "Never"}]}
    }
  }
}"""

INVALID_DEPLOYMENT_YAML = b"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: dupename
  name: web
  unknownMeta: metaVal
  labels:
    app: nginx
spec:
  unknown1: val1
  unknownDupe: valDupe
  unknownDupe: valDupe2
  paused: true
  paused: false
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:latest
        unknownNested: val1
        imagePullPolicy: Always
        imagePullPolicy: Never"""

JSON_FINDINGS = [
    'duplicate field "metadata.name"',
    'unknown field "metadata.unknownMeta"',
    'unknown field "spec.unknown1"',
    'unknown field "spec.unknownDupe"',
    'duplicate field "spec.paused"',
    'unknown field "spec.template.spec.containers[0].unknownNested"',
    'duplicate field "spec.template.spec.containers[0].imagePullPolicy"',
]
YAML_LINES = [
    'line 5: key "name" already set in map',
    'line 12: key "unknownDupe" already set in map',
    'line 14: key "paused" already set in map',
    'line 28: key "imagePullPolicy" already set in map',
]
YAML_UNKNOWN = [
    'unknown field "metadata.unknownMeta"',
    'unknown field "spec.template.spec.containers[0].unknownNested"',
    'unknown field "spec.unknown1"',
    'unknown field "spec.unknownDupe"',
]


def _error(fn: Any, *args: Any, **kwargs: Any) -> errors.StatusError:
    with pytest.raises(errors.StatusError) as info:
        fn(*args, **kwargs)
    return info.value


# --------------------------------------------------------------------------- decoding


def test_json_body_and_duplicate_paths_in_document_order() -> None:
    obj, dups = validation.decode_body(INVALID_DEPLOYMENT_JSON, "application/json; charset=utf-8")
    assert obj["metadata"]["name"] == "web" and obj["spec"]["paused"] is False
    assert dups == [
        "metadata.name",
        "spec.unknownDupe",
        "spec.paused",
        "spec.template.spec.containers[0].imagePullPolicy",
    ]


def test_clean_json_has_no_duplicates() -> None:
    assert validation.decode_body(b'{"a": {"b": [1, {"c": null}]}}', "application/json") == (
        {"a": {"b": [1, {"c": None}]}},
        [],
    )
    assert validation.decode_body(b"null", "application/json") == ({}, [])


def test_yaml_body_reports_go_yaml_duplicate_lines() -> None:
    obj, dups = validation.decode_body(INVALID_DEPLOYMENT_YAML, "application/yaml")
    assert dups == YAML_LINES
    assert obj["spec"]["paused"] is False
    assert list(obj) == sorted(obj) and list(obj["spec"]) == sorted(obj["spec"])


def test_yaml_scalars_follow_go() -> None:
    obj, _ = validation.decode_body(
        b"when: 2024-01-01\nyes_: yes\nn: 1.5\n1: one\nnull: x\n", "application/yaml"
    )
    assert obj == {"1": "one", "n": 1.5, "null": "x", "when": "2024-01-01", "yes_": True}
    assert validation.decode_body(b"a: 1\n---\nb: 2\n", "application/yaml")[0] == {"a": 1}
    assert validation.decode_body(b"", "application/yaml") == ({}, [])


@pytest.mark.parametrize(
    ("body", "go"),
    [
        (b'{"a":', "unexpected end of JSON input"),
        (b"", "unexpected end of JSON input"),
        (b'{"a" 1}', "invalid character '1' after object key"),
        (b'{"a":1,}', "invalid character '}' looking for beginning of object key string"),
        (b"{a:1}", "invalid character 'a' looking for beginning of object key string"),
        (b'{"a":[1 2]}', "invalid character '2' after array element"),
        (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
        (b'{"a":1} x', "invalid character 'x' after top-level value"),
        (b'{"a":"\\q"}', "invalid character 'q' in string escape code"),
        (b'{"a":NaN}', "invalid character 'N' looking for beginning of value"),
    ],
)
def test_malformed_json_matches_go_wording(body: bytes, go: str) -> None:
    error = _error(validation.decode_body, body, "application/json", kind="ConfigMap")
    assert error.code == 400 and error.reason == "BadRequest"
    summary = body.decode() if body else "<empty>"
    assert error.message == (
        f"the object provided is unrecognized (must be of type ConfigMap): couldn't get "
        f"version/kind; json parse error: {go} ({summary})"
    )


def test_non_object_bodies() -> None:
    error = _error(validation.decode_body, b"[1]", "application/json", kind="Pod")
    assert error.message == (
        "the object provided is unrecognized (must be of type Pod): couldn't get "
        "version/kind; json parse error: json: cannot unmarshal array into Go value of type "
        'struct { APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string '
        '"json:\\"kind,omitempty\\"" } (5b315d)'
    )
    error = _error(validation.decode_body, b'"x"', "application/merge-patch+json")
    assert error.message == (
        "error decoding patch: json: cannot unmarshal string into Go value of type map[string]interface {}"
    )


def test_malformed_yaml_per_content_type() -> None:
    body = b"a: b: c"
    error = _error(validation.decode_body, body, "application/yaml", kind="ConfigMap")
    assert error.message == (
        "the object provided is unrecognized (must be of type ConfigMap): yaml: line 1: "
        f"mapping values are not allowed in this context ({body.hex()})"
    )
    error = _error(validation.decode_body, body, "application/apply-patch+yaml")
    assert error.message == (
        "error decoding YAML: error converting YAML to JSON: yaml: line 1: "
        "mapping values are not allowed in this context"
    )
    long_body = b"x: [" + b"1, " * 20
    error = _error(validation.decode_body, long_body, "application/yaml", kind="ConfigMap")
    assert error.message.endswith(f"({long_body[:30].hex()} ...)")


def test_unsupported_media_type() -> None:
    error = _error(validation.decode_body, b"x", "text/plain")
    assert error.code == 415 and error.reason == "UnsupportedMediaType"


# --------------------------------------------------------------------------- unknown fields


def test_unknown_fields_paths() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "ownerReferences": [{"name": "o", "bogus": 1}]},
        "spec": {
            "containers": [{"name": "c"}, {"name": "d", "foo": 1, "ports": [{"containerPort": 1, "x": 2}]}],
            "overhead": {"cpu": "1"},
            "nodeSelector": {"k": "v"},
        },
        "status": {"phase": "Running", "weird": True},
        "extra": {},
    }
    assert validation.unknown_fields(pod, schemas.for_kind("", "v1", "Pod")) == [
        "metadata.ownerReferences[0].bogus",
        "spec.containers[1].foo",
        "spec.containers[1].ports[0].x",
        "status.weird",
        "extra",
    ]


def test_free_form_and_int_or_string_fields_are_not_unknown() -> None:
    schema = schemas.for_kind("apps", "v1", "ControllerRevision")
    revision = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": "r"},
        "data": {"anything": {"goes": [1]}},
        "revision": 1,
    }
    assert validation.unknown_fields(revision, schema) == []
    deployment = {"spec": {"strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}}}}
    assert validation.unknown_fields(deployment, DEPLOYMENT) == []


def test_crd_schema_extensions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "port": {"x-kubernetes-int-or-string": True},
                    "embedded": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                    "labels": {
                        "type": "object",
                        "additionalProperties": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                },
            }
        },
    }
    obj = {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "n", "nope": 1},
        "spec": {
            "free": {"a": {"b": 1}},
            "port": "http",
            "embedded": {"apiVersion": "v1", "kind": "Pod", "spec": {}, "metadata": {"name": "e", "zz": 1}},
            "labels": {"k": {"a": "x", "b": "y"}},
            "other": 1,
        },
    }
    assert validation.unknown_fields(obj, schema) == [
        "metadata.nope",
        "spec.embedded.metadata.zz",
        "spec.labels.k.b",
        "spec.other",
    ]
    assert validation.unknown_fields(obj, schema, drop=True) == [
        "metadata.nope",
        "spec.embedded.metadata.zz",
        "spec.labels.k.b",
        "spec.other",
    ]
    assert validation.unknown_fields(obj, schema) == []


# --------------------------------------------------------------------------- create / update


def test_strict_json_message_matches_upstream() -> None:
    obj, dups = validation.decode_body(INVALID_DEPLOYMENT_JSON, "application/json")
    error = _error(
        validation.check_fields, obj, dups, DEPLOYMENT, mode="Strict", kind="Deployment", version="v1"
    )
    assert error.code == 400 and error.reason == "BadRequest"
    assert error.message == (
        'Deployment in version "v1" cannot be handled as a Deployment: strict decoding '
        "error: " + ", ".join(JSON_FINDINGS)
    )


def test_warn_and_default_return_findings() -> None:
    obj, dups = validation.decode_body(INVALID_DEPLOYMENT_JSON, "application/json")
    for mode in ("Warn", "", None):
        assert (
            validation.check_fields(
                obj,
                tuple(dups),
                DEPLOYMENT,
                mode=mode,
                kind="Deployment",  # type: ignore[arg-type]
                version="v1",
            )
            == JSON_FINDINGS
        )
    assert (
        validation.check_fields(obj, dups, DEPLOYMENT, mode="Ignore", kind="Deployment", version="v1") == []
    )


def test_strict_yaml_message_matches_upstream() -> None:
    obj, dups = validation.decode_body(INVALID_DEPLOYMENT_YAML, "application/yaml")
    error = _error(
        validation.check_fields, obj, list(dups), DEPLOYMENT, mode="Strict", kind="Deployment", version="v1"
    )
    assert error.message == (
        'Deployment in version "v1" cannot be handled as a Deployment: strict decoding '
        "error: yaml: unmarshal errors:\n  " + "\n  ".join(YAML_LINES) + ", " + ", ".join(YAML_UNKNOWN)
    )
    assert (
        validation.check_fields(obj, dups, DEPLOYMENT, mode="Warn", kind="Deployment", version="v1")
        == YAML_LINES + YAML_UNKNOWN
    )


def test_clean_object_passes_strict() -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "annotations": {"a": "b"}},
        "data": {"k": "v"},
    }
    assert validation.check_fields(cm, [], CONFIGMAP, mode="Strict", kind="ConfigMap", version="v1") == []


def test_single_unknown_field_configmap() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "spec": {"foo": 1}}
    error = _error(validation.check_fields, cm, [], CONFIGMAP, mode="Strict", kind="ConfigMap", version="v1")
    assert error.message == (
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: '
        'unknown field "spec"'
    )


def test_duplicate_map_keys_are_reported() -> None:
    obj, dups = validation.decode_body(b'{"data": {"a": "1", "a": "2"}}', "application/json")
    assert validation.check_fields(obj, dups, CONFIGMAP, mode="Warn", kind="ConfigMap", version="v1") == [
        'duplicate field "data.a"'
    ]


def test_invalid_mode_is_rejected_like_the_options_validation() -> None:
    error = _error(validation.check_fields, {}, [], CONFIGMAP, mode="strict", kind="ConfigMap", version="v1")
    assert error.code == 422 and error.reason == "Invalid"
    assert error.message == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: '
        '"strict": supported values: "", "Ignore", "Strict", "Warn"'
    )
    assert error.causes[0].field == "fieldValidation"
    assert _error(validation.directive, "x", "PatchOptions").message.startswith(
        'PatchOptions.meta.k8s.io "" '
    )


# --------------------------------------------------------------------------- custom resources, patch, apply


def test_custom_resource_report_order_matches_upstream() -> None:
    dups = ["metadata.name", "spec.unknownDupe", "spec.knownField1", "spec.ports[0].hostPort"]
    unknown = [
        "metadata.unknownMeta",
        "spec.ports[0].unknownNested",
        "spec.embeddedObj.metadata.unknownEmbeddedMeta",
    ]
    expected = [f'duplicate field "{d}"' for d in dups] + [f'unknown field "{u}"' for u in unknown]
    assert validation.report_fields(unknown, dups, mode="Warn", kind="Foo", version="v1") == expected
    error = _error(validation.report_fields, unknown, dups, mode="Strict", kind="Foo", version="v1")
    assert (
        error.message
        == 'Foo in version "v1" cannot be handled as a Foo: strict decoding error: ' + ", ".join(expected)
    )
    assert validation.report_fields(unknown, dups, mode="Ignore", kind="Foo", version="v1") == []


def test_patch_reports_patch_duplicates_then_sorted_unknowns() -> None:
    patch = (
        b'{"spec": {"unknown1": "val1", "unknownDupe": "a", "unknownDupe": "b", "paused": true, '
        b'"paused": false, "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx", '
        b'"unknownNested": "val1", "imagePullPolicy": "Always", "imagePullPolicy": "Never"}]}}}}'
    )
    patch_obj, dups = validation.decode_body(patch, "application/merge-patch+json")
    patched = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, **patch_obj}
    expected = (
        'strict decoding error: duplicate field "spec.unknownDupe", duplicate field "spec.paused", '
        'duplicate field "spec.template.spec.containers[0].imagePullPolicy", unknown field '
        '"spec.template.spec.containers[0].unknownNested", unknown field "spec.unknown1", unknown field '
        '"spec.unknownDupe"'
    )
    error = _error(
        validation.check_patch_fields, patched, dups, DEPLOYMENT, mode="Strict", patch_text='{"x":1}'
    )
    assert error.code == 422 and error.reason == "Invalid"
    assert error.message == f' "" is invalid: patch: Invalid value: "{{\\"x\\":1}}": {expected}'
    assert error.causes[0].field == "patch"
    warnings = validation.check_patch_fields(patched, dups, DEPLOYMENT, mode="Warn", patch_text="")
    assert ", ".join(warnings) == expected.removeprefix("strict decoding error: ")


def test_apply_duplicates() -> None:
    body = b'{\n "spec": {\n  "paused": false,\n  "paused": true\n }\n}'
    _, dups = validation.decode_body(body, "application/apply-patch+yaml")
    assert dups == ['line 4: key "paused" already set in map']
    error = _error(validation.check_apply_fields, dups, mode="Strict")
    assert error.code == 400
    assert error.message == (
        "error strict decoding YAML: error converting YAML to JSON: yaml: unmarshal errors:\n"
        '  line 4: key "paused" already set in map'
    )
    assert validation.check_apply_fields(dups, mode="Warn") == dups
    assert validation.check_apply_fields(dups, mode="Ignore") == []


# --------------------------------------------------------------------------- Go rendering


def test_go_rendering_helpers() -> None:
    assert validation.go_quote('a"b\\c\n\t\x01é') == '"a\\"b\\\\c\\n\\t\\x01é"'
    assert validation.go_float(5.0) == "5" and validation.go_float(1.5) == "1.5"
    assert validation.go_float(1e21) == "1e+21"
    assert validation.go_value({"b": 1, "a": "<"}) == '{"a":"\\u003c","b":1}'
    assert validation.go_value(None) == "null" and validation.go_value(True) == "true"
    assert list(validation.iter_warnings(['unknown field "spec.foo"'])) == [
        '299 - "unknown field \\"spec.foo\\""'
    ]


def test_warning_headers_never_carry_control_characters() -> None:
    # apimachinery's NewWarningHeader: quotes and backslashes escaped, non-text bytes as spaces
    # (a fuzzed unknown field named "a\nb" once made aiohttp refuse the whole response).
    assert handlers.warn_text('unknown field "spec.a\nb\r\x00\x7f"') == (
        '"unknown field \\"spec.a b   \\""'
    )
    assert handlers.warn_text("tab\tand é stay") == '"tab\tand é stay"'
