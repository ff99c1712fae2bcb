"""The state directory's files, kept in the store too when the store is etcd.

With SQLite the store is a file of the state directory, so the directory is the whole state
and moves as one. With etcd the objects live in etcd, but the CAs, certificates and each
cluster's record (its uid and port) are files. Keeping a copy of them in the store lets a
gateway started on another state directory, or on another host, serve the same clusters
with the same CAs and ports. The two are brought in step when the gateway starts, and a
cluster's when it is created or comes up (see StateMirror for which side wins):

    /.gateway/pki/admin        the admin plane's CAs, certificates and keys
    /.gateway/clusters/<name>  one cluster's directory: cluster.json, pki/, admin.kubeconfig

(No cluster is named `.gateway`, so these keys never meet a cluster's objects.) They hold
private keys: whoever can read the store can act as every cluster's admin, exactly as they
can read every cluster's Secrets; docs/storage.md says how to protect etcd. Called by
gateway/runtime.py at start and by the Cluster controller when a cluster's files are
created or removed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
from collections.abc import Callable

import orjson

from socialweb_computer.auth import pki
from socialweb_computer.clusterprovider import layout
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

ADMIN_KEY = "/.gateway/pki/admin"
CLUSTERS_PREFIX = "/.gateway/clusters/"
SYNC_RECORD = "store-sync.json"

Files = dict[str, tuple[int, bytes]]


def encode(files: Files) -> bytes:
    entries = {path: {"mode": mode, "data": base64.b64encode(data).decode()}
               for path, (mode, data) in files.items()}
    return orjson.dumps(entries, option=orjson.OPT_SORT_KEYS)


def decode(value: bytes) -> Files:
    entries = orjson.loads(value)
    return {path: (int(entry["mode"]), base64.b64decode(entry["data"])) for path, entry in entries.items()}


class StateMirror:
    """Keeps each directory and its copy in the store in step.

    `<state>/store-sync.json` remembers the revision of each copy the directory last matched.
    When a directory and its copy differ, the one that changed since then wins: a copy newer
    than that revision (another gateway wrote it: the gateway moved) is written into the
    directory; a directory changed while its copy stayed as it was (a key rotated here, files a
    newer version minted) is written into the store. A directory with no record (a fresh state
    directory) takes the store's copy.
    """

    def __init__(self, backend: storage.Backend, state: layout.StateLayout) -> None:
        self.backend = backend
        self.state = state
        self._record = os.path.join(state.root, SYNC_RECORD)
        self._synced: dict[str, int] = _read_record(self._record)

    async def restore(self) -> None:
        """Bring the state directory and the store in step, before anything reads the files."""
        await self.sync_admin()
        listed = await self.backend.list(CLUSTERS_PREFIX)
        in_store = set()
        for kv in listed.items:
            name = kv.key.removeprefix(CLUSTERS_PREFIX)
            in_store.add(name)
            await self._sync(kv.key, self.state.cluster_dir(name),
                             lambda files, name=name: self.state.install_cluster(name, files), kv)
        for name in self.state.cluster_names():
            if name not in in_store:  # created while the store could not take it, or before etcd
                await self.sync(name)
        for key in [k for k in self._synced if k.startswith(CLUSTERS_PREFIX) and k[len(CLUSTERS_PREFIX):]
                    not in in_store]:
            del self._synced[key]
        await asyncio.to_thread(self._save_record)

    async def sync_admin(self) -> None:
        directory = self.state.admin_pki.directory
        await self._sync(ADMIN_KEY, directory, lambda files: layout.replace_tree(directory, files))
        await asyncio.to_thread(self._save_record)

    async def sync(self, name: str) -> None:
        """Bring one cluster's directory and its copy in step (after it was created or started)."""
        await self._sync(CLUSTERS_PREFIX + name, self.state.cluster_dir(name),
                         lambda files: self.state.install_cluster(name, files))
        await asyncio.to_thread(self._save_record)

    async def removed(self, name: str) -> None:
        with contextlib.suppress(storage.KeyNotFoundError):
            await self.backend.delete(CLUSTERS_PREFIX + name)
        self._synced.pop(CLUSTERS_PREFIX + name, None)
        await asyncio.to_thread(self._save_record)

    async def _sync(self, key: str, directory: str, install: Callable[[Files], None],
                    kv: storage.KeyValue | None = None) -> None:
        kv = kv or await self.backend.get(key)
        local = await asyncio.to_thread(_tree_or_empty, directory)
        if kv is None:
            if local:
                self._synced[key] = (await self.backend.create(key, encode(local))).kv.mod_revision
            return
        stored = decode(kv.value)
        if local == stored:
            self._synced[key] = kv.mod_revision
        elif local and self._synced.get(key) == kv.mod_revision:
            log.info("copying %s into the store (it changed here)", directory)
            written = await self.backend.update(key, encode(local), expected_revision=kv.mod_revision)
            self._synced[key] = written.kv.mod_revision
        else:
            log.info("writing %s from the store", directory)
            await asyncio.to_thread(install, stored)
            self._synced[key] = kv.mod_revision

    def _save_record(self) -> None:
        os.makedirs(self.state.root, mode=0o700, exist_ok=True)
        pki.write_private(self._record, orjson.dumps(self._synced, option=orjson.OPT_SORT_KEYS))


def _read_record(path: str) -> dict[str, int]:
    try:
        with open(path, "rb") as f:
            return {str(k): int(v) for k, v in orjson.loads(f.read()).items()}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


def _tree_or_empty(directory: str) -> Files:
    try:
        return layout.read_tree(directory)
    except FileNotFoundError:
        return {}
