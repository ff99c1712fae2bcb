"""A pod's volumes on the node: set up before its containers, kept current, torn down after.

Layout (a kubelet's, under the node's data disk):

    pods/<uid>/volumes/kubernetes.io~empty-dir/<name>/        0777 (tmpfs for medium Memory)
    pods/<uid>/volumes/kubernetes.io~configmap/<name>/         atomic writer, see below
    pods/<uid>/volumes/kubernetes.io~secret/<name>/            on a tmpfs, never on disk
    pods/<uid>/volumes/kubernetes.io~downward-api/<name>/
    pods/<uid>/volumes/kubernetes.io~projected/<name>/         (secret contents: tmpfs)
    pods/<uid>/etc-hosts, pods/<uid>/containers/<name>/<id>    /etc/hosts, termination logs

ConfigMap, Secret, downwardAPI and projected volumes are written like upstream's
AtomicWriter: the files of one version go into a `..<timestamp>` directory, `..data` is a
symlink to it, and each top-level name is a symlink into `..data`. An update writes a new
version and swaps `..data` with one rename, so a reader never sees half of it; `subPath`
mounts bind the file itself and, as upstream, do not see updates.

What a node cannot mount (PersistentVolumeClaims without a provisioner, NFS, iSCSI, CSI,
image volumes, ...) fails with a FailedMount event that says so.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from socialweb_computer.api import quantity
from socialweb_computer.node import envvars

Object = dict[str, Any]
TokenRequester = Callable[[Object, str, int, str], Awaitable[tuple[str, float]]]  # → (token, expires at)

EMPTY_DIR = "kubernetes.io~empty-dir"
CONFIGMAP = "kubernetes.io~configmap"
SECRET = "kubernetes.io~secret"
DOWNWARD_API = "kubernetes.io~downward-api"
PROJECTED = "kubernetes.io~projected"
HOST_PATH = "kubernetes.io~host-path"
SUPPORTED = ("emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath")
DATA_DIR = "..data"
DEFAULT_MODE = 0o644
DEFAULT_TOKEN_SECONDS = 3600
# Secrets never touch the node's disk (as upstream): their volumes are small tmpfs mounts.
SECRET_TMPFS_SIZE = 16 << 20


class MountError(Exception):
    """`MountVolume.SetUp failed for volume "<name>" : <reason>` (kubelet's FailedMount)."""

    def __init__(self, volume: str, reason: str) -> None:
        super().__init__(f'MountVolume.SetUp failed for volume "{volume}" : {reason}')
        self.volume = volume


def _kind_of(volume: Object) -> str:
    for key in volume:
        if key != "name":
            return key
    return ""


def _mount_tmpfs(path: Path, size: int) -> None:
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise OSError(result.stderr.strip() or f"mount tmpfs on {path} failed")


def _is_mount(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def unmount_all_under(root: Path) -> None:
    """Unmounts every mount below `root`, deepest first (the pod's tmpfs volumes)."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


class AtomicWriter:
    """Writes a set of files into a directory so that readers see one version or the next."""

    def __init__(self, directory: Path, *, gid: int | None = None) -> None:
        self.directory = directory
        self.gid = gid

    def write(self, files: dict[str, tuple[bytes, int]]) -> bool:
        """`files`: relative path → (content, mode). Returns whether anything changed."""
        if self._current() == files:
            return False
        stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
        version = self.directory / stamp
        version.mkdir(mode=0o755)
        for relative, (content, mode) in files.items():
            target = version / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)
            if self.gid is not None:
                os.chown(target, -1, self.gid)
        link = self.directory / "..data_tmp"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(stamp)
        old = os.readlink(self.directory / DATA_DIR) if (self.directory / DATA_DIR).is_symlink() else None
        link.replace(self.directory / DATA_DIR)
        top = {relative.split("/", 1)[0] for relative in files}
        for name in top:
            entry = self.directory / name
            if not entry.is_symlink():
                entry.symlink_to(f"{DATA_DIR}/{name}")
        for entry in self.directory.iterdir():
            if not entry.name.startswith("..") and entry.name not in top:
                entry.unlink()
        if old and old != stamp:
            shutil.rmtree(self.directory / old, ignore_errors=True)
        return True

    def _current(self) -> dict[str, tuple[bytes, int]] | None:
        data = self.directory / DATA_DIR
        if not data.is_symlink():
            return None
        out = {}
        base = data.resolve()
        for path in base.rglob("*"):
            if path.is_file():
                out[str(path.relative_to(base))] = (path.read_bytes(), path.stat().st_mode & 0o777)
        return out


class PodVolumes:
    """The volumes of one pod: `setup()` returns the host path of each volume by name."""

    def __init__(
        self,
        pods_dir: Path,
        pod: Object,
        *,
        lookup: envvars.Lookup,
        tokens: TokenRequester,
        allocatable: dict[str, str],
    ) -> None:
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.root = pods_dir / self.uid
        self.lookup = lookup
        self.tokens = tokens
        self.allocatable = allocatable
        self.paths: dict[str, Path] = {}
        self._token_expiry: dict[str, float] = {}

    @property
    def namespace(self) -> str:
        return self.pod["metadata"].get("namespace", "default")

    def _fs_group(self) -> int | None:
        value = ((self.pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
        return int(value) if value is not None else None

    def volume_dir(self, plugin: str, name: str) -> Path:
        return self.root / "volumes" / plugin / name

    async def setup(self, pod: Object) -> dict[str, Path]:
        self.pod = pod
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            name = volume.get("name", "")
            kind = _kind_of(volume)
            try:
                await self._setup_one(name, kind, volume.get(kind) or {})
            except MountError:
                raise
            except envvars.ConfigError as exc:
                raise MountError(name, str(exc)) from None
            except OSError as exc:
                raise MountError(name, str(exc)) from None
        return dict(self.paths)

    async def refresh(self, pod: Object) -> None:
        """Propagates ConfigMap/Secret/downward API changes and renews tokens (periodic resync)."""
        self.pod = pod
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            kind = _kind_of(volume)
            if (
                kind in ("configMap", "secret", "downwardAPI", "projected")
                and volume.get("name") in self.paths
            ):
                with contextlib.suppress(MountError, envvars.ConfigError, OSError):
                    await self._setup_one(volume["name"], kind, volume.get(kind) or {})

    async def _setup_one(self, name: str, kind: str, source: Object) -> None:
        if kind == "emptyDir":
            self.paths[name] = self._empty_dir(name, source)
        elif kind == "hostPath":
            self.paths[name] = self._host_path(name, source)
        elif kind in ("configMap", "secret", "downwardAPI", "projected"):
            files = await self._files(name, kind, source)
            if files is None:
                return
            plugin = {
                "configMap": CONFIGMAP,
                "secret": SECRET,
                "downwardAPI": DOWNWARD_API,
                "projected": PROJECTED,
            }[kind]
            directory = self.volume_dir(plugin, name)
            if not directory.exists():
                directory.mkdir(parents=True, mode=0o755)
                if kind in ("secret", "projected"):
                    _mount_tmpfs(directory, SECRET_TMPFS_SIZE)
                    directory.chmod(0o755)
            AtomicWriter(directory, gid=self._fs_group()).write(files)
            self.paths[name] = directory
        elif kind == "persistentVolumeClaim":
            raise MountError(
                name,
                f'persistentvolumeclaim "{source.get("claimName", "")}" cannot be mounted: '
                "this node has no storage provisioner (see docs/node.md)",
            )
        else:
            raise MountError(
                name,
                f"volume type {kind or 'unknown'} is not supported by this node "
                f"(supported: {', '.join(SUPPORTED)})",
            )

    def _empty_dir(self, name: str, source: Object) -> Path:
        directory = self.volume_dir(EMPTY_DIR, name)
        if directory.exists():
            return directory
        directory.mkdir(parents=True)
        directory.chmod(0o777)
        if source.get("medium") == "Memory":
            limit = source.get("sizeLimit") or self.allocatable.get("memory", "64Mi")
            _mount_tmpfs(directory, quantity.int_value(limit))
        gid = self._fs_group()
        if gid is not None:
            os.chown(directory, -1, gid)
            directory.chmod(0o2777)
        return directory

    def _host_path(self, name: str, source: Object) -> Path:
        path = Path(source.get("path", ""))
        kind = source.get("type") or ""
        checks = {
            "Directory": (path.is_dir, "is not a directory"),
            "File": (path.is_file, "is not a file"),
            "Socket": (lambda: path.is_socket(), "is not a socket file"),
            "CharDevice": (lambda: path.is_char_device(), "is not a character device"),
            "BlockDevice": (lambda: path.is_block_device(), "is not a block device"),
        }
        if kind == "DirectoryOrCreate" and not path.exists():
            path.mkdir(parents=True, mode=0o755)
        elif kind == "FileOrCreate" and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o644)
        elif kind in checks:
            check, problem = checks[kind]
            if not check():
                raise MountError(name, f"hostPath type check failed: {path} {problem}")
        return path

    # ---------------------------------------------------------------- contents

    async def _files(self, name: str, kind: str, source: Object) -> dict[str, tuple[bytes, int]] | None:
        mode = source.get("defaultMode", DEFAULT_MODE)
        if kind == "configMap":
            return await self._object_files("ConfigMap", source, mode)
        if kind == "secret":
            return await self._object_files("Secret", {**source, "name": source.get("secretName", "")}, mode)
        if kind == "downwardAPI":
            return self._downward_files(source.get("items") or [], mode)
        files: dict[str, tuple[bytes, int]] = {}
        for projection in source.get("sources") or []:
            if "configMap" in projection:
                part = await self._object_files("ConfigMap", projection["configMap"], mode)
            elif "secret" in projection:
                part = await self._object_files("Secret", projection["secret"], mode)
            elif "downwardAPI" in projection:
                part = self._downward_files(projection["downwardAPI"].get("items") or [], mode)
            elif "serviceAccountToken" in projection:
                part = await self._token_file(name, projection["serviceAccountToken"], mode)
            else:
                raise MountError(
                    name,
                    f"projected source {next(iter(projection), 'unknown')} is not supported by this node",
                )
            files.update(part or {})
        return files

    async def _object_files(self, kind: str, source: Object, mode: int) -> dict[str, tuple[bytes, int]]:
        obj = await self.lookup(kind, self.namespace, source.get("name", ""))
        if obj is None:
            if source.get("optional"):
                return {}
            raise envvars.ConfigError(f'{kind.lower()} "{source.get("name", "")}" not found')
        data: dict[str, bytes] = {}
        if kind == "Secret":
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        items = source.get("items")
        if not items:
            return {key: (value, mode) for key, value in data.items()}
        files = {}
        for item in items:
            key = item.get("key", "")
            if key not in data:
                if source.get("optional"):
                    continue
                raise envvars.ConfigError(
                    f"configmap references non-existent config key: {key}"
                    if kind == "ConfigMap"
                    else f"references non-existent secret key: {key}"
                )
            files[item.get("path") or key] = (data[key], item.get("mode", mode))
        return files

    def _downward_files(self, items: list[Object], mode: int) -> dict[str, tuple[bytes, int]]:
        files = {}
        containers = {c.get("name"): c for c in (self.pod.get("spec") or {}).get("containers") or []}
        for item in items:
            if "fieldRef" in item:
                value = envvars.field_value(self.pod, item["fieldRef"].get("fieldPath", ""))
            elif "resourceFieldRef" in item:
                ref = item["resourceFieldRef"]
                container = containers.get(ref.get("containerName")) or {}
                value = envvars.resource_value(
                    container, ref.get("resource", ""), ref.get("divisor"), self.allocatable
                )
            else:
                continue
            files[item.get("path", "")] = (value.encode(), item.get("mode", mode))
        return files

    async def _token_file(self, volume: str, source: Object, mode: int) -> dict[str, tuple[bytes, int]]:
        audience = source.get("audience", "")
        seconds = int(source.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
        key = f"{volume}/{source.get('path', 'token')}"
        current = self.volume_dir(PROJECTED, volume) / source.get("path", "token")
        # A kubelet renews a token at 80% of its life; until then the file stays as it is.
        if key in self._token_expiry and time.time() < self._token_expiry[key] and current.exists():
            return {source.get("path", "token"): (current.read_bytes(), mode)}
        account = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        token, expires = await self.tokens(self.pod, account, seconds, audience)
        issued = time.time()
        self._token_expiry[key] = issued + 0.8 * max(0.0, expires - issued)
        return {source.get("path", "token"): (token.encode(), mode)}

    # ---------------------------------------------------------------- usage and teardown

    def empty_dir_overuse(self) -> list[str]:
        """Eviction messages for disk emptyDirs over their sizeLimit (the kubelet's local storage check)."""
        messages = []
        for volume in (self.pod.get("spec") or {}).get("volumes") or []:
            source = volume.get("emptyDir")
            if source is None or source.get("medium") == "Memory" or not source.get("sizeLimit"):
                continue
            directory = self.paths.get(volume.get("name", ""))
            if directory is None:
                continue
            used = _disk_usage(directory)
            if used > quantity.int_value(source["sizeLimit"]):
                messages.append(
                    f'Usage of EmptyDir volume "{volume["name"]}" exceeds the limit "{source["sizeLimit"]}". '
                )
        return messages

    def teardown(self) -> None:
        if self.root.exists():
            unmount_all_under(self.root)
            shutil.rmtree(self.root, ignore_errors=True)


def _disk_usage(directory: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total
