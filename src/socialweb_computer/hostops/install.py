"""`socialweb-computer install gateway`: the first installation under the service account.

Called by cli/install.py (scripts/deploy.sh runs it over ssh the first time).  It refuses when
anything of an install is there (that is upgrade's job) and when no systemd user manager
answers, before it writes a byte.  Then: the binary into its version directory and the stable
path, the environment file (0600) and the spec, the unit, daemon-reload, enable, start, and a
wait until the unit's own process answers /api/config.
"""

from __future__ import annotations

from typing import Any

from socialweb_computer import hostops
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostops import HostOpsError, binaries, configfiles, files, systemd, unit, wait
from socialweb_computer.hostops import layout as layout_mod

UNIT = layout_mod.UNIT_NAME
DEFAULT_TIMEOUT = hostops.DEFAULT_TIMEOUT
Request = hostops.Request
Say = hostops.Say


def refuse_if_installed(layout: layout_mod.Layout) -> None:
    marks = layout.installed_marks()
    if marks:
        raise HostOpsError(f"the gateway is already installed ({marks[0]} exists): use "
                           "`socialweb-computer upgrade` to replace the binary or the configuration")


def install_gateway(request: Request, layout: layout_mod.Layout, manager: systemd.UserManager,
                    say: Say) -> dict[str, Any]:
    """Install and start the gateway; returns its /api/config document."""
    refuse_if_installed(layout)
    manager.require()
    env = configfiles.read_env(request.env_file) if request.env_file else configfiles.EMPTY_ENV
    if request.spec_file:
        spec_bytes, spec = configfiles.read_spec(request.spec_file)
    else:
        spec_bytes, spec = configfiles.EMPTY_SPEC, spec_mod.GatewaySpec()
    unit_text = unit.render(layout)
    candidate = binaries.verify(request.binary, request.sha256)
    say(f"verified {request.binary}: socialweb-computer {candidate.version}, sha256 {candidate.sha256}")
    with binaries.locked(layout):
        refuse_if_installed(layout)
        version_dir = binaries.stage(layout, candidate)
        binaries.switch(layout, version_dir)
        say(f"installed {version_dir / layout_mod.NAME}, reached as {layout.stable_binary}")
        configfiles.write(layout, env, spec_bytes)
        say(f"wrote {layout.env_file} (0600) and {layout.spec_file}")
        files.write_atomic(layout.unit_file, unit_text.encode(), 0o644)
        say(f"wrote {layout.unit_file}")
        url = wait.config_url(spec)
        try:
            manager.daemon_reload()
            manager.enable(UNIT)
            manager.start(UNIT)
            say(f"systemctl --user daemon-reload, enable, start {UNIT}: done; waiting for {url}")
            config = wait.wait_for_gateway(manager, url, request.timeout)
        except HostOpsError as e:
            raise HostOpsError(f"{e}. The gateway is installed but not running: fix the cause, then "
                               f"`systemctl --user restart {UNIT}` (or deploy again: it upgrades)") from None
    say(wait.summary(config, url))
    return config
