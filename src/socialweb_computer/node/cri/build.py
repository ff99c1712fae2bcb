"""Build step: generate the CRI gRPC stubs from Debian's packaging of upstream `api.proto`.

Run as `python -m socialweb_computer.node.build` (the project's scripts do). The node agent
drives containers only through containerd's CRI plugin, over gRPC; the message and
service definitions are upstream's `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`, which
Debian ships in `golang-github-kubernetes-cri-api-dev`. Rather than copying the file or
the generated modules into the repository, this step:

1. obtains the package from Debian trixie (0.32.3, the CRI of Kubernetes 1.32, which
   containerd 1.6 and 1.7 both serve) through `socialweb_computer.debian`;
2. drops the gogoproto import and its file-level options: they only steer Go code
   generation and do not change the wire format (measured: see docs/node.md);
3. runs grpcio-tools' protoc, writing `generated/api_pb2.py` and `generated/api_pb2_grpc.py`
   next to this module (gitignored), importable as
   `socialweb_computer.node.cri.generated.api_pb2`.

Idempotent: a stamp over this file, the package version and grpcio-tools' version makes
a second run return at once without network.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from socialweb_computer import debian

PACKAGE = "golang-github-kubernetes-cri-api-dev"
SUITE = "trixie"
PROTO = Path("usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto")
HERE = Path(__file__).resolve().parent
GENERATED = HERE / "generated"
STAMP = GENERATED / "stamp"
# Lines that exist only for Go's gogoproto generator.
_GOGO_LINE = re.compile(
    r'^(import "github\.com/gogo/.*";|option \(gogoproto\.[a-z_]+\) *= *(true|false);)\s*$'
)


class StubBuildError(RuntimeError):
    pass


def _stamp(deb: Path) -> str:
    import grpc_tools

    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{deb.name}|{getattr(grpc_tools, '__version__', '')}".encode())
    return digest.hexdigest()


def strip_gogoproto(text: str) -> str:
    """The proto without gogoproto's import and options (wire format unchanged)."""
    kept = [line for line in text.splitlines() if not _GOGO_LINE.match(line.strip())]
    if any("gogoproto" in line for line in kept):
        raise StubBuildError(
            "api.proto uses gogoproto beyond file-level options; the build step needs updating"
        )
    return "\n".join(kept) + "\n"


def is_up_to_date(cache: Path, output: Path = GENERATED) -> bool:
    debs = debian.cached_debs([PACKAGE], cache)
    stamp = output / STAMP.name
    return (
        bool(debs)
        and stamp.is_file()
        and stamp.read_text() == _stamp(debs[0])
        and (output / "api_pb2.py").is_file()
        and (output / "api_pb2_grpc.py").is_file()
    )


def build(
    cache: Path, *, force: bool = False, log: Callable[[str], None] = print, output: Path = GENERATED
) -> bool:
    """Returns True when it (re)wrote the stubs. `output` is the `generated` package directory
    (another than this one's: the wheel's build tree, setup.py)."""
    if not force and is_up_to_date(cache, output):
        return False
    from grpc_tools import protoc

    (deb,) = debian.obtain([PACKAGE], SUITE, cache, log=log)
    with tempfile.TemporaryDirectory(prefix="cri-stubs-") as tmp:
        root = Path(tmp)
        debian.extract(deb, root / "deb")
        source = root / "deb" / PROTO
        if not source.is_file():
            raise StubBuildError(f"{deb.name} has no {PROTO}")
        include = root / "include"
        target = include / "socialweb_computer" / "node" / "cri" / "generated"
        target.mkdir(parents=True)
        (target / "api.proto").write_text(strip_gogoproto(source.read_text()))
        out = root / "out"
        out.mkdir()
        protoc_include = Path(protoc.__file__).parent / "_proto"
        status = protoc.main(
            [
                "protoc",
                f"-I{include}",
                f"-I{protoc_include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                "socialweb_computer/node/cri/generated/api.proto",
            ]
        )
        if status != 0:
            raise StubBuildError(f"protoc failed on {PROTO} (exit {status})")
        produced = out / "socialweb_computer" / "node" / "cri" / "generated"
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".generated-", dir=output.parent))
        try:
            for name in ("api_pb2.py", "api_pb2_grpc.py"):
                shutil.copy2(produced / name, staging / name)
            (staging / "__init__.py").write_text('"""Generated CRI stubs (see ../build.py); not in git."""\n')
            (staging / STAMP.name).write_text(_stamp(deb))
            if output.exists():
                shutil.rmtree(output)
            staging.rename(output)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log(f"wrote CRI stubs from {deb.name}")
    return True
