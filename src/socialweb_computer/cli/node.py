"""`socialweb-computer node ...`: start, stop and list nodes; and what runs inside a node.

    node start --cluster ci [--bidder sandbox] [--vcpu 2 --mem-mib 2048 --rootfs-mib 8192]
    node stop NAME
    node list [-o json]

`start` asks the bidder for a node of that size for the cluster and returns once its agent
has registered (the Node appears in `kubectl get nodes`); sizes default to the gateway
spec's `nodeDefaults`. `stop` ends the node and removes what it had on the host; its Node
object stays in the cluster and goes NotReady, as a machine that was switched off would.
`boot` and `sandbox-supervisor` are what a bidder runs: not for people.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from socialweb_computer.bidders import base, qemu, sandbox
from socialweb_computer.clusterprovider import layout
from socialweb_computer.gateway import bidding
from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.node import config as node_config

BIDDERS = bidding.BIDDERS


def _state_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("SOCIALWEB_GATEWAY_STATE_DIR"),
        help="the gateway's state directory (default: $SOCIALWEB_GATEWAY_STATE_DIR)",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "node",
        help="start, stop and list nodes of tenant clusters",
        description="Start, stop and list the nodes of tenant clusters on this host.",
    )
    inner = p.add_subparsers(dest="node_command", metavar="OPERATION")
    inner.required = True

    start = inner.add_parser(
        "start",
        help="start a node for a cluster (returns once it has registered)",
        description="Start a node for a tenant cluster through a bidder and wait until its "
        "agent has registered. The sandbox bidder runs the node as host processes in "
        "namespaces of their own: it shares the host's kernel. The qemu bidder boots a microVM "
        "from a guest image of the node's size (built first when missing; see `image`), with "
        "a kernel of its own (see docs/node.md).",
    )
    _state_dir_argument(start)
    start.add_argument("--cluster", required=True, help="the Cluster's name")
    start.add_argument("--bidder", default="sandbox", choices=sorted(BIDDERS), help="how to start it")
    start.add_argument("--name", default="", help="the node's name (default: <bidder>-<random>)")
    start.add_argument(
        "--spec",
        default=os.environ.get("SOCIALWEB_GATEWAY_SPEC"),
        help="the gateway spec: its nodeDefaults size the node, its registries configure the node's pulls, "
        "its guestImage is what a qemu node boots (default: $SOCIALWEB_GATEWAY_SPEC)",
    )
    start.add_argument("--vcpu", type=int, help="vCPUs (default: the spec's nodeDefaults.vcpu, 2)")
    start.add_argument("--mem-mib", type=int, help="memory in MiB (default: nodeDefaults.memMiB, 2048)")
    start.add_argument(
        "--rootfs-mib", type=int, help="root filesystem in MiB (default: nodeDefaults.rootfsMiB)"
    )
    start.add_argument(
        "--host-port",
        type=int,
        action="append",
        default=[],
        metavar="PORT",
        help="a port on the host's loopback the node may reach at its own 127.0.0.1:PORT "
        "(a registry); repeatable. Its cluster's apiserver is always reachable.",
    )
    start.add_argument(
        "--image-config",
        default=None,
        metavar="FILE",
        help="qemu: an image config to build the node's image from instead of the spec's guestImage "
        "(sizes come from the node)",
    )
    start.add_argument("-o", "--output", choices=("name", "json"), default="name")
    start.set_defaults(run=run_start)

    stop = inner.add_parser(
        "stop",
        help="stop a node and remove what it had on the host",
        description="Stop a node: its agent, containerd and pods end, and everything it had "
        "on the host is removed. The Node object stays and goes NotReady.",
    )
    _state_dir_argument(stop)
    stop.add_argument("name", help="the node's name (see `node list`)")
    stop.set_defaults(run=run_stop)

    listing = inner.add_parser(
        "list",
        help="the nodes running on this host",
        description="The nodes running on this host, started by any bidder.",
    )
    _state_dir_argument(listing)
    listing.add_argument("-o", "--output", choices=("table", "json"), default="table")
    listing.set_defaults(run=run_list)

    boot = inner.add_parser(
        "boot",
        help=argparse.SUPPRESS,
        description="Run a node's containerd and agent "
        "from DIR/node.json (what a bidder starts inside the node).",
    )
    boot.add_argument("--dir", required=True, type=Path)
    boot.add_argument("--sandbox", action="store_true", help="first mount what a sandbox node needs")
    boot.add_argument("--guest", action="store_true", help="run as a microVM's node (its control channel)")
    boot.set_defaults(run=run_boot)

    supervisor = inner.add_parser(
        "sandbox-supervisor",
        help=argparse.SUPPRESS,
        description="Supervise one sandbox node (started by the sandbox bidder).",
    )
    supervisor.add_argument("--dir", required=True, type=Path)
    supervisor.set_defaults(run=run_supervisor)

    qemu_supervisor = inner.add_parser(
        "qemu-supervisor",
        help=argparse.SUPPRESS,
        description="Supervise one microVM node (started by the qemu bidder).",
    )
    qemu_supervisor.add_argument("--dir", required=True, type=Path)
    qemu_supervisor.set_defaults(run=run_qemu_supervisor)


def _state_dir(args: argparse.Namespace) -> Path:
    from socialweb_computer.cli.main import CommandError

    if not args.state_dir:
        raise CommandError("no state directory: pass --state-dir or set SOCIALWEB_GATEWAY_STATE_DIR")
    path = Path(args.state_dir)
    if not path.is_dir():
        raise CommandError(f"{path} is not a gateway state directory (it does not exist)")
    return path


def _spec(args: argparse.Namespace) -> spec_mod.GatewaySpec:
    from socialweb_computer.cli.main import CommandError

    try:
        return spec_mod.load(args.spec)
    except (spec_mod.SpecError, OSError) as exc:
        raise CommandError(str(exc)) from None


def _size(args: argparse.Namespace, spec: spec_mod.GatewaySpec) -> node_config.Size:
    from socialweb_computer.cli.main import CommandError

    defaults = spec.node_defaults
    size = node_config.Size(
        vcpu=args.vcpu or defaults.vcpu,
        mem_mib=args.mem_mib or defaults.mem_mib,
        rootfs_mib=args.rootfs_mib or defaults.rootfs_mib,
    )
    if size.vcpu < 1 or size.mem_mib < 256 or size.rootfs_mib < 256:
        raise CommandError(f"a node needs at least 1 vCPU, 256 MiB of memory and 256 MiB of disk, not {size}")
    return size


def _image_progress() -> Any:
    from socialweb_computer.guest import store as image_store

    return image_store.Progress()


def run_start(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    state_dir = _state_dir(args)
    record = layout.StateLayout(str(state_dir)).read_cluster(args.cluster)
    if record is None:
        raise CommandError(f"no cluster {args.cluster!r} in {state_dir} (kubectl get clusters lists them)")
    spec = _spec(args)
    image = None
    if args.bidder == "qemu" and args.image_config:
        from socialweb_computer.guest import config as image_config

        try:
            image = image_config.load(args.image_config)
        except image_config.ImageConfigError as exc:
            raise CommandError(str(exc)) from None
    elif args.image_config:
        raise CommandError("--image-config is for the qemu bidder: sandbox nodes boot no image")
    try:
        bidder = bidding.make_bidder(
            args.bidder, state_dir, spec, host_ports=args.host_port, image=image, progress=_image_progress()
        )
    except spec_mod.SpecError as exc:
        raise CommandError(str(exc)) from None
    size = _size(args, spec)
    request = base.NodeRequest(cluster=args.cluster, server=record.url, size=size, name=args.name)
    try:
        handle = asyncio.run(bidder.start(request))
    except base.BidderError as exc:
        raise CommandError(str(exc)) from None
    if args.output == "json":
        print(orjson.dumps(handle.as_json()).decode())
    else:
        print(handle.name)
    return 0


def _find(state_dir: Path, name: str) -> base.NodeHandle | None:
    for kind in BIDDERS:
        for handle in base.read_records(state_dir, kind):
            if handle.name == name:
                return handle
    return None


def run_stop(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    state_dir = _state_dir(args)
    handle = _find(state_dir, args.name)
    if handle is None:
        raise CommandError(f"no node {args.name!r} on this host (socialweb-computer node list shows them)")
    asyncio.run(BIDDERS[handle.bidder](state_dir).stop(handle.name))
    print(f"node {handle.name} stopped")
    return 0


def run_list(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    handles = [h for kind, bidder in BIDDERS.items() for h in bidder(state_dir).nodes()]
    if args.output == "json":
        print(orjson.dumps([h.as_json() for h in handles]).decode())
        return 0
    print(f"{'NAME':<20} {'CLUSTER':<16} {'BIDDER':<8} SIZE")
    for h in handles:
        print(f"{h.name:<20} {h.cluster:<16} {h.bidder:<8} {base.size_label(h.size)}")
    return 0


def run_boot(args: argparse.Namespace) -> int:
    from socialweb_computer.node import boot

    if args.sandbox:
        sandbox.prepare_inside(args.dir)
    return boot.main(args.dir, guest=args.guest)


def run_qemu_supervisor(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return asyncio.run(qemu.supervise(args.dir))


def run_supervisor(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return asyncio.run(sandbox.supervise(args.dir))
