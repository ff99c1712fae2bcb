"""The build backend's one extra step: what the project generates goes into the wheel.

pyproject.toml declares the project; setuptools builds it. What setuptools cannot know is
that the package needs files that are not in the repository, because they are generated
from upstream sources (never copied in):

- `apiserver/protobuf/generated/fields.json`, the protobuf field table, from Debian's
  copies of the upstream `.proto` files and Go types: without it every `kubectl create`
  is answered with a 500;
- `node/cri/generated/` (the CRI gRPC stubs, from Debian's `api.proto`, with grpcio-tools'
  protoc) and `node/generated/pause.oci.tar` (the pod sandbox image, `pause.c` built with
  `gcc -static`): without them no node starts.

So `build_py` runs the project's own generators (`socialweb_computer.apiserver.protobuf.build`,
`socialweb_computer.node.build`) into the build tree for whatever is not already there and
current, and fails the build if one cannot: a wheel without them would install a server
that fails later, far from the cause. Their inputs (Debian packages) are cached where
$SOCIALWEB_PROTOBUF_CACHE and $SOCIALWEB_NODE_BUILD_CACHE say, else under the checkout's
`.tools/cache`.

The generators import the standard library plus what `[build-system] requires` lists
(grpcio-tools, orjson); they are loaded from the source tree without the package's
`__init__` modules, which import runtime dependencies an isolated build environment does
not have. Editable installs skip the step: `scripts/bootstrap.sh` writes the files into
the source tree for them.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SRC = Path(__file__).resolve().parent / "src"
TABLE = Path("socialweb_computer", "apiserver", "protobuf", "generated", "fields.json")
CRI_STUBS = Path("socialweb_computer", "node", "cri", "generated")
NODE_GENERATED = Path("socialweb_computer", "node", "generated")


def _from_source(module: str) -> types.ModuleType:
    """`module` from the source tree, its parent packages stood in for by empty modules."""
    parts = module.split(".")
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(SRC.joinpath(*parts[:depth]))]
            sys.modules[name] = package
    return importlib.import_module(module)


class BuildWithGenerated(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        build_lib = Path(self.build_lib)
        self._protobuf_table(build_lib / TABLE)
        self._node_files(build_lib)

    @staticmethod
    def _protobuf_table(target: Path) -> None:
        generator = _from_source("socialweb_computer.apiserver.protobuf.build")
        stamp = generator.builder_stamp(generator.DEFAULT_SUITE)
        if generator.is_up_to_date(target, stamp):
            return  # copied from the source tree by package-data, and current
        status = generator.main(["--output", str(target)])
        if status != 0 or not generator.is_up_to_date(target, stamp):
            raise SystemExit(f"cannot generate {TABLE}: see the protobuf-build messages above")

    @staticmethod
    def _node_files(build_lib: Path) -> None:
        node_build = _from_source("socialweb_computer.node.build")
        cri_build = _from_source("socialweb_computer.node.cri.build")
        cache = node_build.default_cache_dir()
        errors = (node_build.BuildError, cri_build.StubBuildError, OSError,
                  _from_source("socialweb_computer.debian").ArchiveError)
        try:
            # A source tree that has them (bootstrap ran) gave them to the build tree already.
            cri_build.build(cache, output=build_lib / CRI_STUBS, log=lambda m: print(f"node-build: {m}"))
            node_build.build_pause(output=build_lib / NODE_GENERATED)
        except errors as e:
            raise SystemExit(f"cannot generate the node's CRI stubs and pause image: {e}") from None


setup(cmdclass={"build_py": BuildWithGenerated})
