"""CRD structural schemas: pruning (order and paths as apiextensions reports them), defaulting,
kube-openapi-style validation messages, and the structural rules that make a CRD a 422."""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.apiserver import structural

# The schema of upstream's field-validation integration test, plus value validations.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                "knownField1": {"type": "string"},
                "embeddedObj": {
                    "x-kubernetes-embedded-resource": True,
                    "type": "object",
                    "properties": {
                        "apiversion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                    },
                },
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                    "x-kubernetes-list-type": "map",
                    "items": {
                        "type": "object",
                        "required": ["containerPort", "protocol"],
                        "properties": {
                            "containerPort": {"format": "int32", "type": "integer"},
                            "hostPort": {"format": "int32", "type": "integer"},
                            "name": {"type": "string"},
                            "protocol": {"type": "string", "default": "TCP"},
                        },
                    },
                },
            },
        },
    },
}


def _causes(obj: Any, schema: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c.field, c.reason, c.message) for c in structural.validate(obj, schema)]


def _one(schema: dict[str, Any], value: Any) -> list[tuple[str, str, str]]:
    return _causes(
        {"spec": {"x": value}},
        {"type": "object", "properties": {"spec": {"type": "object", "properties": {"x": schema}}}},
    )


# --------------------------------------------------------------------------- pruning


def test_prune_reports_in_apiserver_order_and_removes() -> None:
    obj = {
        "apiVersion": "stable.example.com/v1",
        "kind": "Foo",
        "metadata": {"name": "n", "unknownMeta": "metaVal", "resourceVersion": "1"},
        "spec": {
            "unknown1": "val1",
            "unknownDupe": "valDupe2",
            "knownField1": "val2",
            "ports": [
                {
                    "name": "portName",
                    "containerPort": 8080,
                    "protocol": "TCP",
                    "hostPort": 8082,
                    "unknownNested": "val",
                }
            ],
            "embeddedObj": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "my-cm", "namespace": "my-ns", "unknownEmbeddedMeta": "foo"},
            },
        },
    }
    assert structural.prune(obj, SCHEMA) == [
        "metadata.unknownMeta",
        "spec.ports[0].unknownNested",
        "spec.unknown1",
        "spec.unknownDupe",
        "spec.embeddedObj.metadata.unknownEmbeddedMeta",
    ]
    assert obj["metadata"] == {"name": "n", "resourceVersion": "1"}
    assert set(obj["spec"]) == {"knownField1", "ports", "embeddedObj"}
    assert obj["spec"]["embeddedObj"]["metadata"] == {"name": "my-cm", "namespace": "my-ns"}
    assert obj["apiVersion"] == "stable.example.com/v1" and obj["kind"] == "Foo"


def test_prune_respects_preserve_unknown_fields_and_maps() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"strict": {"type": "object", "properties": {"a": {"type": "string"}}}},
            },
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"v": {"type": "integer"}}},
            },
            "list": {"type": "array", "items": {"type": "string"}},
        },
    }
    obj = {
        "spec": {"anything": {"deep": 1}, "strict": {"a": "x", "b": "y"}},
        "labels": {"k": {"v": 1, "w": 2}},
        "list": ["a"],
        "top": 1,
    }
    assert structural.prune(obj, schema) == ["labels.k.w", "spec.strict.b", "top"]
    assert obj == {
        "spec": {"anything": {"deep": 1}, "strict": {"a": "x"}},
        "labels": {"k": {"v": 1}},
        "list": ["a"],
    }


def test_prune_drops_non_nullable_nulls_without_default() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {"type": "string", "nullable": True},
                    "c": {"type": "string", "default": "x"},
                },
            }
        },
    }
    obj = {"spec": {"a": None, "b": None, "c": None}}
    assert structural.prune(obj, schema) == []
    assert obj == {"spec": {"b": None, "c": None}}
    structural.apply_defaults(obj, schema)
    assert obj == {"spec": {"b": None, "c": "x"}}


# --------------------------------------------------------------------------- defaulting


def test_defaults_fill_absent_fields_items_and_maps() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "default": {},
                "properties": {
                    "replicas": {"type": "integer", "default": 1},
                    "ports": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"protocol": {"type": "string", "default": "TCP"}},
                        },
                    },
                    "byName": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"weight": {"type": "integer", "default": 10}},
                        },
                    },
                    "settings": {"type": "object", "default": {"mode": "auto"}},
                },
            }
        },
    }
    obj: dict[str, Any] = {}
    structural.apply_defaults(obj, schema)
    assert obj == {"spec": {"replicas": 1, "settings": {"mode": "auto"}}}
    obj = {"spec": {"replicas": 3, "ports": [{}, {"protocol": "UDP"}], "byName": {"a": {}}}}
    structural.apply_defaults(obj, schema)
    assert obj["spec"]["replicas"] == 3
    assert obj["spec"]["ports"] == [{"protocol": "TCP"}, {"protocol": "UDP"}]
    assert obj["spec"]["byName"] == {"a": {"weight": 10}}
    first, second = {}, {}  # type: ignore[var-annotated]
    structural.apply_defaults(first, schema)
    structural.apply_defaults(second, schema)
    first["spec"]["settings"]["mode"] = "changed"
    assert second["spec"]["settings"]["mode"] == "auto"
    assert schema["properties"]["spec"]["properties"]["settings"]["default"] == {"mode": "auto"}


# --------------------------------------------------------------------------- validation


def test_type_errors() -> None:
    assert _causes(
        {"spec": {"replicas": "string"}},
        {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}},
        },
    ) == [
        (
            "spec.replicas",
            "FieldValueTypeInvalid",
            'Invalid value: "string": spec.replicas in body must be of type integer: "string"',
        )
    ]
    assert _one({"type": "string"}, None) == [
        (
            "spec.x",
            "FieldValueTypeInvalid",
            'Invalid value: "null": spec.x in body must be of type string: "null"',
        )
    ]
    assert _one({"type": "string", "nullable": True}, None) == []
    assert _one({"type": "integer"}, 2.0) == []
    assert _one({"type": "number"}, 2) == []
    assert _one({"type": "integer"}, True)[0][2].endswith('must be of type integer: "boolean"')
    assert _one({"x-kubernetes-int-or-string": True}, "80%") == []
    assert _one({"x-kubernetes-int-or-string": True}, 80) == []
    assert _one({"x-kubernetes-int-or-string": True}, [1]) == [
        (
            "spec.x",
            "FieldValueTypeInvalid",
            'Invalid value: "array": spec.x in body must be of type integer,string: "array"',
        )
    ]


def test_required_enum_and_bounds() -> None:
    causes = _causes({"spec": {"ports": [{"name": 3}]}}, SCHEMA)
    assert causes == [
        (
            "spec.ports[0].name",
            "FieldValueTypeInvalid",
            'Invalid value: "integer": spec.ports[0].name in body must be of type string: "integer"',
        ),
        ("spec.ports[0].containerPort", "FieldValueRequired", "Required value"),
        ("spec.ports[0].protocol", "FieldValueRequired", "Required value"),
    ]
    assert _one({"type": "string", "enum": ["a", "b"]}, "c") == [
        ("spec.x", "FieldValueNotSupported", 'Unsupported value: "c": supported values: "a", "b"')
    ]
    assert _one({"type": "integer", "enum": [1, 2]}, 3) == [
        ("spec.x", "FieldValueNotSupported", 'Unsupported value: 3: supported values: "1", "2"')
    ]
    assert _one({"type": "integer", "maximum": 5}, 9) == [
        ("spec.x", "FieldValueInvalid", "Invalid value: 9: spec.x in body should be less than or equal to 5")
    ]
    assert _one({"type": "integer", "maximum": 5, "exclusiveMaximum": True}, 5)[0][2].endswith(
        "should be less than 5"
    )
    assert _one({"type": "number", "minimum": 1.5}, 1) == [
        (
            "spec.x",
            "FieldValueInvalid",
            "Invalid value: 1: spec.x in body should be greater than or equal to 1.5",
        )
    ]
    assert _one({"type": "integer", "minimum": 0, "exclusiveMinimum": True}, 0)[0][2].endswith(
        "should be greater than 0"
    )
    assert _one({"type": "integer", "multipleOf": 2}, 3)[0][2].endswith("should be a multiple of 2")


def test_string_array_and_object_limits() -> None:
    assert _one({"type": "string", "maxLength": 3}, "abcd") == [
        ("spec.x", "FieldValueTooLong", "Too long: may not be more than 3 bytes")
    ]
    assert _one({"type": "string", "minLength": 3}, "ab") == [
        ("spec.x", "FieldValueInvalid", 'Invalid value: "ab": spec.x in body should be at least 3 chars long')
    ]
    assert _one({"type": "string", "pattern": "^a+$"}, "b") == [
        ("spec.x", "FieldValueInvalid", "Invalid value: \"b\": spec.x in body should match '^a+$'")
    ]
    assert _one({"type": "array", "items": {"type": "string"}, "maxItems": 1}, ["a", "b"]) == [
        ("spec.x", "FieldValueTooMany", "Too many: 2: must have at most 1 item")
    ]
    assert _one({"type": "array", "items": {"type": "string"}, "minItems": 2}, ["a"]) == [
        ("spec.x", "FieldValueInvalid", "Invalid value: 1: spec.x in body should have at least 2 items")
    ]
    assert _one({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, ["a", "a"]) == [
        ("spec.x", "FieldValueInvalid", 'Invalid value: "": spec.x in body shouldn\'t contain duplicates')
    ]
    assert _one({"type": "object", "maxProperties": 1}, {"a": 1, "b": 2}) == [
        ("spec.x", "FieldValueTooMany", "Too many: 2: must have at most 1 item")
    ]
    assert _one({"type": "object", "minProperties": 2}, {"a": 1}) == [
        ("spec.x", "FieldValueInvalid", "Invalid value: 2: spec.x in body should have at least 2 properties")
    ]


def test_formats() -> None:
    assert _one({"type": "string", "format": "date-time"}, "2024-01-02T03:04:05Z") == []
    assert _one({"type": "string", "format": "date-time"}, "yesterday") == [
        (
            "spec.x",
            "FieldValueTypeInvalid",
            'Invalid value: "yesterday": spec.x in body must be of type date-time: "yesterday"',
        )
    ]
    assert _one({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000") == []
    assert _one({"type": "string", "format": "ipv4"}, "10.0.0.300") != []
    assert _one({"type": "string", "format": "byte"}, "aGVsbG8=") == []
    assert _one({"type": "string", "format": "duration"}, "1h30m") == []
    assert _one({"type": "string", "format": "no-such-format"}, "whatever") == []
    assert _one({"type": "integer", "format": "int32"}, 2**40) == []  # kube-openapi does not range-check


def test_junctors() -> None:
    any_of = {
        "anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[0-9]+%$"}],
        "x-kubernetes-int-or-string": True,
    }
    assert _one(any_of, 5) == [] and _one(any_of, "5%") == []
    causes = _one(any_of, "five")
    assert causes[0] == (
        "<nil>",
        "FieldValueInvalid",
        'Invalid value: "": "spec.x" must validate at least one schema (anyOf)',
    )
    assert len(causes) == 2
    one_of = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert _one(one_of, {"a": 1}) == []
    assert _one(one_of, {"a": 1, "b": 2})[0][2].endswith("(oneOf). Found 2 valid alternatives")
    assert _one(one_of, {})[0][2].endswith("(oneOf). Found none valid")
    assert _one({"type": "string", "not": {"enum": ["x"]}}, "x")[0][2] == (
        'Invalid value: "": "spec.x" must not validate the schema (not)'
    )
    all_of = {"type": "string", "allOf": [{"minLength": 2}, {"maxLength": 3}]}
    assert [c[1] for c in _one(all_of, "abcd")] == ["FieldValueTooLong", "FieldValueInvalid"]


def test_embedded_resource_needs_type_meta() -> None:
    causes = _causes({"spec": {"embeddedObj": {"metadata": {}}}}, SCHEMA)
    assert (
        "spec.embeddedObj.apiVersion",
        "FieldValueRequired",
        "Required value: must not be empty",
    ) in causes
    assert ("spec.embeddedObj.kind", "FieldValueRequired", "Required value: must not be empty") in causes


def test_valid_object_has_no_causes() -> None:
    obj = {
        "apiVersion": "stable.example.com/v1",
        "kind": "Foo",
        "metadata": {"name": "x"},
        "spec": {"cronSpec": "* * * * */5", "ports": [{"containerPort": 80, "protocol": "TCP"}]},
    }
    assert structural.validate(copy.deepcopy(obj), SCHEMA) == []


# --------------------------------------------------------------------------- structural rules


def _rules(schema: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c.field, c.message) for c in structural.check_structural(schema)]


def test_good_schemas_are_structural() -> None:
    assert _rules(SCHEMA) == []
    assert (
        _rules(
            {
                "type": "object",
                "properties": {
                    "metadata": {
                        "type": "object",
                        "properties": {"name": {"type": "string", "maxLength": 10}},
                    },
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "port": {
                        "x-kubernetes-int-or-string": True,
                        "anyOf": [{"type": "integer"}, {"type": "string"}],
                    },
                    "mode": {"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "^b"}]},
                },
            }
        )
        == []
    )


def test_missing_types_and_root_rules() -> None:
    assert _rules(
        {"properties": {"spec": {"properties": {"x": {"type": "string"}}}, "list": {"type": "array"}}}
    ) == [
        ("properties[list].items", "Required value: must be specified"),
        ("properties[spec].type", "Required value: must not be empty for specified object fields"),
        ("type", "Required value: must not be empty at the root"),
    ]
    assert _rules({"type": "string"}) == [("type", 'Invalid value: "string": must be object at the root')]
    assert _rules({"type": "object", "additionalProperties": {"type": "string"}}) == [
        ("additionalProperties", "Forbidden: must not be used at the root")
    ]
    assert _rules({"type": "object", "properties": {"l": {"type": "array", "items": {}}}}) == [
        ("properties[l].items.type", "Required value: must not be empty for specified array items")
    ]


def test_metadata_may_only_restrict_name() -> None:
    assert _rules(
        {
            "type": "object",
            "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}},
        }
    ) == [
        (
            "properties[metadata]",
            "Forbidden: must not specify anything other than name and generateName, but "
            "metadata is implicitly specified",
        )
    ]
    assert _rules({"type": "object", "properties": {"kind": {"type": "integer"}}}) == [
        ("properties[kind].type", 'Invalid value: "integer": must be string')
    ]


def test_openapi_problems_hide_structural_ones() -> None:
    assert _rules(
        {
            "properties": {
                "spec": {"$ref": "#/definitions/x"},
                "l": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "m": {"type": "object", "additionalProperties": False},
                "p": {"type": "object", "x-kubernetes-preserve-unknown-fields": False},
            }
        }
    ) == [
        (
            "properties[l].uniqueItems",
            "Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ),
        ("properties[m].additionalProperties", "Forbidden: additionalProperties cannot be set to false"),
        (
            "properties[p].x-kubernetes-preserve-unknown-fields",
            "Invalid value: false: must be true or undefined",
        ),
        ("properties[spec].$ref", "Forbidden: $ref is not supported"),
    ]
    assert _rules(
        {
            "type": "object",
            "properties": {
                "m": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}},
                    "additionalProperties": {"type": "string"},
                }
            },
        }
    ) == [
        (
            "properties[m].additionalProperties",
            "Forbidden: additionalProperties and properties are mutual exclusive",
        )
    ]


def test_value_validation_must_not_carry_structure() -> None:
    assert _rules(
        {
            "type": "object",
            "properties": {
                "x": {
                    "type": "string",
                    "anyOf": [{"type": "string"}, {"description": "d", "properties": {"metadata": {}}}],
                }
            },
        }
    ) == [
        ("properties[x].anyOf[0].type", "Forbidden: must be empty to be structural"),
        ("properties[x].anyOf[1].description", "Forbidden: must be empty to be structural"),
        (
            "properties[x].anyOf[1].properties[metadata]",
            "Forbidden: must not be specified in a nested context",
        ),
    ]


def test_extension_conflicts() -> None:
    assert _rules(
        {
            "type": "object",
            "properties": {
                "e": {"x-kubernetes-embedded-resource": True},
                "i": {"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True},
            },
        }
    ) == [
        (
            "properties[e].properties",
            "Required value: must not be empty if x-kubernetes-embedded-resource is true "
            "without x-kubernetes-preserve-unknown-fields",
        ),
        ("properties[e].type", "Required value: must be object if x-kubernetes-embedded-resource is true"),
        (
            "properties[i].x-kubernetes-preserve-unknown-fields",
            "Invalid value: true: must be false if x-kubernetes-int-or-string is true",
        ),
    ]
