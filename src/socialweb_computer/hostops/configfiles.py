"""The gateway's two configuration files under ~/.config/socialweb-computer: read, check, write.

install writes them and upgrade replaces them when given new ones.  Both are checked before
anything changes: the environment file's shape (envfile; its values are secrets and are never
printed), the spec with the gateway's own parser, and the spec must name a fixed API port,
because install and upgrade wait on /api/config there.
"""

from __future__ import annotations

from pathlib import Path

from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostops import HostOpsError, envfile, files
from socialweb_computer.hostops import layout as layout_mod

ENV_MODE = 0o600  # it holds secrets
SPEC_MODE = 0o644  # it holds none (docs/gateway.md), so an operator may read it freely
DIR_MODE = 0o700
EMPTY_ENV = (b"# Environment of socialweb-computer-gateway.service: NAME=value lines (secrets, settings).\n"
             b"# SOCIALWEB_GATEWAY_STATE_DIR=... overrides the unit's default state directory.\n")
EMPTY_SPEC = b"# The gateway spec (docs/gateway.md); empty means the defaults.\n"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise HostOpsError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def read_env(path: Path) -> bytes:
    """The environment file's bytes, once its shape is checked."""
    data = _read(path, "environment file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HostOpsError(f"the environment file {path} is not UTF-8 text") from None
    envfile.names(text, str(path))
    return data


def read_spec(path: Path) -> tuple[bytes, spec_mod.GatewaySpec]:
    """The spec file's bytes and what they mean, once the gateway's parser accepts them."""
    data = _read(path, "gateway spec")
    try:
        spec = spec_mod.load(str(path))
    except spec_mod.SpecError as e:
        raise HostOpsError(str(e)) from None
    require_fixed_port(spec, str(path))
    return data, spec


def require_fixed_port(spec: spec_mod.GatewaySpec, source: str) -> None:
    if spec.api_port == 0:
        raise HostOpsError(f"{source}: listen.apiPort is 0 (a random port), but install and upgrade wait "
                           f"on /api/config at a known port: leave it out ({spec_mod.DEFAULT_API_PORT}) "
                           "or give one")


def installed_spec(layout: layout_mod.Layout) -> spec_mod.GatewaySpec:
    """The spec the unit runs with now."""
    try:
        return spec_mod.load(str(layout.spec_file))
    except spec_mod.SpecError as e:
        raise HostOpsError(f"the installed spec cannot be read: {e}") from None


def write(layout: layout_mod.Layout, env: bytes | None, spec: bytes | None) -> None:
    """Write whichever of the two files is given (None keeps the file as it is)."""
    layout.config_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if env is not None:
        files.write_atomic(layout.env_file, env, ENV_MODE)
    if spec is not None:
        files.write_atomic(layout.spec_file, spec, SPEC_MODE)
