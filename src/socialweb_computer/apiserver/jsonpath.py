"""The Kubernetes JSONPath dialect (client-go `util/jsonpath`), for printer columns.

Why it exists: a CustomResourceDefinition's `additionalPrinterColumns` name their cells with
JSONPaths, and the server renders those cells itself (`printers.build_table`). The dialect is not
RFC JSONPath: `$` and `@` are no-ops, `{...}` braces delimit actions, filters compare one value
with Go template rules, `..` descends into every container, and text outside braces is kept.

Who calls it: `printers` (CRD columns, via `cell`), and anything that needs `-o jsonpath`
style output (`execute`). `evaluate` returns plain values; `find_results` keeps the per-action
grouping client-go's `FindResults` returns.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any

from socialweb_computer.api import gofmt

# --------------------------------------------------------------------------- syntax tree


class JSONPathError(ValueError):
    """A template that does not parse, or an evaluation that fails (out-of-range index...)."""


@dataclasses.dataclass(frozen=True)
class Field:
    name: str


@dataclasses.dataclass(frozen=True)
class Wildcard:
    pass


@dataclasses.dataclass(frozen=True)
class Recursive:
    pass


@dataclasses.dataclass(frozen=True)
class Param:
    value: int = 0
    known: bool = False
    derived: bool = False


@dataclasses.dataclass(frozen=True)
class Array:
    start: Param
    end: Param
    step: Param


@dataclasses.dataclass(frozen=True)
class Union:
    branches: tuple[tuple[Any, ...], ...]


@dataclasses.dataclass(frozen=True)
class Filter:
    left: tuple[Any, ...]
    right: tuple[Any, ...]
    operator: str  # "exists" or a comparison


@dataclasses.dataclass(frozen=True)
class Literal:
    """A quoted string, number or boolean inside an action: evaluates to itself."""

    value: Any


@dataclasses.dataclass(frozen=True)
class Identifier:
    name: str  # "range" and "end" are the only ones that evaluate


@dataclasses.dataclass(frozen=True)
class Text:
    """Template text outside braces."""

    value: str


@dataclasses.dataclass(frozen=True)
class Action:
    nodes: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Range:
    """`{range X}body{end}`: body runs once per result of X."""

    nodes: tuple[Any, ...]
    body: tuple[Any, ...]


# --------------------------------------------------------------------------- parser

_EOF = ""
_DICT_KEY = re.compile(r"^'([^']*)'$")
_SLICE = re.compile(r"^(-?\d*)(:-?\d*)?(:-?\d*)?$")
_FILTER = re.compile(r"^([^!<>=]+)([!<>=]+)(.+?)$", re.DOTALL)
_TERMINATORS = frozenset(" \t\r\n.,[]$@{}")


class _Parser:
    """A port of client-go's hand-written parser: position-based, one action at a time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.start = 0

    # -- cursor
    def next(self) -> str:
        if self.pos >= len(self.text):
            self.pos += 1  # so that backup() after EOF is symmetric
            return _EOF
        ch = self.text[self.pos]
        self.pos += 1
        return ch

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else _EOF

    def backup(self) -> None:
        self.pos -= 1

    def consume(self) -> str:
        value = self.text[self.start:self.pos]
        self.start = self.pos
        return value

    def rest(self) -> str:
        return self.text[self.pos:]

    # -- template level
    def parse(self) -> list[Any]:
        items: list[Any] = []
        while True:
            if self.rest().startswith("{"):
                if self.pos > self.start:
                    items.append(Text(self.consume()))
                self.pos += 1
                self.consume()
                items.append(Action(tuple(self.inside_action([]))))
                continue
            if self.next() == _EOF:
                self.backup()
                break
        if self.pos > self.start:
            items.append(Text(self.consume()))
        return items

    def inside_action(self, cur: list[Any]) -> list[Any]:
        while True:
            rest = self.rest()
            if rest.startswith("}"):
                self.pos += 1
                self.consume()
                return cur
            if rest.startswith("[?("):
                cur.append(self.filter())
                continue
            if rest.startswith(".."):
                if cur and isinstance(cur[-1], Recursive):
                    raise JSONPathError("invalid multiple recursive descent")
                self.pos += 2
                self.consume()
                cur.append(Recursive())
                if _is_alnum(self.peek()):
                    cur.append(self.field())
                continue
            ch = self.next()
            if ch == _EOF or ch in "\r\n":
                raise JSONPathError("unclosed action")
            if ch in " @$":
                self.consume()  # `$` and `@` name the current value: nothing to evaluate
            elif ch == "[":
                cur.append(self.array())
            elif ch in "\"'":
                cur.append(self.quote(ch))
            elif ch == ".":
                cur.append(self.field())
            elif ch in "+-" or ch.isdigit():
                self.backup()
                cur.append(self.number())
            elif _is_alnum(ch):
                self.backup()
                cur.append(self.identifier())
            else:
                raise JSONPathError(f"unrecognized character in action: U+{ord(ch):04X} '{ch}'")

    def field(self) -> Any:
        self.consume()
        while self._advance():
            pass
        value = self.consume()
        if value == "*":
            return Wildcard()
        return Field(value.replace("\\", ""))

    def _advance(self) -> bool:
        ch = self.next()
        if ch == "\\":
            self.next()
            return True
        if ch == _EOF or ch in _TERMINATORS:
            self.backup()
            return False
        return True

    def identifier(self) -> Any:
        while True:
            ch = self.next()
            if ch == _EOF or ch in _TERMINATORS:
                self.backup()
                break
        value = self.consume()
        if value in ("true", "false"):
            return Literal(value == "true")
        return Identifier(value)

    def number(self) -> Literal:
        if self.peek() in ("+", "-"):
            self.next()
        while True:
            ch = self.next()
            if ch != "." and not ch.isdigit():
                self.backup()
                break
        value = self.consume()
        try:
            return Literal(int(value, 10))
        except ValueError:
            pass
        try:
            return Literal(float(value))
        except ValueError:
            raise JSONPathError(f"cannot parse number {value}") from None

    def quote(self, end: str) -> Literal:
        while True:
            ch = self.next()
            if ch == _EOF or ch == "\n":
                raise JSONPathError("unterminated quoted string")
            if ch == "\\":
                nxt = self.next()
                if nxt != _EOF and nxt != "\n":
                    continue
                break
            if ch == end:
                break
        value = self.consume()
        return Literal(_unquote(value))

    def array(self) -> Any:
        while True:
            ch = self.next()
            if ch == _EOF or ch == "\n":
                raise JSONPathError("unterminated array")
            if ch == "]":
                break
        text = self.consume()[1:-1]
        if text == "*":
            text = ":"
        parts = text.split(",")
        if len(parts) > 1:
            return Union(tuple(_parse_action(f"[{p.strip(' ')}]") for p in parts))
        key = _DICT_KEY.match(text)
        if key:
            nodes = _parse_action(f".{key.group(1)}")
            if len(nodes) != 1:
                return Union((nodes,))
            return nodes[0]
        return _slice(text)

    def filter(self) -> Filter:
        self.pos += 3
        self.consume()
        begin = end = False
        pair = ""
        while True:
            ch = self.next()
            if ch == _EOF or ch == "\n":
                raise JSONPathError("unterminated filter")
            if ch in "\"'":
                if not begin:
                    begin, pair = True, ch
                    continue
                if self.text[self.pos - 2] != "\\" and ch == pair:
                    end = True
            elif ch == ")" and begin == end:
                break
        if self.next() != "]":
            raise JSONPathError("unclosed array expect ]")
        text = self.consume()[:-2]
        match = _FILTER.match(text)
        if match is None:
            return Filter(_parse_action(text), (), "exists")
        return Filter(_parse_action(match.group(1)), _parse_action(match.group(3)), match.group(2))


def _is_alnum(ch: str) -> bool:
    return ch != _EOF and (ch == "_" or ch.isalnum())


def _slice(text: str) -> Array:
    match = _SLICE.match(text)
    if match is None:
        raise JSONPathError(f"invalid array index {text}")
    raw = list(match.groups())
    params: list[Param] = []
    for i in range(3):
        value = raw[i]
        if value is not None and value != "":
            if i > 0:
                value = value[1:]
            if i > 0 and value == "":
                params.append(Param())
                continue
            try:
                params.append(Param(int(value), known=True))
            except ValueError:
                raise JSONPathError(f"array index {value} is not a number") from None
        elif i == 1:
            params.append(Param(params[0].value + 1, known=True, derived=True))
        else:
            params.append(Param())
    return Array(*params)


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", "'": "'", '"': '"'}


def _unquote(quoted: str) -> str:
    """Go's strconv-style unquoting, for strings in either quote."""
    if len(quoted) < 2 or quoted[0] != quoted[-1] or quoted[0] not in "\"'":
        raise JSONPathError(f"unquote string {quoted} error invalid syntax")
    body, out, i = quoted[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        code = body[i + 1] if i + 1 < len(body) else ""
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
        elif code in ("u", "U", "x"):
            width = {"u": 4, "U": 8, "x": 2}[code]
            digits = body[i + 2:i + 2 + width]
            try:
                out.append(chr(int(digits, 16)))
            except ValueError:
                raise JSONPathError(f"unquote string {quoted} error invalid syntax") from None
            i += 2 + width
        else:
            raise JSONPathError(f"unquote string {quoted} error invalid syntax")
    return "".join(out)


def _parse_action(text: str) -> tuple[Any, ...]:
    items = _Parser("{" + text + "}").parse()
    if not items or not isinstance(items[0], Action):
        raise JSONPathError(f"invalid expression {text}")
    return items[0].nodes


def _nest_ranges(items: list[Any]) -> tuple[Any, ...]:
    """Turn the flat `{range}`...`{end}` sequence into Range nodes."""
    out: list[Any] = []
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, Action) and item.nodes[:1] == (Identifier("range"),):
            depth, j = 1, i + 1
            while j < len(items) and depth:
                other = items[j]
                if isinstance(other, Action) and other.nodes[:1] == (Identifier("range"),):
                    depth += 1
                elif isinstance(other, Action) and other.nodes[:1] == (Identifier("end"),):
                    depth -= 1
                j += 1
            body = items[i + 1:j - 1] if depth == 0 else items[i + 1:j]
            out.append(Range(item.nodes[1:], _nest_ranges(body)))
            i = j
            continue
        out.append(item)
        i += 1
    return tuple(out)


@functools.lru_cache(maxsize=512)
def parse(template: str) -> tuple[Any, ...]:
    """Parse a template (`{.a.b}` or text with actions) into Text/Action/Range items."""
    return _nest_ranges(_Parser(template).parse())


def _as_template(path: str) -> str:
    """A bare path (`.spec.replicas`) is one action, as printer columns write it."""
    return path if "{" in path else "{" + path + "}"


# --------------------------------------------------------------------------- evaluation


@dataclasses.dataclass
class _Evaluator:
    allow_missing_keys: bool

    def run(self, items: tuple[Any, ...], data: Any) -> list[list[Any]]:
        results: list[list[Any]] = []
        for item in items:
            if isinstance(item, Text):
                results.append([item.value])
            elif isinstance(item, Range):
                for value in self.nodes([data], item.nodes):
                    results.extend(self.run(item.body, value))
            elif item.nodes[:1] == (Identifier("end"),):
                raise JSONPathError("not in range, nothing to end")
            else:
                results.append(self.nodes([data], item.nodes))
        return results

    def nodes(self, values: list[Any], nodes: tuple[Any, ...]) -> list[Any]:
        for node in nodes:
            values = self.node(values, node)
        return values

    def node(self, values: list[Any], node: Any) -> list[Any]:
        handler: Callable[[list[Any], Any], list[Any]] = getattr(self, "_" + type(node).__name__.lower())
        return handler(values, node)

    def _literal(self, values: list[Any], node: Literal) -> list[Any]:
        return [node.value]

    def _identifier(self, values: list[Any], node: Identifier) -> list[Any]:
        if node.name == "range":
            return values
        if node.name == "end":
            raise JSONPathError("not in range, nothing to end")
        raise JSONPathError(f"unrecognized identifier {node.name}")

    def _field(self, values: list[Any], node: Field) -> list[Any]:
        if not values:
            return []
        if node.name == "":
            return values
        results = [v[node.name] for v in values if isinstance(v, dict) and node.name in v]
        if not results and not self.allow_missing_keys:
            raise JSONPathError(f"{node.name} is not found")
        return results

    def _wildcard(self, values: list[Any], node: Wildcard) -> list[Any]:
        results: list[Any] = []
        for value in values:
            results.extend(_children(value))
        return results

    def _recursive(self, values: list[Any], node: Recursive) -> list[Any]:
        results: list[Any] = []
        for value in values:
            children = _children(value)
            if children:
                results.append(value)
                results.extend(self._recursive(children, node))
        return results

    def _union(self, values: list[Any], node: Union) -> list[Any]:
        results: list[Any] = []
        for branch in node.branches:
            results.extend(self.nodes(values, branch))
        return results

    def _array(self, values: list[Any], node: Array) -> list[Any]:
        results: list[Any] = []
        for value in values:
            if value is None:
                continue
            if not isinstance(value, list):
                raise JSONPathError(f"{_go_type(value)} is not array or slice")
            results.extend(_slice_of(value, node))
        return results

    def _filter(self, values: list[Any], node: Filter) -> list[Any]:
        results: list[Any] = []
        for value in values:
            if not isinstance(value, list):
                raise JSONPathError(f"{_go_repr(value)} is not array or slice and cannot be filtered")
            results.extend(item for item in value if self._passes(item, node))
        return results

    def _passes(self, item: Any, node: Filter) -> bool:
        if node.operator == "exists":
            try:
                return bool(self.nodes([item], node.left))
            except JSONPathError:
                return False
        left = self._one(self.nodes([item], node.left))
        if left is _NONE:
            return False
        right = self._one(self.nodes([item], node.right))
        if right is _NONE:
            return False
        return _compare(node.operator, left, right)

    @staticmethod
    def _one(values: list[Any]) -> Any:
        if not values:
            return _NONE
        if len(values) > 1:
            raise JSONPathError("can only compare one element at a time")
        return values[0]


_NONE = object()


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return list(value)
    if isinstance(value, str):
        return list(value.encode())  # Go ranges over a string's bytes
    return []


def _slice_of(value: list[Any], node: Array) -> list[Any]:
    length = len(value)
    start = node.start.value if node.start.known else 0
    if start < 0:
        start += length
    end = node.end.value if node.end.known else length
    if end < 0 or (end == 0 and node.end.derived):
        end += length
    if end == start:
        return []
    if start >= length or start < 0:
        raise JSONPathError(f"array index out of bounds: index {start}, length {length}")
    if end > length or end < 0:
        raise JSONPathError(f"array index out of bounds: index {end - 1}, length {length}")
    if start > end:
        raise JSONPathError(f"starting index {start} is greater than ending index {end}")
    step = 1
    if node.step.known:
        if node.step.value <= 0:
            raise JSONPathError("step must be > 0")
        step = node.step.value
    return value[start:end:step]


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    raise JSONPathError("invalid type for comparison")


def _compare(operator: str, left: Any, right: Any) -> bool:
    """Go template comparison: same basic kind only; booleans compare for (in)equality only."""
    k1, k2 = _kind(left), _kind(right)
    if k1 != k2:
        raise JSONPathError("incompatible types for comparison")
    if operator == "==":
        return bool(left == right)
    if operator == "!=":
        return bool(left != right)
    if k1 == "bool":
        raise JSONPathError("invalid type for comparison")
    ordered: dict[str, Callable[[Any, Any], bool]] = {
        "<": lambda a, b: a < b, ">": lambda a, b: a > b,
        "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
    }
    if operator not in ordered:
        raise JSONPathError(f"unrecognized filter operator {operator}")
    return ordered[operator](left, right)


def find_results(path: str, data: Any, *, allow_missing_keys: bool = True) -> list[list[Any]]:
    """One list of results per top-level action (or text), as client-go's FindResults."""
    return _Evaluator(allow_missing_keys).run(parse(_as_template(path)), data)


def evaluate(path: str, data: Any, *, allow_missing_keys: bool = True) -> list[Any]:
    """All results of `path` against `data`, flattened, in document order."""
    return [value for group in find_results(path, data, allow_missing_keys=allow_missing_keys)
            for value in group]


# --------------------------------------------------------------------------- text output


def format_text(value: Any) -> str:
    """One result as `-o jsonpath` prints it: containers as compact JSON, scalars as Go's %v."""
    if isinstance(value, dict | list):
        return go_json(value)
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)


def execute(template: str, data: Any, *, allow_missing_keys: bool = False) -> str:
    """Render a whole template (`kubectl -o jsonpath=...`): results joined by spaces per action."""
    groups = _Evaluator(allow_missing_keys).run(parse(template), data)
    return "".join(" ".join(format_text(v) for v in group) for group in groups)


go_float = gofmt.format_float


def go_json(value: Any) -> str:
    """encoding/json.Marshal of decoded JSON (what a jsonpath result that is a list or map prints)."""
    try:
        return gofmt.marshal_json(value)
    except TypeError as e:
        raise JSONPathError(str(e)) from None


def _go_type(value: Any) -> str:
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    return "interface {}"


def _go_repr(value: Any) -> str:
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_repr(v)}" for k, v in sorted(value.items())) + "]"
    if value is None:
        return "<invalid reflect.Value>"
    return format_text(value)
