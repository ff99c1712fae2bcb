"""ControllerRevision history (upstream pkg/controller/history), shared by the StatefulSet and
DaemonSet controllers.

A revision's `data` is the strategic merge patch that puts a template back (what `kubectl
rollout history|undo` read and apply); its name is `<owner>-<hash>` with apimachinery's hash.
"""

from __future__ import annotations

from typing import Any

import orjson

from socialweb_computer.api import errors, gofmt
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import podcontrol

Object = dict[str, Any]
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_REVISION_PREFIX = 223  # keeps `<prefix>-<hash>` a valid object name


def safe_encode(text: str) -> str:
    """apimachinery's rand.SafeEncodeString: no vowels, no look-alike characters."""
    return "".join(_SAFE_ALPHABET[ord(c) % len(_SAFE_ALPHABET)] for c in text)


def revision_data(template: Object) -> Object:
    """What a ControllerRevision stores: the strategic merge patch that puts this template back.
    Keys are sorted as Go's json.Marshal of a map sorts them, so that kubectl's byte comparison
    ("current template already matches revision N") sees the same patch."""
    return orjson.loads(gofmt.marshal_json({"spec": {"template": {**template, "$patch": "replace"}}}))


def revision_template(revision: Object) -> Object:
    template = dict(((revision.get("data") or {}).get("spec") or {}).get("template") or {})
    template.pop("$patch", None)
    return template


def revision_number(revision: Object) -> int:
    return int(revision.get("revision") or 0)


def sort_revisions(revisions: list[Object]) -> list[Object]:
    """history.SortControllerRevisions: by revision, then creation time, then name."""
    return sorted(revisions, key=lambda r: (revision_number(r), r["metadata"].get("creationTimestamp", ""),
                                            r["metadata"]["name"]))


def revision_hash(data: Object, collision_count: int | None) -> str:
    """history.HashControllerRevision: FNV-1 (not 1a) of the data, then of the collision count."""
    raw = gofmt.marshal_json(data).encode()
    if collision_count is not None:
        raw += str(collision_count).encode()
    h = 0x811C9DC5
    for byte in raw:
        h = ((h * 0x01000193) & 0xFFFFFFFF) ^ byte
    return safe_encode(str(h))


def revision_name(owner_name: str, hash_: str) -> str:
    return f"{owner_name[:_MAX_REVISION_PREFIX]}-{hash_}"


def new_revision(owner: Object, kind: str, name: str, labels: dict[str, str], number: int) -> Object:
    """A ControllerRevision of the owner's current template, controlled by the owner."""
    meta = owner["metadata"]
    revision: Object = {
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": name, "namespace": meta.get("namespace", ""), "labels": labels,
                     "ownerReferences": [podcontrol.controller_ref(owner, api_version="apps/v1", kind=kind)]},
        "data": revision_data(((owner.get("spec") or {}).get("template")) or {}),
        "revision": number,
    }
    if meta.get("annotations"):
        revision["metadata"]["annotations"] = dict(meta["annotations"])
    return revision


async def delete_revision(store: store_mod.Store, kind: kinds.KindInfo, revision: Object) -> None:
    meta = revision["metadata"]
    try:
        await store.delete(kind, meta["namespace"], meta["name"],
                           store_mod.DeleteOptions(precondition_uid=meta["uid"]))
    except errors.StatusError as e:
        if e.code not in (404, 409):
            raise
