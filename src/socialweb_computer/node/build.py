"""Build step for the node: CRI stubs and the pause image.

    python -m socialweb_computer.node.build [--force] [--cache-dir DIR]

Run by `scripts/bootstrap.sh` (and the single-file binary's build). Both outputs are
generated, gitignored and idempotent:
- `cri/generated/`: gRPC stubs from Debian's packaging of upstream `api.proto` (see
  `cri/build.py`);
- `generated/pause.oci.tar`: the pod sandbox image, one static binary built from
  `pause.c` with the machine's C compiler (`gcc -static`), as an OCI archive that a
  node's containerd imports (`ctr images import`). Its tag is a digest of `pause.c`, so a
  change to the source is a new image name.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from socialweb_computer import debian
from socialweb_computer.node import oci
from socialweb_computer.node.cri import build as cri_build

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "pause.c"
GENERATED = HERE / "generated"
PAUSE_ARCHIVE = GENERATED / "pause.oci.tar"
BUILD_COMMAND = "python -m socialweb_computer.node.build"


class BuildError(RuntimeError):
    pass


def pause_image_name() -> str:
    return f"localhost/socialweb-computer/pause:{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}"


def _log(message: str) -> None:
    print(f"node-build: {message}", file=sys.stderr)


CACHE_ENV = "SOCIALWEB_NODE_BUILD_CACHE"  # where the downloaded .deb files are kept, if set


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = HERE.parents[2]
    if (root / "pyproject.toml").is_file():
        return root / ".tools" / "cache" / "debian"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "socialweb-computer" / "debian"


def build_pause(*, force: bool = False, output: Path = GENERATED) -> bool:
    """Writes `pause.oci.tar` into `output` (another than this package's `generated`: the
    wheel's build tree, setup.py). Returns True when it (re)wrote it."""
    name = pause_image_name()
    archive, stamp = output / PAUSE_ARCHIVE.name, output / "pause.stamp"
    if not force and archive.is_file() and stamp.is_file() and stamp.read_text() == name:
        return False
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise BuildError("no C compiler (gcc) to build the pause image; install gcc and libc6-dev")
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pause-") as tmp:
        binary = Path(tmp) / "pause"
        result = subprocess.run(
            [compiler, "-static", "-Os", "-s", "-o", str(binary), str(SOURCE)], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise BuildError(f"gcc -static failed (is libc6-dev installed?):\n{result.stderr.strip()}")
        image = oci.Image(entrypoint=["/pause"], user="65535:65535")
        image.add_file("pause", binary.read_bytes(), mode=0o755)
        image.write_archive(archive, name)
    stamp.write_text(name)
    _log(f"wrote the pause image {name}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=BUILD_COMMAND, description="Build the node's CRI stubs and pause image."
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where downloaded .deb files are kept")
    args = parser.parse_args(argv)
    try:
        wrote_stubs = cri_build.build(args.cache_dir or default_cache_dir(), force=args.force, log=_log)
        wrote_pause = build_pause(force=args.force)
    except (BuildError, cri_build.StubBuildError, debian.ArchiveError, OSError) as exc:
        _log(f"error: {exc}")
        return 1
    if not (wrote_stubs or wrote_pause):
        _log("CRI stubs and pause image are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
