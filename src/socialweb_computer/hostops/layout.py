"""Where the gateway lives under its service account's home: one table of paths.

install, upgrade, the unit renderer and scripts/deploy.sh (which repeats the stable path and the
unit path in shell) all go through here; docs/host-operations.md draws the same tree.

    ~/.local/bin/socialweb-computer -> ../lib/socialweb-computer/current/socialweb-computer
    ~/.local/lib/socialweb-computer/versions/<version>-<sha256[:12]>/socialweb-computer
    ~/.local/lib/socialweb-computer/current  -> versions/<...>   (swapped with rename(2))
    ~/.local/lib/socialweb-computer/previous -> versions/<...>   (what a rollback returns to)
    ~/.config/socialweb-computer/gateway.env        0600, the unit's EnvironmentFile
    ~/.config/socialweb-computer/gateway-spec.yaml  the gateway spec
    ~/.config/systemd/user/socialweb-computer-gateway.service
    ~/.local/state/socialweb-computer/               default state directory
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

NAME = "socialweb-computer"
UNIT_NAME = "socialweb-computer-gateway.service"


@dataclasses.dataclass(frozen=True)
class Layout:
    """The paths for one account; `home` is its home directory (systemd's %h)."""

    home: Path

    @classmethod
    def for_current_user(cls) -> Layout:
        # The passwd entry, not $HOME: it is what the user manager expands %h to.
        return cls(Path(pwd.getpwuid(os.getuid()).pw_dir))

    @property
    def lib_dir(self) -> Path:
        return self.home / ".local" / "lib" / NAME

    @property
    def versions_dir(self) -> Path:
        return self.lib_dir / "versions"

    @property
    def current(self) -> Path:
        return self.lib_dir / "current"

    @property
    def previous(self) -> Path:
        return self.lib_dir / "previous"

    @property
    def lock_file(self) -> Path:
        return self.lib_dir / ".lock"

    @property
    def stable_binary(self) -> Path:
        return self.home / ".local" / "bin" / NAME

    @property
    def stable_target(self) -> str:
        """What the stable path links to: relative, so the tree can be inspected or moved whole."""
        return os.path.join("..", "lib", NAME, "current", NAME)

    @property
    def config_dir(self) -> Path:
        return self.home / ".config" / NAME

    @property
    def env_file(self) -> Path:
        return self.config_dir / "gateway.env"

    @property
    def spec_file(self) -> Path:
        return self.config_dir / "gateway-spec.yaml"

    @property
    def unit_dir(self) -> Path:
        return self.home / ".config" / "systemd" / "user"

    @property
    def unit_file(self) -> Path:
        return self.unit_dir / UNIT_NAME

    @property
    def default_state_dir(self) -> Path:
        return self.home / ".local" / "state" / NAME

    def version_dir(self, name: str) -> Path:
        return self.versions_dir / name

    def installed_marks(self) -> list[Path]:
        """The paths that say an install happened (any one is enough to refuse a second install)."""
        return [p for p in (self.stable_binary, self.current, self.unit_file) if os.path.lexists(p)]
