"""What one request may cost: nesting depth, YAML alias expansion, JSON-patch work, warnings,
and the stored size of an object.

Why: every tenant shares one process and one event loop, so a request that is cheap to send
must be cheap to serve. Without these bounds a 462-byte YAML alias bomb held every tenant
for 23 s, a 2.8 KB JSON patch of repeated `copy` operations for 13.5 s, 366 bytes stored a
3.7 MB object, and a body nested 1,000 levels deep crashed the decoder. Each bound is
refused early, with the Status upstream uses for it:

- nesting depth: Go's JSON scanner stops at 10,000 levels ("exceeded max depth"); ours stops
  at `MAX_DEPTH`, because our recursive code (and orjson, at 255) cannot go that deep and
  no real object comes near it;
- YAML aliases: go-yaml's own rule ("document contains excessive aliasing"), applied to the
  parser's events before anything is built, so a bomb never expands;
- JSON patch: upstream's 10,000 operations, and what its `copy` operations add is bounded
  (evanphx/json-patch's AccumulatedCopySizeLimit, which upstream leaves unlimited);
- warnings: upstream's budget of 4,096 characters of `Warning` headers per response, and at
  most `MAX_WARNINGS` of them (so clients that read at most 100 headers can read the answer);
- stored size: the 3 MiB request limit applies to the object as stored, not only as sent.

Who calls it: `validation` (decoding bodies), `patching` (JSON patch), `handlers` (warnings),
`store` (stored size).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from socialweb_computer.api import errors

MAX_BODY = 3 * 1024 * 1024  # what kube-apiserver reads of a request body
MAX_STORED = MAX_BODY  # ... and what we store of one object
MAX_DEPTH = 100  # JSON/YAML nesting levels
MAX_JSON_PATCH_OPERATIONS = 10_000
# What the `copy` operations of one JSON patch may add. Copying costs about what it adds, twice
# (measured, then built), so this bounds the patch's work too; a real patch copies a field or a
# container, not megabytes.
MAX_JSON_PATCH_COPIED = 64 * 1024
MAX_WARNING_RUNES = 4 * 1024  # truncateAtTotalRunes
MAX_WARNING_ITEM_RUNES = 256  # truncateItemRunes
# Ours: Python's http.client (under the official client) refuses a response with more than
# 100 headers, and the rune budget alone allows some 240 short warnings.
MAX_WARNINGS = 64

EXCEEDED_DEPTH = "exceeded max depth"
EXCESSIVE_ALIASING = "document contains excessive aliasing"


class TooDeepError(ValueError):
    pass


class AliasingError(ValueError):
    pass


class ExpandsTooLargeError(ValueError):
    """A YAML document whose aliases expand past what may be stored."""


# --------------------------------------------------------------------------- depth


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests more than `limit` objects/arrays (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# --------------------------------------------------------------------------- YAML


def _allowed_alias_ratio(decodes: int) -> float:
    """go-yaml's allowedAliasRatio: 99% of a small document may come from aliases, 10% of a huge one."""
    low, high = 400_000, 4_000_000
    if decodes <= low:
        return 0.99
    if decodes >= high:
        return 0.10
    return 0.99 - 0.89 * ((decodes - low) / (high - low))


def check_yaml_events(events: Iterable[yaml.Event], depth_limit: int = MAX_DEPTH) -> None:
    """Refuse a document whose alias expansion or nesting is excessive, from its parse events.

    go-yaml counts one decode per node it builds, aliases expanded; a decode made inside an
    alias expansion also counts as aliased. Within one expansion the aliased share only
    grows, so checking when each top-level alias is done is checking at every step.
    """
    sizes: dict[str, tuple[int, int]] = {}  # anchored node → (decodes, JSON bytes), aliases expanded
    frames: list[list[Any]] = []  # open collections: [anchor, decodes so far, bytes so far]
    decodes = aliased = length = 0
    for event in events:
        if isinstance(event, yaml.DocumentEndEvent):
            return
        if isinstance(event, yaml.CollectionStartEvent):
            if len(frames) >= depth_limit:
                raise TooDeepError(f"exceeded max depth of {depth_limit}")
            decodes += 1
            length += 2
            frames.append([event.anchor, 1, 2])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, size, nbytes = frames.pop()
            if anchor is not None:
                sizes[anchor] = (size, nbytes)
            if frames:
                frames[-1][1] += size
                frames[-1][2] += nbytes
            continue
        if isinstance(event, yaml.AliasEvent):
            expanded, nbytes = sizes.get(event.anchor, (0, 0))
            decodes += 1 + expanded
            aliased += expanded
            length += nbytes
            size = 1 + expanded
            if aliased > 100 and decodes > 1000 and aliased / decodes > _allowed_alias_ratio(decodes):
                raise AliasingError(EXCESSIVE_ALIASING)
            if length > MAX_STORED:
                # What the aliases would build could never be stored: say so before building it.
                raise ExpandsTooLargeError(f"the document's aliases expand it past {MAX_STORED} bytes")
        elif isinstance(event, yaml.ScalarEvent):
            decodes += 1
            size, nbytes = 1, len(event.value) + 3  # the JSON string's quotes and separator
            length += nbytes
            if event.anchor is not None:
                sizes[event.anchor] = (1, nbytes)
        else:
            continue
        if frames:
            frames[-1][1] += size
            frames[-1][2] += nbytes


def yaml_events(text: str, loader: type) -> Iterable[yaml.Event]:
    """The parse events of `text` with `loader`'s parser (nothing is composed or constructed)."""
    parser = loader(text)
    try:
        while parser.check_event():
            yield parser.get_event()
    finally:
        parser.dispose()


# --------------------------------------------------------------------------- warnings


def truncate_warnings(texts: Iterable[str]) -> list[str]:
    """Upstream's warning recorder: deduplicated; once the texts pass 4,096 characters in all,
    each is cut to 256 and what still does not fit is dropped. At most MAX_WARNINGS are kept."""
    unique = list(dict.fromkeys(texts))
    if sum(len(t) for t in unique) <= MAX_WARNING_RUNES:
        return unique[:MAX_WARNINGS]
    kept: list[str] = []
    written = 0
    for text in unique:
        text = text[:MAX_WARNING_ITEM_RUNES]
        if written + len(text) <= MAX_WARNING_RUNES:
            written += len(text)
            kept.append(text)
    return kept[:MAX_WARNINGS]


# --------------------------------------------------------------------------- stored size


def check_stored_size(kind: str, name: str, encoded: bytes) -> None:
    """A request may not store an object bigger than a request body may be (413)."""
    if len(encoded) > MAX_STORED:
        raise errors.StatusError(
            413, "RequestEntityTooLarge",
            f"Request entity too large: the stored {kind} {name!r} would be {len(encoded)} bytes; "
            f"limit is {MAX_STORED}",
            {"kind": kind, "name": name} if name else {"kind": kind})
