"""Bidders as the gateway spec configures them: one place turns a spec into a ready bidder.

    bidder = make_bidder("qemu", state_dir, spec, owner_pid=os.getpid())
    handle = await bidder.start(NodeRequest(cluster="ci", server=url, size=size))

What comes from the spec: the registries every node is configured with (mirrors, plain HTTP,
credentials read now from the environment variables the spec names), the loopback ports those
registries need forwarded into a node, and for microVM nodes the guest image (`guestImage`;
the node's size comes from the request). `node start` and the capacity controller both build
their bidders here, so a node started by hand and one rented by the gateway are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from socialweb_computer.bidders import base, qemu, sandbox
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.guest import config as guest_config

BIDDERS: dict[str, Any] = {sandbox.KIND: sandbox.SandboxBidder, qemu.KIND: qemu.QemuBidder}


def make_bidder(
    kind: str,
    state_dir: Path,
    spec: spec_mod.GatewaySpec,
    *,
    owner_pid: int = 0,
    host_ports: Iterable[int] = (),
    image: guest_config.ImageConfig | None = None,
    env: dict[str, str] | None = None,
    progress: Callable[[str, str], None] | None = None,
) -> base.Bidder:
    """A bidder of `kind` for the gateway in `state_dir`, configured by `spec`.

    `owner_pid` is the gateway that rents the nodes (its restart reaps what it left running);
    `image` replaces the spec's guestImage; `env` is where credential references are resolved
    (default: this process's environment). Raises SpecError for a reference that does not
    resolve, and ValueError for an unknown kind.
    """
    if kind not in BIDDERS:
        raise ValueError(f"unknown bidder {kind!r}; the bidders are {', '.join(sorted(BIDDERS))}")
    registries, credentials, registry_ports = spec_mod.node_registries(spec, env)
    options: dict[str, Any] = {
        "host_ports": sorted({*host_ports, *registry_ports}),
        "registries": registries,
        "registry_credentials": credentials,
    }
    if kind == qemu.KIND:
        options.update(image=image or spec.guest_image, owner_pid=owner_pid, progress=progress)
    return BIDDERS[kind](state_dir, **options)  # type: ignore[no-any-return]
