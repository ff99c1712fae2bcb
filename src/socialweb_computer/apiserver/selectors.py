"""Label and field selectors, parsed, validated and matched the way kube-apiserver does.

Why it exists: `?labelSelector=` and `?fieldSelector=` on list and watch requests, and the
`metav1.LabelSelector` objects inside Deployments, ReplicaSets, Services, PDBs..., must accept,
reject and match exactly what a real cluster does, with the same error wording (clients show
it verbatim: `Error from server (BadRequest): unable to parse requirement: ...`).

Who calls it: the store's list/watch filter (`parse_label_selector`, `parse_field_selector`,
`FieldSelector.validate`, `.matches`), controllers (`from_label_selector_object`), and the
printers (`format_labels`, `format_label_selector`).

Which fields a kind can be selected on is data: `FIELD_LABELS`, keyed by (group, kind). A kind
without a row accepts only `metadata.name` and `metadata.namespace`, with the default wording.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from socialweb_computer.api import errors, gofmt

# --------------------------------------------------------------------------- label syntax checks
# (apimachinery util/validation: the same rules and messages a real server prints)

_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME = re.compile(_QUALIFIED_NAME_FMT)
_QUALIFIED_NAME_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', "
                       "and must start and end with an alphanumeric character")
_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE = re.compile(_LABEL_VALUE_FMT)
_LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, "
                    "'-', '_' or '.', and must start and end with an alphanumeric character")
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = f"{_DNS1123_LABEL_FMT}(\\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN = re.compile(_DNS1123_SUBDOMAIN_FMT)
_DNS1123_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                          "characters, '-' or '.', and must start and end with an alphanumeric character")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # The doubled spaces (",  or") are in the original and show up in kubectl output.
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len_error(length: int) -> str:
    return f"must be no more than {length} characters"


def qualified_name_errors(value: str) -> list[str]:
    """IsQualifiedName: `[prefix/]name`, the shape of a label key."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in dns1123_subdomain_errors(prefix))
    else:
        return ["a qualified name " + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT,
                                                   "MyName", "my.name", "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _max_len_error(63))
    if not _QUALIFIED_NAME.fullmatch(name):
        errs.append("name part " + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT,
                                                "MyName", "my.name", "123-abc"))
    return errs


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > 253:
        errs.append(_max_len_error(253))
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        errs.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errs


def label_value_errors(value: str) -> list[str]:
    errs: list[str] = []
    if len(value) > 63:
        errs.append(_max_len_error(63))
    if not _LABEL_VALUE.fullmatch(value):
        errs.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


class SelectorError(ValueError):
    """A selector that does not parse or validate; the message is the real server's."""


def _invalid(path: str, value: Any, detail: str) -> str:
    """field.Invalid(...).Error(): `<path>: Invalid value: <value>: <detail>`."""
    if isinstance(value, str):
        shown = gofmt.quote(value)
    elif isinstance(value, list | tuple):
        shown = "[]string{" + ", ".join(gofmt.quote(v) for v in value) + "}"
    else:
        shown = str(value)
    return f"{path}: Invalid value: {shown}: {detail}"


def _aggregate(messages: list[str]) -> str:
    """utilerrors.Aggregate: one message as is, several deduplicated inside brackets."""
    unique = list(dict.fromkeys(messages))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


# --------------------------------------------------------------------------- label selectors

IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS = "in", "notin", "=", "==", "!="
EXISTS, DOES_NOT_EXIST, GREATER_THAN, LESS_THAN = "exists", "!", "gt", "lt"
_BINARY_OPERATORS = (IN, NOT_IN, EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN)


def _parse_int64(value: str) -> int | None:
    if not re.fullmatch(r"[+-]?\d+", value):
        return None
    number = int(value)
    return number if -(2**63) <= number < 2**63 else None


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One `key op values` term; `values` keep the order given (sorted when parsed from a string)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator in (IN, EQUALS, DOUBLE_EQUALS):
            return present and value in self.values
        if self.operator in (NOT_IN, NOT_EQUALS):
            return not present or value not in self.values
        if self.operator == EXISTS:
            return present
        if self.operator == DOES_NOT_EXIST:
            return not present
        if self.operator in (GREATER_THAN, LESS_THAN):
            have = _parse_int64(value) if present else None
            want = _parse_int64(self.values[0]) if len(self.values) == 1 else None
            if have is None or want is None:
                return False
            return have > want if self.operator == GREATER_THAN else have < want
        return False

    def __str__(self) -> str:
        prefix = "!" if self.operator == DOES_NOT_EXIST else ""
        if self.operator in (EXISTS, DOES_NOT_EXIST):
            return prefix + self.key
        symbol = {IN: " in ", NOT_IN: " notin ", GREATER_THAN: ">", LESS_THAN: "<"}.get(self.operator,
                                                                                        self.operator)
        values = self.values[0] if len(self.values) == 1 else ",".join(sorted(self.values))
        if self.operator in (IN, NOT_IN):
            values = f"({values})"
        return f"{self.key}{symbol}{values}"


def new_requirement(key: str, operator: str, values: Iterable[str], path: str = "") -> Requirement:
    """labels.NewRequirement: validate key, operator arity and values (errors aggregated)."""
    vals = list(values)
    errs: list[str] = []
    key_path = f"{path}.key" if path else "key"
    values_path = f"{path}.values" if path else "values"
    if key_errs := qualified_name_errors(key):
        errs.append(_invalid(key_path, key, "; ".join(key_errs)))
    if operator in (IN, NOT_IN):
        if not vals:
            errs.append(_invalid(values_path, vals, "for 'in', 'notin' operators, values set can't be empty"))
    elif operator in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS):
        if len(vals) != 1:
            errs.append(_invalid(values_path, vals, "exact-match compatibility requires one single value"))
    elif operator in (EXISTS, DOES_NOT_EXIST):
        if vals:
            errs.append(_invalid(values_path, vals, "values set must be empty for exists and does not exist"))
    elif operator in (GREATER_THAN, LESS_THAN):
        if len(vals) != 1:
            errs.append(_invalid(values_path, vals,
                                 "for 'Gt', 'Lt' operators, exactly one value is required"))
        for i, value in enumerate(vals):
            if _parse_int64(value) is None:
                errs.append(_invalid(f"{values_path}[{i}]", value,
                                     "for 'Gt', 'Lt' operators, the value must be an integer"))
    else:
        supported = ", ".join(gofmt.quote(op) for op in (*_BINARY_OPERATORS, EXISTS, DOES_NOT_EXIST))
        errs.append(f"{path + '.' if path else ''}operator: Unsupported value: {gofmt.quote(operator)}: "
                    f"supported values: {supported}")
    for i, value in enumerate(vals):
        if value_errs := label_value_errors(value):
            errs.append(_invalid(f"{values_path}[{i}][{key}]", value, "; ".join(value_errs)))
    if errs:
        raise SelectorError(_aggregate(errs))
    return Requirement(key, operator, tuple(vals))


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """An AND of requirements. `nothing` is the selector a nil metav1.LabelSelector converts to."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    @property
    def empty(self) -> bool:
        """True when the selector does not restrict anything (matches every label set)."""
        return not self.nothing and not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def requires_exact_match(self, key: str) -> str | None:
        """The single value `key` must have (from `=`, `==` or a one-value `in`), if any."""
        for r in self.requirements:
            if r.key == key:
                if r.operator in (EQUALS, DOUBLE_EQUALS, IN) and len(r.values) == 1:
                    return r.values[0]
                return None
        return None

    def __str__(self) -> str:
        return "" if self.nothing else ",".join(str(r) for r in self.requirements)


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)


def _sorted_by_key(requirements: Iterable[Requirement]) -> tuple[Requirement, ...]:
    return tuple(sorted(requirements, key=lambda r: r.key))


# The lexer and parser follow apimachinery's labels.Parse token by token, so that what fails,
# and the message it fails with, are the same.
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_TOKENS = {")": "closedpar", ",": "comma", "!": "not", "==": "doubleequals", "=": "equals",
           ">": "gt", "in": "in", "<": "lt", "!=": "notequals", "notin": "notin", "(": "openpar"}


def _lex(text: str) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        if pos >= len(text):
            items.append(("end", ""))
            return items
        if text[pos] in _SPECIAL:
            token, literal, pos = _lex_special(text, pos)
        else:
            start = pos
            while pos < len(text) and text[pos] not in _SPECIAL and text[pos] not in _WHITESPACE:
                pos += 1
            literal = text[start:pos]
            token = _TOKENS.get(literal, "id") if literal in ("in", "notin") else "id"
        items.append((token, literal))
        if token == "error":
            items.append(("end", ""))
            return items


def _lex_special(text: str, pos: int) -> tuple[str, str, int]:
    buffer, last = "", ("", "")
    while pos < len(text) and text[pos] in _SPECIAL:
        buffer += text[pos]
        pos += 1
        if buffer in _TOKENS:
            last = (_TOKENS[buffer], buffer)
        elif last[0]:
            pos -= 1
            break
    if not last[0]:
        return "error", f"error expected: keyword found '{buffer}'", pos
    return last[0], last[1], pos


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def _value_token(self, token: str) -> str:
        # In value position `in`/`notin` are ordinary words ("x in (in)").
        return "id" if token in ("in", "notin") else token

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        token, literal = self.items[self.position]
        return (self._value_token(token) if values else token), literal

    def consume(self, values: bool = True) -> tuple[str, str]:
        token, literal = self.items[self.position]
        self.position += 1
        return (self._value_token(token) if values else token), literal

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            token, literal = self.lookahead()
            if token in ("id", "not"):
                try:
                    requirements.append(self.requirement())
                except SelectorError as e:
                    raise SelectorError(f"unable to parse requirement: {e}") from None
                token, literal = self.consume()
                if token == "end":
                    return requirements
                if token != "comma":
                    raise SelectorError(f"found '{literal}', expected: ',' or 'end of string'")
                token2, literal2 = self.lookahead()
                if token2 not in ("id", "not"):
                    raise SelectorError(f"found '{literal2}', expected: identifier after ','")
            elif token == "end":
                return requirements
            else:
                raise SelectorError(f"found '{literal}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        key, operator = self.key_and_operator()
        if operator in (EXISTS, DOES_NOT_EXIST):
            return new_requirement(key, operator, [])
        operator = self.operator()
        values = self.values() if operator in (IN, NOT_IN) else self.exact_value()
        return new_requirement(key, operator, sorted(values))

    def key_and_operator(self) -> tuple[str, str]:
        operator = ""
        token, literal = self.consume()
        if token == "not":
            operator = DOES_NOT_EXIST
            token, literal = self.consume()
        if token != "id":
            raise SelectorError(f"found '{literal}', expected: identifier")
        if key_errs := qualified_name_errors(literal):
            raise SelectorError(_invalid("<nil>", literal, "; ".join(key_errs)))
        if self.lookahead()[0] in ("end", "comma") and operator != DOES_NOT_EXIST:
            operator = EXISTS
        return literal, operator

    def operator(self) -> str:
        token, literal = self.consume(values=False)
        operators = {"in": IN, "equals": EQUALS, "doubleequals": DOUBLE_EQUALS, "gt": GREATER_THAN,
                     "lt": LESS_THAN, "notin": NOT_IN, "notequals": NOT_EQUALS}
        if token not in operators:
            raise SelectorError(f"found '{literal}', expected: {', '.join(_BINARY_OPERATORS)}")
        return operators[token]

    def values(self) -> set[str]:
        token, literal = self.consume()
        if token != "openpar":
            raise SelectorError(f"found '{literal}' expected: '('")
        token, literal = self.lookahead()
        if token in ("id", "comma"):
            values = self.identifiers()
            if self.consume()[0] != "closedpar":
                raise SelectorError(f"found '{literal}', expected: ')'")
            return values
        if token == "closedpar":
            self.consume()
            return {""}
        raise SelectorError(f"found '{literal}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            token, literal = self.consume()
            if token == "id":
                values.add(literal)
                token2, literal2 = self.lookahead()
                if token2 == "comma":
                    continue
                if token2 == "closedpar":
                    return values
                raise SelectorError(f"found '{literal2}', expected: ',' or ')'")
            if token == "comma":
                if not values:
                    values.add("")
                token2 = self.lookahead()[0]
                if token2 in ("closedpar", "comma"):
                    values.add("")
                if token2 == "closedpar":
                    return values
                continue
            raise SelectorError(f"found '{literal}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        token, _ = self.lookahead()
        if token in ("end", "comma"):
            return {""}
        token, literal = self.consume()
        if token == "id":
            return {literal}
        raise SelectorError(f"found '{literal}', expected: identifier")


def parse_label_selector_or_error(text: str) -> LabelSelector:
    """labels.Parse; raises SelectorError with the real message."""
    return LabelSelector(_sorted_by_key(_LabelParser(text).parse()))


def parse_label_selector(text: str) -> LabelSelector:
    """A `labelSelector` query parameter; malformed → 400 BadRequest with the server's wording."""
    try:
        return parse_label_selector_or_error(text)
    except SelectorError as e:
        raise errors.bad_request(str(e)) from None


_EXPRESSION_OPERATORS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


def from_label_selector_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """metav1.LabelSelectorAsSelector: None selects nothing, `{}` selects everything.

    Raises SelectorError (a ValueError) for an invalid selector, with the real message.
    """
    if selector is None:
        return NOTHING
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return EVERYTHING
    requirements = [new_requirement(str(k), EQUALS, [str(v)]) for k, v in match_labels.items()]
    for expr in expressions:
        operator = expr.get("operator", "")
        if operator not in _EXPRESSION_OPERATORS:
            raise SelectorError(f"{gofmt.quote(operator)} is not a valid label selector operator")
        requirements.append(new_requirement(expr.get("key", ""), _EXPRESSION_OPERATORS[operator],
                                            list(expr.get("values") or [])))
    return LabelSelector(_sorted_by_key(requirements))


def selector_from_labels(labels: Mapping[str, str] | None) -> LabelSelector:
    """labels.SelectorFromSet: equality on every pair; an empty map selects everything."""
    return LabelSelector(_sorted_by_key(Requirement(k, EQUALS, (v,)) for k, v in (labels or {}).items()))


def format_labels(labels: Mapping[str, str] | None) -> str:
    """labels.FormatLabels: `k=v,...` sorted by key, or `<none>`."""
    text = ",".join(f"{k}={labels[k]}" for k in sorted(labels or {}))
    return text or "<none>"


def format_label_selector(selector: Mapping[str, Any] | None) -> str:
    """metav1.FormatLabelSelector: the selector's string, `<none>` when it has none, `<error>`."""
    try:
        text = str(from_label_selector_object(selector))
    except SelectorError:
        return "<error>"
    return text or "<none>"


# --------------------------------------------------------------------------- field selectors

_FIELD_OPERATORS = ("!=", "==", "=")


@dataclasses.dataclass(frozen=True)
class FieldTerm:
    field: str
    operator: str  # "=", "==" or "!="
    value: str

    def matches(self, value: str) -> bool:
        return (value != self.value) if self.operator == "!=" else (value == self.value)

    def __str__(self) -> str:
        op = "!=" if self.operator == "!=" else "="
        return f"{self.field}{op}{escape_field_value(self.value)}"


def escape_field_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _unescape_field_value(value: str) -> str:
    if not any(c in value for c in "\\,="):
        return value
    out: list[str] = []
    in_slash = False
    for ch in value:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch in ",=":
            # Go prints the rune with %v, i.e. as its code point number.
            raise SelectorError(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if in_slash:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def _split_terms(text: str) -> list[str]:
    if not text:
        return []
    terms, start, in_slash = [], 0, False
    for i, ch in enumerate(text):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    for i in range(len(term)):
        for op in _FIELD_OPERATORS:
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
    return None


Getter = Callable[[Mapping[str, Any]], str]


@dataclasses.dataclass(frozen=True)
class FieldLabels:
    """What one kind can be selected on: label → how to read it, and how a refusal is worded."""

    getters: Mapping[str, Getter]
    refusal: Callable[[str], str]


def _default_refusal(label: str) -> str:
    return f'{gofmt.quote(label)} is not a known field selector: only "metadata.name", "metadata.namespace"'


def _not_supported(label: str) -> str:
    return f"field label not supported: {label}"


@dataclasses.dataclass
class FieldSelector:
    """An AND of field terms. `validate()` binds it to a kind; `matches()` then reads that kind's fields."""

    terms: tuple[FieldTerm, ...] = ()
    _labels: FieldLabels | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def empty(self) -> bool:
        return not self.terms

    def validate(self, group: str, kind: str, *, custom: bool = False,
                 selectable_fields: Iterable[str] = ()) -> FieldSelector:
        """Check every field is selectable on the kind (400 BadRequest otherwise); returns self.

        `selectable_fields` are a CustomResourceDefinition version's `selectableFields` paths
        (`.spec.color` or `spec.color`); a custom kind without them is treated like any kind
        without a field table.
        """
        labels = field_labels_for(group, kind, custom=custom, selectable_fields=selectable_fields)
        for term in self.terms:  # sorted, so the first failing term is the one Go reports
            if term.field not in labels.getters:
                raise errors.bad_request(labels.refusal(term.field))
        self._labels = labels
        return self

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """True when every term holds. Missing fields read as "", booleans as "true"/"false"."""
        labels = self._labels or _labels_of(obj)
        return all(term.matches(_read(labels, term.field, obj)) for term in self.terms)

    def requires_exact_match(self, field: str) -> str | None:
        for term in self.terms:
            if term.field == field and term.operator in ("=", "=="):
                return term.value
        return None

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms)


def parse_field_selector_or_error(text: str) -> FieldSelector:
    """fields.ParseSelector; raises SelectorError with the real message."""
    terms: list[FieldTerm] = []
    for part in sorted(_split_terms(text)):
        if not part:
            continue
        split = _split_term(part)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, raw = split
        terms.append(FieldTerm(field, op, _unescape_field_value(raw)))
    return FieldSelector(tuple(terms))


def parse_field_selector(text: str) -> FieldSelector:
    """A `fieldSelector` query parameter; malformed → 400 BadRequest with the server's wording."""
    try:
        return parse_field_selector_or_error(text)
    except SelectorError as e:
        raise errors.bad_request(str(e)) from None


# -- reading fields out of objects


def _path(*keys: str, default: str = "") -> Getter:
    def read(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            if not isinstance(value, Mapping):
                return default
            value = value.get(key)
        return _as_field_string(value, default)

    return read


def _as_field_string(value: Any, default: str = "") -> str:
    if value is None:
        return default
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(int(value)) if isinstance(value, int) or value.is_integer() else repr(value)
    return value if isinstance(value, str) else default


def _first_of(*getters: Getter) -> Getter:
    def read(obj: Mapping[str, Any]) -> str:
        for getter in getters:
            if value := getter(obj):
                return value
        return ""

    return read


def _pod_ip(obj: Mapping[str, Any]) -> str:
    # The internal PodStatus keeps podIPs; a v1 object with only podIP converts to podIPs=[podIP].
    status = obj.get("status") or {}
    ips = status.get("podIPs") or []
    if ips and isinstance(ips[0], Mapping):
        return str(ips[0].get("ip") or "")
    return str(status.get("podIP") or "")


_META: dict[str, Getter] = {"metadata.name": _path("metadata", "name"),
                            "metadata.namespace": _path("metadata", "namespace")}

_CORE_EVENT: dict[str, Getter] = {
    **_META,
    **{f"involvedObject.{f}": _path("involvedObject", f)
       for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
    "reason": _path("reason"),
    "reportingComponent": _path("reportingComponent"),
    "source": _first_of(_path("source", "component"), _path("reportingComponent")),
    "type": _path("type"),
}

_EVENTS_V1: dict[str, Getter] = {
    **_META,
    **{f"regarding.{f}": _path("regarding", f)
       for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
    "reason": _path("reason"),
    "reportingController": _path("reportingController"),
    "source": _first_of(_path("deprecatedSource", "component"), _path("reportingController")),
    "type": _path("type"),
}

# Kinds that register a field-label conversion (pkg/apis/*/v1 conversion.go). Labels a kind accepts
# but does not put in its selectable field set (pod `status.podIPs`) read as "".
FIELD_LABELS: dict[tuple[str, str], FieldLabels] = {
    ("", "Pod"): FieldLabels({
        **_META,
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.host": _path("spec", "nodeName"),  # old v1 clients' name for spec.nodeName
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _path("spec", "hostNetwork", default="false"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _pod_ip,
        "status.podIPs": lambda obj: "",
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    }, _not_supported),
    ("", "Node"): FieldLabels({"metadata.name": _path("metadata", "name"),
                               "spec.unschedulable": _path("spec", "unschedulable", default="false")},
                              _not_supported),
    ("", "ReplicationController"): FieldLabels({**_META, "status.replicas": _path("status", "replicas",
                                                                                  default="0")},
                                               _not_supported),
    ("", "Event"): FieldLabels(_CORE_EVENT, _not_supported),
    ("events.k8s.io", "Event"): FieldLabels(_EVENTS_V1, _not_supported),
    ("", "Namespace"): FieldLabels({"metadata.name": _path("metadata", "name"),
                                    "status.phase": _path("status", "phase")}, _not_supported),
    ("", "Secret"): FieldLabels({**_META, "type": _path("type")}, _not_supported),
    ("", "Service"): FieldLabels({**_META, "spec.clusterIP": _path("spec", "clusterIP"),
                                  "spec.type": _path("spec", "type")}, _not_supported),
    ("batch", "Job"): FieldLabels(
        {**_META, "status.successful": _path("status", "succeeded", default="0")},
        lambda label: f"field label {gofmt.quote(label)} not supported for batchv1.Job"),
    ("certificates.k8s.io", "CertificateSigningRequest"): FieldLabels(
        {"metadata.name": _path("metadata", "name"), "spec.signerName": _path("spec", "signerName")},
        _not_supported),
    ("certificates.k8s.io", "ClusterTrustBundle"): FieldLabels(
        {"metadata.name": _path("metadata", "name"), "spec.signerName": _path("spec", "signerName")},
        _not_supported),
    ("certificates.k8s.io", "PodCertificateRequest"): FieldLabels(
        {**_META, **{f"spec.{f}": _path("spec", f) for f in ("signerName", "podName", "nodeName")}},
        _not_supported),
    ("resource.k8s.io", "ResourceSlice"): FieldLabels(
        {"metadata.name": _path("metadata", "name"), "spec.nodeName": _path("spec", "nodeName"),
         "spec.driver": _path("spec", "driver"), "spec.pool.name": _path("spec", "pool", "name")},
        _not_supported),
}

_DEFAULT_LABELS = FieldLabels(_META, _default_refusal)


def field_labels_for(group: str, kind: str, *, custom: bool = False,
                     selectable_fields: Iterable[str] = ()) -> FieldLabels:
    """The field table of a kind (built-in row, CRD selectable fields, or name/namespace only)."""
    if custom:
        paths = [p.lstrip(".") for p in selectable_fields]
        if not paths:
            return _DEFAULT_LABELS
        getters = dict(_META)
        getters.update({p: _path(*p.split(".")) for p in paths})
        return FieldLabels(getters, _not_supported)
    return FIELD_LABELS.get((group, kind), _DEFAULT_LABELS)


def _labels_of(obj: Mapping[str, Any]) -> FieldLabels:
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    return FIELD_LABELS.get((group, str(obj.get("kind") or "")), _DEFAULT_LABELS)


def _read(labels: FieldLabels, field: str, obj: Mapping[str, Any]) -> str:
    getter = labels.getters.get(field)
    if getter is None:
        # An unvalidated selector on an unknown field: read the dotted path as is.
        getter = _path(*field.split("."))
    return getter(obj)
