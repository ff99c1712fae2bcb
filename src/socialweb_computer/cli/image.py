"""`socialweb-computer image ...`: the guest images microVM nodes boot.

    image build  [-config FILE] [-vcpu N -mem-mib N -rootfs-mib N] [-force] [-refresh] [-json]
    image ensure [-config FILE] [...sizes] [-json]
    image list   [-json]
    image prune  [-keep FINGERPRINT ...] [-json]

`build` and `ensure` print progress on stderr (a bar on a terminal, plain lines otherwise)
and, with `-json`, end with one JSON line on stdout: state (`present`, `built` or `reused`),
fingerprint, dir, kernel, initramfs, rootfs, rootfsMiB (and vcpu, memMiB). `ensure` is what a
bidder runs before a boot; `build -force` rebuilds an image that is present, and `-refresh`
first fetches the Debian archive's newest packages. `prune` removes the images no running node
uses. Single-dash long flags are accepted as well as `--`, as in check-host.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from socialweb_computer.guest import build as build_mod
from socialweb_computer.guest import config as config_mod
from socialweb_computer.guest import store as store_mod
from socialweb_computer.hostcheck import statedir

DESCRIPTION = """\
Build, ensure and prune the guest images that microVM nodes (the qemu bidder) boot. An image
is a Debian kernel, a small initramfs and an ext4 root filesystem holding containerd, runc,
the CNI plugins and the node agent (this program's single-file binary). Its manifest records
vcpu, memMiB and rootfsMiB: changing any of them, or any other input, builds a new image,
stored under <state dir>/images/<fingerprint>. See docs/node.md."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-state-dir",
        "--state-dir",
        default=os.environ.get("SOCIALWEB_GATEWAY_STATE_DIR"),
        metavar="DIR",
        help="the gateway's state directory (default: $SOCIALWEB_GATEWAY_STATE_DIR)",
    )
    parser.add_argument("-json", "--json", action="store_true", help="end with one JSON line on stdout")


def _config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-config", "--config", metavar="FILE", help="the image config (YAML; see docs/node.md)"
    )
    parser.add_argument("-vcpu", "--vcpu", type=int, help="vCPUs (overrides the config)")
    parser.add_argument("-mem-mib", "--mem-mib", type=int, help="memory in MiB (overrides the config)")
    parser.add_argument("-rootfs-mib", "--rootfs-mib", type=int, help="root filesystem in MiB (overrides)")
    parser.add_argument(
        "-agent",
        "--agent",
        metavar="BINARY",
        help="the node agent binary (default: this program when it is the single-file "
        "binary, else the checkout's dist/socialweb-computer)",
    )
    parser.add_argument(
        "-cache-dir",
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where downloaded Debian packages are kept",
    )
    parser.add_argument("-quiet", "--quiet", action="store_true", help="no progress")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "image",
        help="build, ensure and prune the guest images of microVM nodes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inner = p.add_subparsers(dest="image_command", metavar="OPERATION")
    inner.required = True

    build = inner.add_parser(
        "build",
        help="build the image of a config (nothing when it is present)",
        description="Build the guest image of a config, unless it is present.",
    )
    _common(build)
    _config_flags(build)
    build.add_argument("-force", "--force", action="store_true", help="rebuild even when present")
    build.add_argument(
        "-refresh",
        "--refresh",
        action="store_true",
        help="fetch the newest packages from the Debian archive first",
    )
    build.set_defaults(run=run_build)

    ensure = inner.add_parser(
        "ensure",
        help="make sure the image of a config exists (what a boot does)",
        description="Make sure the guest image of a config exists: `present` when "
        "it does (well under a second), else built.",
    )
    _common(ensure)
    _config_flags(ensure)
    ensure.set_defaults(run=run_build, force=False, refresh=False)

    listing = inner.add_parser("list", help="the images in the state directory")
    _common(listing)
    listing.set_defaults(run=run_list)

    prune = inner.add_parser(
        "prune",
        help="remove the images no running node uses",
        description="Remove the guest images that no running node on this host uses.",
    )
    _common(prune)
    prune.add_argument(
        "-keep",
        "--keep",
        action="append",
        default=[],
        metavar="FINGERPRINT",
        help="an image to keep although unused (repeatable)",
    )
    prune.set_defaults(run=run_prune)


def _state_dir(args: argparse.Namespace) -> Path:
    from socialweb_computer.cli.main import CommandError

    if not args.state_dir:
        raise CommandError("no state directory: pass -state-dir or set SOCIALWEB_GATEWAY_STATE_DIR")
    return Path(args.state_dir)


def _config(args: argparse.Namespace) -> config_mod.ImageConfig:
    from socialweb_computer.cli.main import CommandError

    try:
        config = config_mod.load(args.config)
    except config_mod.ImageConfigError as exc:
        raise CommandError(str(exc)) from None
    sizes = {"vcpu": args.vcpu, "mem_mib": args.mem_mib, "rootfs_mib": args.rootfs_mib}
    minimum = {"vcpu": 1, "mem_mib": config_mod.MIN_MEM_MIB, "rootfs_mib": config_mod.MIN_ROOTFS_MIB}
    for field, value in sizes.items():
        if value is not None and value < minimum[field]:
            raise CommandError(f"-{field.replace('_', '-')} must be at least {minimum[field]}, not {value}")
    config = config.with_size(
        vcpu=args.vcpu or config.vcpu,
        mem_mib=args.mem_mib or config.mem_mib,
        rootfs_mib=args.rootfs_mib or config.rootfs_mib,
    )
    if args.agent:
        config = config_mod.ImageConfig(**{**config.__dict__, "agent": Path(args.agent).resolve()})
    return config


def run_build(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    state_dir = _state_dir(args)
    config = _config(args)
    store = store_mod.Store(state_dir, cache_dir=args.cache_dir)
    progress = store_mod.Progress(quiet=args.quiet)
    try:
        image, state = store.ensure(config, progress=progress, force=args.force, refresh=args.refresh)
    except (config_mod.ImageConfigError, statedir.StateDirRefused, build_mod.BuildError) as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot build the image in {store.root}: {exc}") from None
    progress.done(
        f"{state} {image.fingerprint} ({image.vcpu} vCPU, {image.mem_mib} MiB, "
        f"rootfs {image.rootfs_mib} MiB) in {image.directory}"
    )
    if args.json:
        print(orjson.dumps(image.as_json(state)).decode())
    return 0


def run_list(args: argparse.Namespace) -> int:
    store = store_mod.Store(_state_dir(args))
    images = store.images()
    used = _in_use(store.state_dir)
    if args.json:
        print(
            orjson.dumps([{**i.as_json("present"), "inUse": i.fingerprint in used} for i in images]).decode()
        )
        return 0
    print(f"{'FINGERPRINT':<24} {'VCPU':>4} {'MEMMIB':>7} {'ROOTFSMIB':>9} {'KERNEL':<18} IN USE")
    for image in images:
        print(
            f"{image.fingerprint[:23]:<24} {image.vcpu:>4} {image.mem_mib:>7} {image.rootfs_mib:>9} "
            f"{image.manifest.get('kernelVersion', ''):<18} {'yes' if image.fingerprint in used else 'no'}"
        )
    return 0


def _in_use(state_dir: Path) -> set[str]:
    from socialweb_computer.bidders import base, qemu  # here: they bring the apiserver's client side

    return {h.image for h in qemu.QemuBidder(state_dir).nodes() if h.image} | {
        h.image for h in base.read_records(state_dir, qemu.KIND) if h.image
    }


def run_prune(args: argparse.Namespace) -> int:
    store = store_mod.Store(_state_dir(args))
    removed = store.prune(_in_use(store.state_dir), keep=set(args.keep))
    if args.json:
        print(orjson.dumps([{"fingerprint": f, "bytes": size} for f, size in removed]).decode())
        return 0
    for fingerprint, size in removed:
        print(f"removed {fingerprint} ({size >> 20} MiB)")
    if not removed:
        print("nothing to prune", file=sys.stderr)
    return 0
