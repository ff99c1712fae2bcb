"""The generated protobuf field table, loaded once and indexed for the decoder.

`build.py` writes `generated/fields.json` from Debian's copies of the upstream
`.proto` files and Go API types; `decoder.py` asks this module what a field number
means inside a given message, and which message an (apiVersion, kind) names.
A missing table is an operator error (the build step did not run) and is reported
as `TableMissingError` with the command that fixes it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import orjson

PATH = Path(__file__).resolve().parent / "generated" / "fields.json"
BUILD_COMMAND = "python -m socialweb_computer.apiserver.protobuf.build"
SUPPORTED_FORMAT = 1


class TableMissingError(RuntimeError):
    """The generated field table is absent or unreadable."""


@dataclass(frozen=True)
class FieldInfo:
    number: int
    name: str  # JSON name; "" for inlined structs
    repeated: bool
    map: bool
    type: str  # scalar name or message full name; for maps the key type
    value_type: str  # map value type
    pointer: bool
    omitempty: bool
    omitzero: bool
    inline: bool
    json_skip: bool  # `json:"-"`: on the wire, never in JSON


@dataclass(frozen=True)
class MessageInfo:
    name: str
    fields: tuple[FieldInfo, ...]
    by_number: dict[int, FieldInfo]
    go_kind: str  # "struct", or "slice"/"map" for Go named slice/map types wrapped in a message


@dataclass(frozen=True)
class Table:
    messages: dict[str, MessageInfo]
    kinds: dict[str, dict[str, str]]  # "group/version" (or "v1") → kind → message
    meta_kinds: dict[str, str]  # kinds meta/v1 registers into every group version
    source: dict

    @property
    def kubernetes_version(self) -> str:
        return str(self.source.get("kubernetes", "unknown"))

    def message_for(self, api_version: str, kind: str) -> MessageInfo | None:
        kinds = self.kinds.get(api_version)
        if kinds is None:
            return None
        name = kinds.get(kind) or self.meta_kinds.get(kind)
        return self.messages.get(name) if name else None

    def knows_group(self, group: str) -> bool:
        return any(gv.rpartition("/")[0] == group for gv in self.kinds)


def _field(entry: list) -> FieldInfo:
    number, name, label, type_name, value_type, flags = entry
    return FieldInfo(number=number, name=name if name != "-" else "", repeated=label == "r", map=label == "m",
                     type=type_name, value_type=value_type, pointer="p" in flags, omitempty="e" in flags,
                     omitzero="z" in flags, inline="i" in flags, json_skip=name == "-")


def parse(raw: bytes) -> Table:
    data = orjson.loads(raw)
    if data.get("format") != SUPPORTED_FORMAT:
        raise TableMissingError(f"protobuf field table has format {data.get('format')!r}, "
                                f"expected {SUPPORTED_FORMAT}; re-run `{BUILD_COMMAND}`")
    messages = {}
    for name, entry in data["messages"].items():
        fields = tuple(_field(f) for f in entry["f"])
        messages[name] = MessageInfo(name, fields, {f.number: f for f in fields}, entry.get("go", "struct"))
    return Table(messages, data["kinds"], data["meta_kinds"], data.get("source", {}))


@functools.cache
def load(path: Path = PATH) -> Table:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TableMissingError(f"the protobuf field table {path.name} has not been generated; "
                                f"run `{BUILD_COMMAND}` (the install and test scripts do)") from None
    except OSError as exc:
        raise TableMissingError(f"cannot read the protobuf field table: {exc}") from None
    try:
        return parse(raw)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TableMissingError(f"the protobuf field table is corrupt ({exc}); "
                                f"re-run `{BUILD_COMMAND} --force`") from None
