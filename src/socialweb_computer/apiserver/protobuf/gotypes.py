"""Reads the Go API type declarations that sit beside each `generated.proto`.

Used only by the build step. The `.proto` files give field numbers and wire types,
but not what the JSON form of an object looks like: whether a Go field is a pointer
(a pointer `replicas: 0` is sent and must be kept, a plain `minReadySeconds: 0` is
always sent and must be dropped), whether its `json` tag has `omitempty`, and
whether an embedded struct is `,inline` (`Volume.volumeSource`). Those facts live in
the struct tags of the Go sources shipped in the same Debian packages; this module
reads them with line patterns, which is enough for gofmt-formatted API types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_STRUCT_START = re.compile(r"^type\s+(\w+)\s+struct\s*\{\s*$")
_NAMED_TYPE = re.compile(r"^type\s+(\w+)\s+(\[\]|map\[)")
# `Name Type `tags`` or an embedded `Type `tags``; gofmt keeps one field per line.
_FIELD = re.compile(r"^\s*(?:(\w+)\s+)?([^\s`]+)\s+`([^`]*)`")
_TAG = re.compile(r'(\w+):"((?:[^"\\]|\\.)*)"')
_GROUP_NAME = re.compile(r'^\s*const\s+GroupName\s*=\s*"([^"]*)"', re.MULTILINE)
_KNOWN_TYPE = re.compile(r"&(\w+)\{\}")


@dataclass(frozen=True)
class GoField:
    go_name: str
    go_type: str
    json_name: str
    omitempty: bool
    omitzero: bool
    inline: bool
    pointer: bool
    proto_number: int


@dataclass
class GoPackage:
    structs: dict[str, dict[int, GoField]] = field(default_factory=dict)
    # Named slice/map types (`type ExtraValue []string`): protobuf wraps them in a message.
    slices: set[str] = field(default_factory=set)
    maps: set[str] = field(default_factory=set)
    group_name: str | None = None
    known_types: list[str] = field(default_factory=list)


def _parse_field(line: str) -> GoField | None:
    match = _FIELD.match(line)
    if match is None:
        return None
    name, go_type, tag_text = match.groups()
    tags = dict(_TAG.findall(tag_text))
    protobuf = tags.get("protobuf")
    if not protobuf:
        return None
    parts = protobuf.split(",")
    if len(parts) < 2 or not parts[1].isdigit():
        return None  # `protobuf:"-"`: not on the wire
    json_parts = tags.get("json", "").split(",")
    json_name = json_parts[0]
    options = set(json_parts[1:])
    embedded = name is None
    if embedded:
        name = go_type.lstrip("*").rsplit(".", 1)[-1]
    return GoField(
        go_name=name,
        go_type=go_type,
        json_name=json_name if json_name or not embedded else "",
        omitempty="omitempty" in options,
        omitzero="omitzero" in options,
        inline="inline" in options or (embedded and not json_name),
        pointer=go_type.startswith("*"),
        proto_number=int(parts[1]),
    )


def parse_source(text: str, into: GoPackage) -> None:
    current: dict[int, GoField] | None = None
    depth = 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        if current is None:
            start = _STRUCT_START.match(line)
            if start:
                current = into.structs.setdefault(start.group(1), {})
                depth = 1
                continue
            named = _NAMED_TYPE.match(line)
            if named:
                (into.slices if named.group(2) == "[]" else into.maps).add(named.group(1))
            continue
        depth += line.count("{") - line.count("}")
        if depth <= 0:
            current = None
            continue
        if depth == 1:
            parsed = _parse_field(line)
            if parsed is not None:
                current[parsed.proto_number] = parsed


def read_package(directory: Path) -> GoPackage:
    """Reads every non-test, non-generated Go file of one API package directory."""
    package = GoPackage()
    for path in sorted(directory.glob("*.go")):
        name = path.name
        if name.endswith("_test.go") or name.startswith("zz_generated") or name == "generated.pb.go":
            continue
        text = path.read_text(encoding="utf-8")
        parse_source(text, package)
        if name == "register.go":
            group = _GROUP_NAME.search(text)
            if group:
                package.group_name = group.group(1)
            package.known_types.extend(t for t in _KNOWN_TYPE.findall(text) if t not in package.known_types)
    return package
