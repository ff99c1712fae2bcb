"""The build backend's one extra step: the generated protobuf field table goes into the wheel.

pyproject.toml declares the project; setuptools builds it. What setuptools cannot know is
that the server needs `apiserver/protobuf/generated/fields.json`, which is not in the
repository (it is generated from Debian's copies of the upstream `.proto` files and Go
types, never copied in). So `build_py` runs the project's own generator
(`socialweb_computer.apiserver.protobuf.build`) into the build tree whenever the table is
not already there, and fails the build if it cannot: a wheel without its table would
serve a 500 to every `kubectl create`.

The generator and the two parsers it uses import only the standard library; they are
loaded from the source tree without the package's `__init__` modules (which import the
runtime dependencies that an isolated build environment does not have). Editable installs
skip the step: `scripts/bootstrap.sh` writes the table into the source tree for them.
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


def _generator() -> types.ModuleType:
    """`socialweb_computer.apiserver.protobuf.build`, imported without the packages' __init__."""
    packages = ("socialweb_computer", "socialweb_computer.apiserver", "socialweb_computer.apiserver.protobuf")
    for name in packages:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(SRC.joinpath(*name.split(".")))]
            sys.modules[name] = package
    return importlib.import_module("socialweb_computer.apiserver.protobuf.build")


class BuildWithTables(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / TABLE
        generator = _generator()
        stamp = generator.builder_stamp(generator.DEFAULT_SUITE)
        if generator.is_up_to_date(target, stamp):
            return  # copied from the source tree by package-data, and current
        status = generator.main(["--output", str(target)])
        if status != 0 or not generator.is_up_to_date(target, stamp):
            raise SystemExit(f"cannot generate {TABLE}: see the protobuf-build messages above")


setup(cmdclass={"build_py": BuildWithTables})
