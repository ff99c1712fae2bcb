"""`socialweb-computer upgrade`: replace the gateway's binary (and, if given, its configuration).

Called by cli/upgrade.py (scripts/deploy.sh runs it over ssh once install has run).  The new
binary is verified before anything changes; then `current` is switched to it with one rename,
the configuration files and the unit are rewritten, the unit restarted, and the wait requires
the unit's new process to answer /api/config.  If it does not, everything switched is put back
(binary link, configuration, unit), the old binary restarted and waited for, and the command
still exits 1.  The state directory is never opened: an upgrade changes what runs, not what
the gateway stores.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from socialweb_computer import hostops
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostops import HostOpsError, binaries, configfiles, files, systemd, unit, wait
from socialweb_computer.hostops import layout as layout_mod

UNIT = layout_mod.UNIT_NAME
DEFAULT_TIMEOUT = hostops.DEFAULT_TIMEOUT
Request = hostops.Request
Say = hostops.Say


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What an upgrade may change, as it was before: enough to put it all back."""

    current: str | None
    previous: str | None
    env: bytes | None
    spec: bytes | None
    unit: bytes | None

    @classmethod
    def take(cls, layout: layout_mod.Layout) -> Snapshot:
        return cls(current=files.link_target(layout.current), previous=files.link_target(layout.previous),
                   env=files.read_or_none(layout.env_file), spec=files.read_or_none(layout.spec_file),
                   unit=files.read_or_none(layout.unit_file))

    def restore(self, layout: layout_mod.Layout) -> None:
        for link, target in ((layout.current, self.current), (layout.previous, self.previous)):
            if target is None:
                link.unlink(missing_ok=True)
            else:
                files.link_atomic(link, target)
        files.restore(layout.env_file, self.env, configfiles.ENV_MODE)
        files.restore(layout.spec_file, self.spec, configfiles.SPEC_MODE)
        files.restore(layout.unit_file, self.unit, 0o644)


def require_installed(layout: layout_mod.Layout) -> None:
    missing = [p for p in (layout.current, layout.unit_file) if not os.path.lexists(p)]
    if missing:
        raise HostOpsError(f"the gateway is not installed ({missing[0]} is missing): run "
                           "`socialweb-computer install gateway` first")


def upgrade(request: Request, layout: layout_mod.Layout, manager: systemd.UserManager,
            say: Say) -> dict[str, Any]:
    """Switch to the new binary and restart; returns the new process's /api/config document."""
    require_installed(layout)
    manager.require()
    env = configfiles.read_env(request.env_file) if request.env_file else None
    new_spec: spec_mod.GatewaySpec | None = None
    spec_bytes = None
    if request.spec_file:
        spec_bytes, new_spec = configfiles.read_spec(request.spec_file)
    candidate = binaries.verify(request.binary, request.sha256)
    say(f"verified {request.binary}: socialweb-computer {candidate.version}, sha256 {candidate.sha256}")
    with binaries.locked(layout):
        require_installed(layout)
        url, old_url = _urls(layout, new_spec)
        before = Snapshot.take(layout)
        version_dir = binaries.stage(layout, candidate)
        new_link = binaries.version_link(layout, version_dir)
        try:
            _switch(layout, manager, before, new_link, version_dir, env, spec_bytes, say)
        except (OSError, HostOpsError) as e:
            before.restore(layout)
            raise HostOpsError(f"cannot switch to {new_link}: {e}; everything was put back") from None
        try:
            manager.restart(UNIT)
            say(f"systemctl --user restart {UNIT}: done; waiting for {url}")
            config = wait.wait_for_gateway(manager, url, request.timeout)
        except HostOpsError as failure:
            _roll_back(layout, manager, before, new_link, failure, old_url, request.timeout, say)
        removed = binaries.prune(layout)
    if removed:
        say(f"removed old versions: {', '.join(removed)}")
    say(wait.summary(config, url))
    return config


def _switch(layout: layout_mod.Layout, manager: systemd.UserManager, before: Snapshot, new_link: str,
            version_dir: Path, env: bytes | None, spec_bytes: bytes | None, say: Say) -> None:
    if before.current and before.current != new_link:
        files.link_atomic(layout.previous, before.current)
    binaries.switch(layout, version_dir)
    say(f"switched {layout.current} from {before.current} to {new_link}")
    replaced = [str(path) for path, data, old in ((layout.env_file, env, before.env),
                                                  (layout.spec_file, spec_bytes, before.spec))
                if data is not None and data != old]
    configfiles.write(layout, env, spec_bytes)
    if replaced:
        say(f"replaced {' and '.join(replaced)}")
    _write_unit(layout, manager, say)


def _write_unit(layout: layout_mod.Layout, manager: systemd.UserManager, say: Say) -> None:
    text = unit.render(layout).encode()
    if files.read_or_none(layout.unit_file) != text:
        files.write_atomic(layout.unit_file, text, 0o644)
        manager.daemon_reload()
        say(f"rewrote {layout.unit_file}; systemctl --user daemon-reload: done")


def _urls(layout: layout_mod.Layout, new_spec: spec_mod.GatewaySpec | None) -> tuple[str, str]:
    """Where the new gateway will answer /api/config, and where the old one did (for a rollback).

    Read before anything changes, so an installed spec this release cannot read stops the
    upgrade early, unless a new spec replaces it (then the rollback waits on the new port too).
    """
    try:
        old = wait.config_url(configfiles.installed_spec(layout))
    except HostOpsError:
        if new_spec is None:
            raise
        old = wait.config_url(new_spec)
    return (wait.config_url(new_spec) if new_spec else old), old


def _roll_back(layout: layout_mod.Layout, manager: systemd.UserManager, before: Snapshot, new_link: str,
               failure: HostOpsError, url: str, timeout: float, say: Say) -> None:
    """Put back what the upgrade switched, restart the old binary, and raise in every case."""
    say(f"{new_link} did not come up ({failure}); rolling back to {before.current}")
    unit_changed = files.read_or_none(layout.unit_file) != before.unit
    before.restore(layout)
    try:
        if unit_changed:
            manager.daemon_reload()
        manager.restart(UNIT)
        config = wait.wait_for_gateway(manager, url, timeout)
    except HostOpsError as again:
        raise HostOpsError(f"the upgrade to {new_link} failed: {failure}. The rollback to {before.current} "
                           f"failed too: {again}") from None
    raise HostOpsError(f"the upgrade to {new_link} failed: {failure}. Rolled back to {before.current}: "
                       f"{wait.summary(config, url)}")
