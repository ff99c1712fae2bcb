"""gateway/statemirror.py: which side wins when a directory and its copy in the store differ.

Runs on the in-memory store (the mirror only uses the Backend protocol); the etcd end-to-end
tests (test_etcd_gateway.py) move a real gateway between state directories."""

from __future__ import annotations

from pathlib import Path

from socialweb_computer.clusterprovider import layout
from socialweb_computer.gateway import statemirror
from socialweb_computer.storage import memory


def files_of(directory: Path) -> dict[str, bytes]:
    return {path: data for path, (_mode, data) in layout.read_tree(str(directory)).items()}


async def test_a_fresh_directory_takes_the_store_copy_and_local_changes_go_back(tmp_path: Path) -> None:
    async with await memory.MemoryBackend.open() as store:
        here = layout.StateLayout(str(tmp_path / "here"))
        here.admin_pki.ensure(sync=False)
        first = statemirror.StateMirror(store, here)
        await first.restore()  # the first gateway on this store: its files become the store's
        minted = files_of(Path(here.admin_pki.directory))

        there = layout.StateLayout(str(tmp_path / "there"))
        await statemirror.StateMirror(store, there).restore()  # a fresh directory (a moved gateway)
        assert files_of(Path(there.admin_pki.directory)) == minted

        # A key rotated here while the store still holds what this directory last matched: it wins.
        (Path(here.admin_pki.directory) / "serving.crt").write_bytes(b"rotated")
        await statemirror.StateMirror(store, here).restore()
        kv = await store.get(statemirror.ADMIN_KEY)
        assert kv is not None and statemirror.decode(kv.value)["serving.crt"][1] == b"rotated"

        # Meanwhile "there" had matched the older copy; the store changed since, so the store wins.
        (Path(there.admin_pki.directory) / "serving.crt").write_bytes(b"stale edit")
        await statemirror.StateMirror(store, there).restore()
        assert (Path(there.admin_pki.directory) / "serving.crt").read_bytes() == b"rotated"
        assert (Path(there.admin_pki.directory) / "serving-ca.key").stat().st_mode & 0o077 == 0


async def test_clusters_are_copied_both_ways_and_removed(tmp_path: Path) -> None:
    async with await memory.MemoryBackend.open() as store:
        here = layout.StateLayout(str(tmp_path / "here"))
        record = layout.ClusterRecord(name="ci", uid="u-1", port=7001, url="https://127.0.0.1:7001")
        here.create_cluster(record)
        mirror = statemirror.StateMirror(store, here)
        await mirror.restore()  # a cluster only the directory had goes into the store
        there = layout.StateLayout(str(tmp_path / "there"))
        await statemirror.StateMirror(store, there).restore()
        assert there.read_cluster("ci") == record
        assert files_of(Path(there.cluster_dir("ci"))) == files_of(Path(here.cluster_dir("ci")))
        await mirror.removed("ci")
        assert await store.get(statemirror.CLUSTERS_PREFIX + "ci") is None
