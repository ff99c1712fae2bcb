"""Single-layer OCI images written from a handful of files (the pause image, test images).

Why by hand: an image of one layer is a tar, its SHA-256 digests and three small JSON
documents (config, manifest, index). umoci builds the same through an unpack/repack
cycle of four process calls that needs a rootless mapping; writing the layout directly
is shorter, deterministic (fixed mtimes, sorted entries, so the same files give the same
digest) and needs no tool on the machine that builds a node's image.

    image = oci.Image(entrypoint=["/pause"], user="65535:65535")
    image.add_file("pause", data, mode=0o755)
    image.write_archive(path, "localhost/socialweb-computer/pause:1")   # for `ctr images import`
    image.write_layout(directory, "1")                                  # for `skopeo copy oci:…`

Used by `node/build.py` (pause) and `testing/images.py` (busybox images for tests).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import orjson

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
# containerd's import reads the full name from this annotation; OCI tools read the tag.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
EPOCH = 0  # every entry's mtime: the same files give the same digest


@dataclasses.dataclass(frozen=True)
class _Entry:
    path: str
    kind: bytes  # tarfile type
    data: bytes = b""
    target: str = ""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


@dataclasses.dataclass
class Blob:
    digest: str
    data: bytes
    media_type: str

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


def _blob(data: bytes, media_type: str) -> Blob:
    return Blob("sha256:" + hashlib.sha256(data).hexdigest(), data, media_type)


class Image:
    def __init__(
        self,
        *,
        entrypoint: list[str] | None = None,
        cmd: list[str] | None = None,
        env: list[str] | None = None,
        user: str = "",
        workdir: str = "",
        architecture: str = "amd64",
    ) -> None:
        self._entries: dict[str, _Entry] = {}
        self.config: dict[str, Any] = {
            k: v
            for k, v in (
                ("Entrypoint", entrypoint),
                ("Cmd", cmd),
                ("Env", env),
                ("User", user),
                ("WorkingDir", workdir),
            )
            if v
        }
        self.architecture = architecture
        self.compresslevel = 6  # big test images trade size for build time with a lower one

    def add_dir(self, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        self._parents(path)
        self._entries[path.strip("/")] = _Entry(path.strip("/"), tarfile.DIRTYPE, mode=mode, uid=uid, gid=gid)

    def add_file(self, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        self._parents(path)
        self._entries[path.strip("/")] = _Entry(
            path.strip("/"), tarfile.REGTYPE, data=data, mode=mode, uid=uid, gid=gid
        )

    def add_symlink(self, path: str, target: str) -> None:
        self._parents(path)
        self._entries[path.strip("/")] = _Entry(path.strip("/"), tarfile.SYMTYPE, target=target, mode=0o777)

    def _parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            self._entries.setdefault(parent, _Entry(parent, tarfile.DIRTYPE, mode=0o755))

    # ---------------------------------------------------------------- blobs

    def _layer_tar(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self._entries):
                entry = self._entries[name]
                info = tarfile.TarInfo(entry.path + ("/" if entry.kind == tarfile.DIRTYPE else ""))
                info.type, info.mode, info.mtime = entry.kind, entry.mode, EPOCH
                info.uid, info.gid = entry.uid, entry.gid
                if entry.kind == tarfile.SYMTYPE:
                    info.linkname = entry.target
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data) if entry.data else None)
        return buffer.getvalue()

    def blobs(self) -> tuple[Blob, Blob, Blob]:
        """(layer, config, manifest)."""
        raw = self._layer_tar()
        layer = _blob(gzip.compress(raw, compresslevel=self.compresslevel, mtime=EPOCH), MEDIA_LAYER)
        config = _blob(
            orjson.dumps(
                {
                    "architecture": self.architecture,
                    "os": "linux",
                    "config": self.config,
                    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
                },
                option=orjson.OPT_SORT_KEYS,
            ),
            MEDIA_CONFIG,
        )
        manifest = _blob(
            orjson.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": MEDIA_MANIFEST,
                    "config": config.descriptor(),
                    "layers": [layer.descriptor()],
                },
                option=orjson.OPT_SORT_KEYS,
            ),
            MEDIA_MANIFEST,
        )
        return layer, config, manifest

    # ---------------------------------------------------------------- outputs

    def _layout_files(self, annotations: dict[str, str]) -> tuple[dict[str, bytes], str]:
        """The layout's files by relative path, and the manifest's digest."""
        layer, config, manifest = self.blobs()
        files = {f"blobs/sha256/{b.digest.split(':', 1)[1]}": b.data for b in (layer, config, manifest)}
        files["oci-layout"] = b'{"imageLayoutVersion":"1.0.0"}'
        files["index.json"] = orjson.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_INDEX,
                "manifests": [manifest.descriptor(annotations=annotations)],
            }
        )
        return files, manifest.digest

    def write_layout(self, directory: Path, tag: str) -> str:
        """An OCI image layout directory holding this image under `tag`; returns the manifest digest."""
        files, digest = self._layout_files({OCI_REF_NAME: tag})
        for name, data in files.items():
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return digest

    def write_archive(self, path: Path, name: str) -> str:
        """An OCI archive (a tarred layout) that `ctr images import` names `name`; returns the digest."""
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
        files, digest = self._layout_files({CONTAINERD_NAME: name, OCI_REF_NAME: tag})
        partial = path.with_name(path.name + ".partial")
        with tarfile.open(partial, "w") as tar:
            for file_name in sorted(files):
                info = tarfile.TarInfo(file_name)
                info.size, info.mtime, info.mode = len(files[file_name]), EPOCH, 0o644
                tar.addfile(info, io.BytesIO(files[file_name]))
        partial.replace(path)
        return digest
