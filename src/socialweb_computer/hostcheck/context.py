"""What every host check looks at (`Context`) and what it reports back (`Finding`).

The command line builds one Context from its flags and the environment; tests build their
own, pointing the system paths (linger directory, /dev/kvm, /proc) at prepared ones.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from collections.abc import Mapping
from typing import TYPE_CHECKING

from socialweb_computer import binary

if TYPE_CHECKING:  # imported when a Context needs the default spec: it brings the server's limits
    from socialweb_computer.gateway import spec as spec_mod

ROLES = ("gateway", "node")

# System places the checks read; module-level so a test of the whole command can point them
# at prepared ones (a Context built directly takes them as arguments).
LINGER_DIR = "/var/lib/systemd/linger"
SYSTEMD_DIR = "/run/systemd/system"
KVM_DEVICE = "/dev/kvm"


def _default_spec() -> spec_mod.GatewaySpec:
    from socialweb_computer.gateway import spec as spec_mod

    return spec_mod.GatewaySpec()


@dataclasses.dataclass(frozen=True)
class Context:
    """One run of the checks: the role, the state directory, the spec, and where to look."""

    role: str
    state_dir: str
    spec: spec_mod.GatewaySpec = dataclasses.field(default_factory=lambda: _default_spec())
    # The tools checked (QEMU, mkfs.ext4) must see the user's loader path, not the binary's bundle.
    env: Mapping[str, str] = dataclasses.field(default_factory=binary.child_env)
    uid: int = dataclasses.field(default_factory=os.geteuid)
    proc: str = "/proc"
    linger_dir: str = dataclasses.field(default_factory=lambda: LINGER_DIR)
    systemd_dir: str = dataclasses.field(default_factory=lambda: SYSTEMD_DIR)
    kvm_device: str = dataclasses.field(default_factory=lambda: KVM_DEVICE)
    tool_timeout: float = 10.0

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    @property
    def state_path(self) -> str:
        return os.path.abspath(self.state_dir)


@dataclasses.dataclass(frozen=True)
class Finding:
    ok: bool
    found: str


def ok(found: str) -> Finding:
    return Finding(True, found)


def fail(found: str) -> Finding:
    return Finding(False, found)
