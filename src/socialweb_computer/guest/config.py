"""The image config: what goes into a guest image, and the fingerprint that names it.

    # image.yaml (every field optional)
    suite: bookworm               # the Debian suite of the kernel and the packages
    kernel: linux-image-amd64     # a kernel package (a metapackage is followed to its image)
    packages: [git]               # extra packages for the root filesystem (the node's own are always in)
    vcpu: 2
    memMiB: 2048
    rootfsMiB: 8192               # the root filesystem: containerd's layers and the jobs' output live here
    agent: dist/socialweb-computer   # the node agent (the project's single-file binary)
    files:                        # staged into the root filesystem
      - {source: ./ca.pem, path: /usr/local/share/ca-certificates/corp.crt, mode: "0644"}

The seed's rule is that vcpu and memMiB live in the image's manifest, so changing either builds
a new image: the fingerprint is a SHA-256 over every input (this config with its defaults
filled in, the content of each staged file, the agent binary's hash, the build recipe), and
an image is stored under it. Package *versions* are not inputs (resolving them needs the
network, and `ensure` must answer in well under a second); the manifest records the versions
a build used, and `image build --refresh` fetches the archive's newest.

Staged files are checked here, before anything is built: `mkfs.ext4 -d` is documented to
refuse a file of about 2 GiB or more (`Ext2 file too big`), and the e2fsprogs on these hosts
(1.47) does not even do that reliably, so the project refuses such a file itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import orjson
import yaml

from socialweb_computer import binary

DEFAULT_SUITE = "bookworm"
DEFAULT_KERNEL = "linux-image-amd64"
# What every node needs in its root filesystem (docs/node.md, "Inside a microVM node").
NODE_PACKAGES = (
    "base-files",
    "busybox-static",
    "tini",
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "nftables",  # the node's Services are an nft table (node/proxy.py)
    "kmod",
    "ca-certificates",
    "zlib1g",  # the single-file binary's bootloader links libz
)
# `mkfs.ext4 -d` refuses files from this size on ("Ext2 file too big").
STAGED_FILE_LIMIT = 2 << 30
AGENT_ENV = "SOCIALWEB_NODE_AGENT_BINARY"
JOBS_DOC = "docs/03-jobs.md#what-the-guest-does-and-does-not-pull"
_FIELDS = ("suite", "kernel", "packages", "vcpu", "memMiB", "rootfsMiB", "agent", "files")
_FILE_FIELDS = ("source", "path", "mode")
MIN_MEM_MIB = 256
MIN_ROOTFS_MIB = 256


class ImageConfigError(ValueError):
    """The config cannot be built; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class StagedFile:
    source: Path  # on the host
    path: str  # absolute, in the guest's root filesystem
    mode: int = 0o644

    def as_json(self) -> dict[str, Any]:
        return {"source": str(self.source), "path": self.path, "mode": f"{self.mode:04o}"}


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    suite: str = DEFAULT_SUITE
    kernel: str = DEFAULT_KERNEL
    packages: tuple[str, ...] = ()
    vcpu: int = 2
    mem_mib: int = 2048
    rootfs_mib: int = 8192
    agent: Path | None = None  # None: found by `agent_binary()`
    files: tuple[StagedFile, ...] = ()

    def with_size(self, *, vcpu: int, mem_mib: int, rootfs_mib: int) -> ImageConfig:
        return dataclasses.replace(self, vcpu=vcpu, mem_mib=mem_mib, rootfs_mib=rootfs_mib)

    @property
    def all_packages(self) -> tuple[str, ...]:
        return tuple(sorted({*NODE_PACKAGES, *self.packages}))

    def as_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "kernel": self.kernel,
            "packages": sorted(self.packages),
            "vcpu": self.vcpu,
            "memMiB": self.mem_mib,
            "rootfsMiB": self.rootfs_mib,
            "agent": str(self.agent) if self.agent else "",
            "files": [f.as_json() for f in self.files],
        }


def load(path: str | Path | None) -> ImageConfig:
    if not path:
        return ImageConfig()
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImageConfigError(f"cannot read the image config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ImageConfigError(f"the image config {path} is not valid YAML: {exc}") from None
    return parse(document, base=Path(path).resolve().parent, source=str(path))


def parse(document: Any, *, base: Path, source: str = "image config") -> ImageConfig:
    """Checks a config document; relative paths in it are relative to `base` (the file's directory)."""
    document = document or {}
    if not isinstance(document, dict):
        raise ImageConfigError(f"{source}: expected a mapping with the keys {', '.join(_FIELDS)}")
    unknown = sorted(str(k) for k in document if k not in _FIELDS)
    if unknown:
        raise ImageConfigError(
            f"{source}: unknown field {unknown[0]!r}; the known fields are {', '.join(_FIELDS)}"
        )
    packages = document.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and p for p in packages):
        raise ImageConfigError(f"{source}: packages: expected a list of Debian package names")
    agent = document.get("agent")
    config = ImageConfig(
        suite=_text(document.get("suite", DEFAULT_SUITE), f"{source}: suite"),
        kernel=_text(document.get("kernel", DEFAULT_KERNEL), f"{source}: kernel"),
        packages=tuple(packages),
        vcpu=_int(document.get("vcpu", 2), f"{source}: vcpu", 1),
        mem_mib=_int(document.get("memMiB", 2048), f"{source}: memMiB", MIN_MEM_MIB),
        rootfs_mib=_int(document.get("rootfsMiB", 8192), f"{source}: rootfsMiB", MIN_ROOTFS_MIB),
        agent=(base / _text(agent, f"{source}: agent")) if agent else None,
        files=tuple(
            _staged(item, base, f"{source}: files[{i}]")
            for i, item in enumerate(_list(document.get("files") or [], f"{source}: files"))
        ),
    )
    return config


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ImageConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ImageConfigError(f"{where}: expected an integer of at least {minimum}, got {value!r}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ImageConfigError(f"{where}: expected a list")
    return value


def _staged(item: Any, base: Path, where: str) -> StagedFile:
    if not isinstance(item, dict) or sorted(set(item) - set(_FILE_FIELDS)):
        raise ImageConfigError(f"{where}: expected a mapping with the keys {', '.join(_FILE_FIELDS)}")
    path = _text(item.get("path"), f"{where}.path")
    if not path.startswith("/") or ".." in Path(path).parts:
        raise ImageConfigError(f"{where}.path: {path!r} must be an absolute path without '..'")
    mode = item.get("mode", "0644")
    try:
        mode_bits = int(str(mode), 8) if not isinstance(mode, int) else mode
    except ValueError:
        raise ImageConfigError(f'{where}.mode: {mode!r} is not an octal mode such as "0644"') from None
    return StagedFile(base / _text(item.get("source"), f"{where}.source"), path, mode_bits & 0o7777)


# ---------------------------------------------------------------- inputs


def agent_binary(config: ImageConfig) -> Path:
    """The node agent: the config's, $SOCIALWEB_NODE_AGENT_BINARY, this program, or dist/'s."""
    candidates: list[tuple[Path, str]] = []
    if config.agent is not None:
        candidates.append((config.agent, "the image config's agent"))
    elif os.environ.get(AGENT_ENV):
        candidates.append((Path(os.environ[AGENT_ENV]), f"${AGENT_ENV}"))
    elif binary.frozen():
        candidates.append((Path(os.path.realpath(binary.self_argv()[0])), "this program"))
    else:
        root = Path(__file__).resolve().parents[3]
        candidates.append((root / "dist" / "socialweb-computer", "the checkout's dist/"))
    path, what = candidates[0]
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ImageConfigError(
            f"no node agent binary at {path} ({what}): {exc.strerror}. The guest runs the project's "
            "single-file binary: build it with scripts/build-binary.sh, or name one with `agent:` "
            f"in the image config, --agent or ${AGENT_ENV}"
        ) from None
    if magic != b"\x7fELF":
        raise ImageConfigError(
            f"{path} ({what}) is not an executable binary: the node agent must be the single-file "
            "binary that scripts/build-binary.sh builds"
        )
    return path


def check_staged_files(config: ImageConfig) -> None:
    """Refuses a staged file that cannot or should not go into the image, before anything is built."""
    for staged in config.files:
        try:
            st = os.stat(staged.source)
        except OSError as exc:
            raise ImageConfigError(f"staged file {staged.source}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ImageConfigError(f"staged file {staged.source} is not a regular file")
        if st.st_size >= STAGED_FILE_LIMIT:
            raise ImageConfigError(
                f"Ext2 file too big: {staged.source} ({st.st_size / (1 << 30):.1f} GiB, staged as "
                f"{staged.path}) cannot go into the image: mkfs.ext4 -d refuses a file of about 2 GiB "
                "or more. A large file staged into the image does not help anyway; anything that "
                f"large is pulled by the guest at run time instead (see {JOBS_DOC})"
            )


def sha256_file(path: Path, *, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def inputs(config: ImageConfig, recipe: str) -> dict[str, Any]:
    """Every input of a build, as the fingerprint covers it."""
    agent = agent_binary(config)
    document = config.as_json()
    document.pop("agent")
    document["packages"] = list(config.all_packages)
    document["files"] = [
        {"path": f.path, "mode": f"{f.mode:04o}", "sha256": sha256_file(f.source)} for f in config.files
    ]
    document["agentSHA256"] = sha256_file(agent)
    document["recipe"] = recipe
    return document


def fingerprint(document: dict[str, Any]) -> str:
    return "sha256-" + hashlib.sha256(orjson.dumps(document, option=orjson.OPT_SORT_KEYS)).hexdigest()
