"""RFC 6902 JSON patch, and reading patch bodies the way kube-apiserver's Go code reads them.

Called by `patching.patch_object` (and through it the generic store) for
`application/json-patch+json` requests. The sibling modules import the body
decoding and error helpers from here, because every patch type shares them.

kube-apiserver applies JSON patches with evanphx/json-patch v4, which differs
from the RFC in ways clients can see: `replace` of a missing object member adds
it, `test` of a missing member against null passes, an operation without a
`value` writes null, and the empty path ("") never resolves. We keep the
`jsonpatch` package for the operations and adjust those spots. Any failure while
applying is the server's generic 422 ("the server rejected our request due to an
error in our request"), which carries none of the library's detail; body errors
are 400 with Go's `encoding/json` wording.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator, MutableMapping
from types import MappingProxyType
from typing import Any

import jsonpatch
import jsonpointer
import orjson

from socialweb_computer.api import errors
from socialweb_computer.apiserver import limits

# handlers.maxJSONPatchOperations in kube-apiserver.
MAX_JSON_PATCH_OPERATIONS = limits.MAX_JSON_PATCH_OPERATIONS

# The fieldValidation value under which the server decodes patch bodies leniently; every
# other one ("" means Warn, or Strict) decodes strictly, which changes the 400 messages.
LENIENT_VALIDATION = "Ignore"


class GoJSONError(ValueError):
    """A body that Go's encoding/json would not decode; the message is Go's."""


# --- errors the patch handlers share ------------------------------------------------------------

def rejected() -> errors.StatusError:
    """NewGenericServerResponse(422, ...): the message drops whatever the patch library said."""
    message = "the server rejected our request due to an error in our request"
    return errors.StatusError(422, "Invalid", message, details={})


def failed(message: str) -> errors.StatusError:
    """A patch the merge code cannot apply, in the Go code's words. Upstream lets these plain
    errors reach the handler as a 500 with no reason; the fault is the patch's, so ours is
    a 400 BadRequest."""
    return errors.bad_request(message)


# --- decoding bodies like encoding/json ----------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid literal {name}")


def decode_json(body: bytes) -> Any:
    """Parse a request body; syntax errors are reported with Go's scanner wording."""
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise GoJSONError(_syntax_error(text) or str(exc)) from None


def json_kind(value: Any) -> str:
    """The word Go's UnmarshalTypeError uses for a JSON value."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    return "number"


def cannot_unmarshal(value: Any, go_type: str) -> str:
    return f"json: cannot unmarshal {json_kind(value)} into Go value of type {go_type}"


def _quote_char(ch: str) -> str:
    """Go's quoteChar: one byte, quoted with single quotes the way strconv.Quote escapes it."""
    byte = ch.encode("utf-8", errors="replace")[0]
    if byte == 0x27:
        return "'\\''"
    if byte == 0x22:
        return "'\"'"
    named = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}
    if byte in named:
        return f"'{named[byte]}'"
    if byte < 0x20 or byte == 0x7F:
        return f"'\\x{byte:02x}'"
    if 0x80 <= byte < 0xA0 or byte == 0xAD:
        return f"'\\u{byte:04x}'"
    return f"'{chr(byte)}'"


class _Syntax(Exception):
    pass


_EOF = "unexpected end of JSON input"
_WS = " \t\r\n"
_DIGITS = "0123456789"


class _Scanner:
    """Finds the first syntax error in a document the way Go's scanner words it."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)

    def bad(self, i: int, context: str) -> _Syntax:
        if i >= self.n:
            return _Syntax(_EOF)
        return _Syntax(f"invalid character {_quote_char(self.s[i])} {context}")

    def ws(self, i: int) -> int:
        while i < self.n and self.s[i] in _WS:
            i += 1
        return i

    def expect(self, i: int, char: str, context: str) -> int:
        i = self.ws(i)
        if i >= self.n or self.s[i] != char:
            raise self.bad(i, context)
        return i + 1

    def string(self, i: int) -> int:
        j = i + 1
        while True:
            if j >= self.n:
                raise _Syntax(_EOF)
            ch = self.s[j]
            if ch == '"':
                return j + 1
            if ch == "\\":
                j = self.escape(j + 1)
            elif ord(ch) < 0x20:
                raise self.bad(j, "in string literal")
            else:
                j += 1

    def escape(self, j: int) -> int:
        if j >= self.n:
            raise _Syntax(_EOF)
        if self.s[j] in '"\\/bfnrt':
            return j + 1
        if self.s[j] != "u":
            raise self.bad(j, "in string escape code")
        for k in range(j + 1, j + 5):
            if k >= self.n:
                raise _Syntax(_EOF)
            if self.s[k] not in "0123456789abcdefABCDEF":
                raise self.bad(k, "in \\u hexadecimal character escape")
        return j + 5

    def digits(self, i: int, context: str) -> int:
        if i >= self.n or self.s[i] not in _DIGITS:
            raise self.bad(i, context)
        while i < self.n and self.s[i] in _DIGITS:
            i += 1
        return i

    def number(self, i: int) -> int:
        if self.s[i] == "-":
            i += 1
        if i < self.n and self.s[i] == "0":
            i += 1
        else:
            i = self.digits(i, "in numeric literal")
        if i < self.n and self.s[i] == ".":
            i = self.digits(i + 1, "after decimal point in numeric literal")
        if i < self.n and self.s[i] in "eE":
            i += 1
            if i < self.n and self.s[i] in "+-":
                i += 1
            i = self.digits(i, "in exponent of numeric literal")
        return i

    def literal(self, i: int) -> int:
        word = {"t": "true", "f": "false", "n": "null"}[self.s[i]]
        for k, expected in enumerate(word[1:], start=1):
            if i + k >= self.n:
                raise _Syntax(_EOF)
            if self.s[i + k] != expected:
                raise self.bad(i + k, f"in literal {word} (expecting {_quote_char(expected)})")
        return i + len(word)

    def key(self, i: int) -> int:
        """At the start of an object key: parse it and the colon, return where the value starts."""
        i = self.ws(i)
        if i >= self.n or self.s[i] != '"':
            raise self.bad(i, "looking for beginning of object key string")
        return self.expect(self.string(i), ":", "after object key")

    def scan(self) -> None:
        stack: list[str] = []
        i = self.ws(0)
        while True:
            i = self.value(i, stack)
            i = self.close(i, stack)

    def value(self, i: int, stack: list[str]) -> int:
        """Parse one value, or open a container and stop at its first member."""
        while True:
            i = self.ws(i)
            if i >= self.n:
                raise _Syntax(_EOF)
            ch = self.s[i]
            if ch == "{":
                j = self.ws(i + 1)
                if j < self.n and self.s[j] == "}":
                    return j + 1
                stack.append("}")
                i = self.key(j)
            elif ch == "[":
                j = self.ws(i + 1)
                if j < self.n and self.s[j] == "]":
                    return j + 1
                stack.append("]")
                i = j
            elif ch == '"':
                return self.string(i)
            elif ch == "-" or ch in _DIGITS:
                return self.number(i)
            elif ch in "tfn":
                return self.literal(i)
            else:
                raise self.bad(i, "looking for beginning of value")

    def close(self, i: int, stack: list[str]) -> int:
        """After a value: pop finished containers, return where the next value starts."""
        while True:
            i = self.ws(i)
            if not stack:
                if i < self.n:
                    raise self.bad(i, "after top-level value")
                raise _Syntax("")
            if i >= self.n:
                raise _Syntax(_EOF)
            ch, top = self.s[i], stack[-1]
            if ch == ",":
                return self.key(i + 1) if top == "}" else i + 1
            if ch == top:
                stack.pop()
                i += 1
                continue
            raise self.bad(i, "after object key:value pair" if top == "}" else "after array element")


def _syntax_error(text: str) -> str:
    try:
        _Scanner(text).scan()
    except _Syntax as exc:
        return str(exc)
    except RecursionError:
        return ""
    return ""


# --- decoding a JSON patch body --------------------------------------------------------------------

_OP_STRING_FIELDS = ("op", "path", "from")


def _strict_decode_error(ops: Any) -> str | None:
    """What kjson.UnmarshalStrict into []handlers.jsonPatchOp reports first, if anything."""
    if ops is None:
        return None
    if not isinstance(ops, list):
        return cannot_unmarshal(ops, "[]handlers.jsonPatchOp")
    for op in ops:
        if op is None:
            continue
        if not isinstance(op, dict):
            return cannot_unmarshal(op, "handlers.jsonPatchOp")
        for name in _OP_STRING_FIELDS:
            value = op.get(name)
            if value is not None and not isinstance(value, str):
                return (f"json: cannot unmarshal {json_kind(value)} into Go struct field "
                        f"jsonPatchOp.{name} of type string")
    return None


def _lenient_decode_error(ops: Any) -> str | None:
    """What jsonpatch.DecodePatch reports: only the array-of-objects shape is checked."""
    if ops is None:
        return None
    if not isinstance(ops, list):
        return cannot_unmarshal(ops, "jsonpatch.Patch")
    for op in ops:
        if op is not None and not isinstance(op, dict):
            return cannot_unmarshal(op, "jsonpatch.Operation")
    return None


def decode_json_patch(body: bytes, *, field_validation: str = "") -> list[Any]:
    """The operations of a JSON patch body, or the 400/413 the server answers for it."""
    strict = field_validation != LENIENT_VALIDATION
    prefix = "error decoding patch: " if strict else ""
    try:
        ops = decode_json(body)
    except GoJSONError as exc:
        raise errors.bad_request(prefix + str(exc)) from None
    problem = _strict_decode_error(ops) if strict else _lenient_decode_error(ops)
    if problem:
        raise errors.bad_request(prefix + problem)
    ops = ops or []
    if len(ops) > MAX_JSON_PATCH_OPERATIONS:
        raise errors.entity_too_large(
            "Request entity too large: The allowed maximum operations in a JSON patch is "
            f"{MAX_JSON_PATCH_OPERATIONS}, got {len(ops)}")
    return ops


# --- applying it with evanphx/json-patch v4 semantics -----------------------------------------------

class _Replace(jsonpatch.ReplaceOperation):
    """v4 looks a missing object member up as nil without error, so replace adds it."""

    def apply(self, obj: Any) -> Any:
        subobj, part = self.pointer.to_last(obj)
        if isinstance(subobj, MutableMapping) and part not in subobj:
            subobj[part] = copy.deepcopy(self.operation["value"])
            return obj
        return super().apply(obj)


class _Test(jsonpatch.TestOperation):
    """v4 passes a test of a missing object member when the expected value is null."""

    def apply(self, obj: Any) -> Any:
        subobj, part = self.pointer.to_last(obj)
        if isinstance(subobj, MutableMapping) and part not in subobj and self.operation.get("value") is None:
            return obj
        return super().apply(obj)


class _GoJsonPatch(jsonpatch.JsonPatch):
    # Only RFC 6902's six: the library's optional "append" is unknown to the server.
    operations = MappingProxyType({
        "add": jsonpatch.AddOperation,
        "remove": jsonpatch.RemoveOperation,
        "replace": _Replace,
        "move": jsonpatch.MoveOperation,
        "test": _Test,
        "copy": jsonpatch.CopyOperation,
    })


def _as_v4_operation(op: Any) -> Any:
    """Give add/replace/test without a value the null v4 reads, and refuse the empty path."""
    if not isinstance(op, dict):
        raise rejected()
    if op.get("path") == "" or (op.get("op") in ("move", "copy") and op.get("from") == ""):
        raise rejected()
    if op.get("op") in ("add", "replace", "test") and "value" not in op:
        return {**op, "value": None}
    return op


# Operations applied between two turns of the event loop (apply_json_patch_async): ten thousand
# of them take a noticeable time, which neighbours must not wait out in one piece.
STEP = 128


def apply_json_patch(obj: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """Apply decoded operations to a copy of obj; any failure is the server's generic 422.

    `copy` is the one operation that can grow a document faster than the patch does (each
    can double it), so what the copies add is counted, like evanphx/json-patch's
    AccumulatedCopySizeLimit, and may not pass `limits.MAX_JSON_PATCH_COPIED` (413).
    """
    steps = _applying(obj, ops)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def apply_json_patch_async(obj: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """`apply_json_patch`, letting the event loop serve others every STEP operations."""
    steps = _applying(obj, ops)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def _applying(obj: dict[str, Any], ops: list[Any]) -> Iterator[None]:
    copied = 0
    try:
        # One patcher, each operation built once as it is applied (the library's constructor and
        # its `_ops` would build all of them twice before applying any).
        patcher = _GoJsonPatch([])
        result: Any = orjson.loads(orjson.dumps(obj))  # a deep copy, at C speed
        for count, raw in enumerate(ops, 1):
            if count % STEP == 0:
                yield
            operation = patcher._get_operation(_as_v4_operation(raw))
            if not isinstance(operation, jsonpatch.CopyOperation):
                result = operation.apply(result)
                continue
            # The copy is made by encoding what is copied once: that measures it and copies it.
            encoded = orjson.dumps(jsonpointer.JsonPointer(operation.operation["from"]).resolve(result))
            copied += len(encoded)
            if copied > limits.MAX_JSON_PATCH_COPIED:
                raise errors.entity_too_large(
                    f"Request entity too large: the copy operations of this JSON patch add more than "
                    f"{limits.MAX_JSON_PATCH_COPIED} bytes to the object")
            # `_add` is the add without the library's deep copy: the value is a fresh decode already.
            result = jsonpatch.AddOperation({"op": "add", "path": operation.location})._add(
                result, orjson.loads(encoded))
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError,
            TypeError, ValueError, AttributeError, orjson.JSONEncodeError):
        raise rejected() from None
    if not isinstance(result, dict):
        raise rejected()
    if limits.too_deep(result):
        raise errors.bad_request(f"the patched object nests more than {limits.MAX_DEPTH} levels deep")
    return result


def json_patch(obj: dict[str, Any], patch_bytes: bytes, *, field_validation: str = "") -> dict[str, Any]:
    """Apply an `application/json-patch+json` body to obj (not mutated) and return the result."""
    return apply_json_patch(obj, decode_json_patch(patch_bytes, field_validation=field_validation))


async def json_patch_async(obj: dict[str, Any], patch_bytes: bytes, *,
                           field_validation: str = "") -> dict[str, Any]:
    """`json_patch`, sharing the event loop while a long patch is applied."""
    ops = decode_json_patch(patch_bytes, field_validation=field_validation)
    return await apply_json_patch_async(obj, ops)
