"""The Kubernetes JSONPath dialect: paths, filters, ranges, errors and Go-style text output."""

from __future__ import annotations

from typing import Any

import pytest

from socialweb_computer.apiserver import jsonpath

OBJ: dict[str, Any] = {
    "metadata": {"name": "web", "labels": {"app": "web", "app.kubernetes.io/name": "frontend"}},
    "spec": {"replicas": 3, "paused": False,
             "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}, {"port": 8080}]},
    "status": {"conditions": [{"type": "Ready", "status": "True"},
                              {"type": "Progressing", "status": "False"}],
               "ratio": 0.5},
    "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}],
}


@pytest.mark.parametrize(("path", "expected"), [
    (".spec.replicas", [3]),
    ("{.spec.replicas}", [3]),
    ("$.spec.replicas", [3]),
    (".spec.paused", [False]),
    (".metadata.labels.app", ["web"]),
    (".metadata.labels.missing", []),
    (".nothing.at.all", []),
    (r".metadata.labels.app\.kubernetes\.io/name", ["frontend"]),
    (".metadata.labels['app']", ["web"]),
    (".status.conditions[?(@.type==\"Ready\")].status", ["True"]),
    (".status.conditions[?(@.type=='Progressing')].status", ["False"]),
    (".status.conditions[?(@.type == \"Ready\")].status", ["True"]),
    (".status.conditions[?(@.type!=\"Ready\")].type", ["Progressing"]),
    (".spec.ports[?(@.port>80)].port", [443, 8080]),
    (".spec.ports[?(@.port<=443)].name", ["http", "https"]),
    (".spec.ports[?(@.name)].port", [80, 443]),
    (".spec.ports[0].name", ["http"]),
    (".spec.ports[-1].port", [8080]),
    (".spec.ports[1:].port", [443, 8080]),
    (".spec.ports[0:3:2].port", [80, 8080]),
    (".spec.ports[0,2].port", [80, 8080]),
    (".spec.ports[*].name", ["http", "https"]),
    (".items[*].metadata.name", ["a", "b"]),
    ("..name", ["web", "http", "https", "a", "b"]),
    (".status.ratio", [0.5]),
])
def test_evaluate(path: str, expected: list[Any]) -> None:
    assert jsonpath.evaluate(path, OBJ) == expected


def test_results_are_grouped_per_action() -> None:
    assert jsonpath.find_results("{.metadata.name} has {.spec.replicas}", OBJ) == [["web"], [" has "], [3]]


@pytest.mark.parametrize(("path", "message"), [
    (".spec.ports[5]", "array index out of bounds: index 5, length 3"),
    (".spec[0]", "map[string]interface {} is not array or slice"),
    (".spec.ports[?(@.port==\"80\")]", "incompatible types for comparison"),
    (".spec.ports[0:3:0]", "step must be > 0"),
    ("{.spec", "unclosed action"),
    (".spec.ports[?(@.port==80", "unterminated filter"),
    (".spec.ports[x]", "invalid array index x"),
    ("{range .items[*]}{end}{end}", "not in range, nothing to end"),
    (".a....b", "invalid multiple recursive descent"),
])
def test_errors(path: str, message: str) -> None:
    with pytest.raises(jsonpath.JSONPathError) as caught:
        jsonpath.evaluate(path, OBJ)
    assert str(caught.value) == message


def test_missing_keys_are_errors_only_when_asked() -> None:
    with pytest.raises(jsonpath.JSONPathError, match=r"^missing is not found$"):
        jsonpath.evaluate(".spec.missing", OBJ, allow_missing_keys=False)
    assert jsonpath.evaluate(".spec.missing", OBJ) == []


def test_execute_like_kubectl_o_jsonpath() -> None:
    assert jsonpath.execute(r'{range .items[*]}{.metadata.name}{"\n"}{end}', OBJ) == "a\nb\n"
    assert jsonpath.execute("{.items[*].metadata.name}", OBJ) == "a b"
    assert jsonpath.execute("name={.metadata.name}", OBJ) == "name=web"
    assert jsonpath.execute("{.status.conditions[0]}", OBJ) == '{"status":"True","type":"Ready"}'


@pytest.mark.parametrize(("value", "text"), [
    ("plain", "plain"),
    (7, "7"),
    (True, "true"),
    (None, "<no value>"),
    ({"b": 1, "a": "<x>"}, '{"a":"\\u003cx\\u003e","b":1}'),
    ([1, 2.5, None], "[1,2.5,null]"),
    (1.5, "1.5"),
    (3.0, "3"),
    (123456.0, "123456"),
    (1e6, "1e+06"),
    (123456789.0, "1.23456789e+08"),
    (0.0001, "0.0001"),
    (0.00001, "1e-05"),
])
def test_format_text(value: Any, text: str) -> None:
    assert jsonpath.format_text(value) == text


def test_go_json_floats() -> None:
    expected = "[1e+21,100000000000000000000,1e-7,0.000001,2]"
    assert jsonpath.go_json([1e21, 1e20, 1e-7, 0.000001, 2.0]) == expected
