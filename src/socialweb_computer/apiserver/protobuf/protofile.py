"""A small reader for the `.proto` files Kubernetes generates (go-to-protobuf output).

Used only by the build step (`build.py`), which turns Debian's copies of the upstream
`generated.proto` files into the field table the request decoder reads at run time.
It understands what those files use — proto2 `syntax`, `package`, `import`,
`option`, `message` (nested too), `optional`/`required`/`repeated` fields,
`map<K, V>`, `oneof`, `enum`, `reserved` and bracketed field options — and rejects
anything else loudly rather than producing a silently wrong table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SCALARS = frozenset({
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
    "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
})

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<number>-?\d[\w.]*)
  | (?P<ident>\.?[A-Za-z_][\w.]*)
  | (?P<symbol>[{}<>=;,\[\]()])
""", re.VERBOSE | re.DOTALL)


class ProtoSyntaxError(ValueError):
    pass


@dataclass
class ProtoField:
    name: str
    number: int
    label: str  # "optional" | "repeated" | "map"
    type: str  # scalar name or message/enum name as written; resolved later
    value_type: str = ""  # map values only; `type` then holds the key type
    packed: bool = False
    oneof: str = ""  # the name of the oneof the field belongs to, if any


@dataclass
class Message:
    full_name: str  # package-qualified, no leading dot
    fields: list[ProtoField] = field(default_factory=list)


@dataclass
class ProtoFile:
    package: str = ""
    syntax: str = "proto2"
    imports: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    enums: list[str] = field(default_factory=list)


def tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            line = text.count("\n", 0, pos) + 1
            raise ProtoSyntaxError(f"unexpected character {text[pos]!r} on line {line}")
        kind = match.lastgroup
        if kind not in ("ws", "line_comment", "block_comment"):
            tokens.append(match.group())
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.out = ProtoFile()

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def next(self) -> str:
        if self.pos >= len(self.tokens):
            raise ProtoSyntaxError("unexpected end of file")
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expect(self, token: str) -> None:
        got = self.next()
        if got != token:
            raise ProtoSyntaxError(f"expected {token!r}, got {got!r} (token {self.pos})")

    def skip_statement(self) -> None:
        """Skips to the `;` ending the current statement, stepping over bracketed parts."""
        depth = 0
        while True:
            token = self.next()
            if token in "([{<" and len(token) == 1:
                depth += 1
            elif token in ")]}>" and len(token) == 1:
                depth -= 1
            elif token == ";" and depth == 0:
                return

    def parse_file(self) -> ProtoFile:
        while self.peek():
            token = self.next()
            if token == "syntax":
                self.expect("=")
                self.out.syntax = self.next().strip("\"'")
                self.expect(";")
            elif token == "package":
                self.out.package = self.next()
                self.expect(";")
            elif token == "import":
                name = self.next()
                if name in ("public", "weak"):
                    name = self.next()
                self.out.imports.append(name.strip("\"'"))
                self.expect(";")
            elif token == "option":
                self.parse_option(self.out.options)
            elif token == "message":
                self.parse_message(self.out.package)
            elif token == "enum":
                self.parse_enum(self.out.package)
            elif token == ";":
                continue
            else:
                raise ProtoSyntaxError(f"unsupported top-level statement {token!r}")
        return self.out

    def parse_option(self, into: dict[str, str]) -> None:
        name_parts = []
        while self.peek() != "=":
            name_parts.append(self.next())
        self.expect("=")
        value = self.next()
        into["".join(name_parts)] = value.strip("\"'")
        self.expect(";")

    def parse_enum(self, scope: str) -> None:
        name = self.next()
        self.out.enums.append(f"{scope}.{name}" if scope else name)
        self.expect("{")
        depth = 1
        while depth:
            token = self.next()
            depth += {"{": 1, "}": -1}.get(token, 0)

    def parse_message(self, scope: str) -> None:
        name = self.next()
        message = Message(f"{scope}.{name}" if scope else name)
        self.out.messages.append(message)
        self.expect("{")
        self.parse_body(message)

    def parse_body(self, message: Message, closing: str = "}", oneof: str = "") -> None:
        while True:
            token = self.next()
            if token == closing:
                return
            if token == "message":
                self.parse_message(message.full_name)
            elif token == "enum":
                self.parse_enum(message.full_name)
            elif token in ("option", "reserved", "extensions"):
                self.skip_statement()
            elif token == "oneof":
                name = self.next()
                self.expect("{")
                self.parse_body(message, oneof=name)
            elif token == ";":
                continue
            elif token == "map":
                message.fields.append(self.parse_map_field())
            elif token in ("optional", "required", "repeated"):
                label = "repeated" if token == "repeated" else "optional"
                message.fields.append(self.parse_field(label, self.next(), oneof))
            elif token == "group":
                raise ProtoSyntaxError(f"proto2 groups are not supported (in {message.full_name})")
            else:
                # proto3-style field without a label.
                message.fields.append(self.parse_field("optional", token, oneof))

    def parse_field(self, label: str, type_name: str, oneof: str = "") -> ProtoField:
        name = self.next()
        self.expect("=")
        number = int(self.next(), 0)
        out = ProtoField(name, number, label, type_name, oneof=oneof)
        out.packed = self.parse_field_options().get("packed") == "true"
        return out

    def parse_map_field(self) -> ProtoField:
        self.expect("<")
        key_type = self.next()
        self.expect(",")
        value_type = self.next()
        self.expect(">")
        name = self.next()
        self.expect("=")
        number = int(self.next(), 0)
        self.parse_field_options()
        return ProtoField(name, number, "map", key_type, value_type)

    def parse_field_options(self) -> dict[str, str]:
        options: dict[str, str] = {}
        if self.peek() == "[":
            self.next()
            while True:
                name_parts = []
                while self.peek() not in ("=", ""):
                    name_parts.append(self.next())
                self.expect("=")
                options["".join(name_parts)] = self.next().strip("\"'")
                separator = self.next()
                if separator == "]":
                    break
                if separator != ",":
                    raise ProtoSyntaxError(f"expected ',' or ']' in field options, got {separator!r}")
        self.expect(";")
        return options


def parse(text: str) -> ProtoFile:
    return _Parser(tokenize(text)).parse_file()


def resolve_type(name: str, scope: str, known: set[str]) -> str:
    """Resolves a type reference the way protoc does: innermost scope outwards.

    `scope` is the full name of the message the reference appears in. Returns the
    full name without a leading dot; scalars come back unchanged.
    """
    if name in SCALARS:
        return name
    if name.startswith("."):
        return name[1:]
    parts = scope.split(".")
    for i in range(len(parts), -1, -1):
        candidate = ".".join([*parts[:i], name])
        if candidate in known:
            return candidate
    raise ProtoSyntaxError(f"cannot resolve type {name!r} referenced from {scope}")
