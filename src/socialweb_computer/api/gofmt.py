"""How Go prints values, for messages clients compare byte for byte.

Kubernetes builds its error and warning texts with Go's `fmt` and `strconv`; matching
them means quoting strings as `strconv.Quote` does and printing floats as `%v` does.
Every module that words a Go message uses these two, so they agree with each other.
"""

from __future__ import annotations

import math
from typing import Any

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            "\\": "\\\\", '"': '\\"'}


def quote(text: str) -> str:
    """strconv.Quote (what `%q` prints)."""
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            cp = ord(ch)
            out.append(f"\\x{cp:02x}" if cp < 0x80 else f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def shortest_digits(value: float) -> tuple[str, int]:
    """The shortest round-tripping digits of |value| and the decimal exponent of the first one."""
    if value == 0:
        return "0", 0
    mantissa, _, e = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    run = whole + frac
    stripped = run.lstrip("0")
    exp = len(whole) - (len(run) - len(stripped)) - 1 + (int(e) if e else 0)
    return stripped.rstrip("0") or "0", exp


def fixed(digits: str, exp: int) -> str:
    """Digits with their first one at 10**exp, written without an exponent."""
    if exp < 0:
        return "0." + "0" * (-exp - 1) + digits
    if len(digits) <= exp + 1:
        return digits + "0" * (exp + 1 - len(digits))
    return digits[:exp + 1] + "." + digits[exp + 1:]


def format_float(value: float) -> str:
    """`%v` of a float64: shortest digits, exponent form below 1e-4 or from 1e6 up."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    digits, exp = shortest_digits(value)
    sign = "-" if math.copysign(1.0, value) < 0 else ""  # Go prints -0 for negative zero
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return sign + fixed(digits, exp)


def _json_float(value: float) -> str:
    """encoding/json's float64: fixed notation unless the exponent is below -6 or at least 21."""
    digits, exp = shortest_digits(value)
    sign = "-" if value < 0 else ""
    if exp < -6 or exp >= 21:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp)}"
    return sign + fixed(digits, exp)


_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _json_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def marshal_json(value: Any) -> str:
    """encoding/json.Marshal of decoded JSON: sorted keys, no spaces, HTML-safe escapes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json_string(k)}:{marshal_json(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(marshal_json(v) for v in value) + "]"
    raise TypeError(f"json: unsupported type: {type(value).__name__}")


class GoSyntax(str):
    """Text already in Go's `%#v` form (a struct, map or slice), printed as it is."""


def go_string_map(value: dict[str, Any] | None) -> GoSyntax:
    """`%#v` of a map[string]string: keys sorted, as fmt prints maps."""
    if value is None:
        return GoSyntax("map[string]string(nil)")
    items = ", ".join(f"{quote(str(k))}:{quote(str(value[k]))}" for k in sorted(value))
    return GoSyntax(f"map[string]string{{{items}}}")


def go_string_slice(value: list[Any] | None) -> GoSyntax:
    if value is None:
        return GoSyntax("[]string(nil)")
    return GoSyntax("[]string{" + ", ".join(quote(str(v)) for v in value) + "}")


def go_label_selector(selector: dict[str, Any] | None) -> GoSyntax:
    """`%#v` of a metav1.LabelSelector, as validation messages print a selector."""
    selector = selector or {}
    expressions = selector.get("matchExpressions")
    if expressions is None:
        shown = "[]v1.LabelSelectorRequirement(nil)"
    else:
        shown = "[]v1.LabelSelectorRequirement{" + ", ".join(
            f"v1.LabelSelectorRequirement{{Key:{quote(str(e.get('key', '')))}, "
            f"Operator:{quote(str(e.get('operator', '')))}, Values:{go_string_slice(e.get('values'))}}}"
            for e in expressions if isinstance(e, dict)) + "}"
    labels = selector.get("matchLabels")
    return GoSyntax(f"v1.LabelSelector{{MatchLabels:{go_string_map(labels)}, MatchExpressions:{shown}}}")


def value(v: Any) -> str:
    """A value as field.Error prints it: strings quoted, numbers and booleans as %v, nil as null,
    Go syntax as given; other JSON values (maps and lists of unknown Go type) as their JSON."""
    if isinstance(v, GoSyntax):
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, dict) and all(isinstance(x, str) for x in v.values()):
        return go_string_map(v)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return go_string_slice(v)
    return marshal_json(v)


def duration(seconds: float) -> str:
    """Go's `time.Duration.String()`: `10s`, `1m20s`, `2h0m0s`, `1.5s`, `523.4ms`, `0s`."""
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)

    def trimmed(value: float, places: int) -> str:
        return f"{value:.{places}f}".rstrip("0").rstrip(".")

    if nanos < 1_000:
        return f"{sign}{nanos}ns"
    if nanos < 1_000_000:
        return f"{sign}{trimmed(nanos / 1e3, 3)}µs"
    if nanos < 1_000_000_000:
        return f"{sign}{trimmed(nanos / 1e6, 6)}ms"
    hours, rest = divmod(nanos, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = f"{hours}h{minutes}m" if hours else (f"{minutes}m" if minutes else "")
    return f"{sign}{text}{trimmed(rest / 1e9, 9) or '0'}s"
