"""`socialweb-computer gateway`: run the whole host (admin plane, tenant clusters, HTTP API).

It runs in the foreground until SIGTERM or SIGINT; the systemd user unit written by
`install gateway` runs exactly this command. `--state-dir` and `--spec` fall back to
$SOCIALWEB_GATEWAY_STATE_DIR and $SOCIALWEB_GATEWAY_SPEC so a unit's EnvironmentFile can
carry them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import signal

from socialweb_computer import logs
from socialweb_computer.gateway import runtime
from socialweb_computer.gateway import spec as spec_mod

STATE_DIR_ENV = "SOCIALWEB_GATEWAY_STATE_DIR"
SPEC_ENV = "SOCIALWEB_GATEWAY_SPEC"
LOG_LEVEL_ENV = "SOCIALWEB_LOG_LEVEL"
LOG_FORMAT_ENV = "SOCIALWEB_LOG_FORMAT"
WORKERS_ENV = "SOCIALWEB_GATEWAY_WORKERS"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "gateway",
        help="run the gateway: admin plane, tenant clusters and the HTTP API, on loopback",
        description="Run the gateway in the foreground: the admin plane (Cluster objects), one loopback "
        "TLS listener per tenant cluster, and the HTTP API (/api/config, /healthz, /readyz). "
        "It writes gateway.json (naming the admin kubeconfig) in the state directory once "
        "everything listens. Every listener binds loopback; see docs/gateway.md.",
    )
    p.add_argument(
        "--state-dir",
        default=os.environ.get(STATE_DIR_ENV),
        help=f"directory for the store, CAs and kubeconfigs (or ${STATE_DIR_ENV}); put it on real "
        "disk, not a tmpfs",
    )
    p.add_argument(
        "--spec",
        default=os.environ.get(SPEC_ENV),
        help=f"YAML gateway spec: clusters to ensure, listen ports, node defaults (or ${SPEC_ENV}); "
        "without it, the defaults and no cluster",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get(LOG_LEVEL_ENV) or None,
        choices=logs.LEVELS,
        help=f"DEBUG, INFO, WARNING or ERROR (or ${LOG_LEVEL_ENV}, or the spec's logging.level; "
        "default INFO)",
    )
    p.add_argument(
        "--log-format",
        default=os.environ.get(LOG_FORMAT_ENV) or None,
        choices=logs.FORMATS,
        help=f"text (one line per event) or json (one object per line, for journald/Loki) (or "
        f"${LOG_FORMAT_ENV}, or the spec's logging.format; default text)",
    )
    p.add_argument(
        "--workers",
        default=os.environ.get(WORKERS_ENV) or None,
        metavar="N|auto",
        help=f"processes serving the tenant clusters (or ${WORKERS_ENV}, or the spec's workers; default "
        f"{spec_mod.DEFAULT_WORKERS}): 1 serves them in the gateway's own process, auto one per core",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    if not args.state_dir:
        raise CommandError(
            f"no state directory: pass --state-dir DIR (or set ${STATE_DIR_ENV}); it holds the "
            "store, the CAs and the kubeconfigs, so put it on real disk"
        )
    try:
        spec = spec_mod.load(args.spec)
    except spec_mod.SpecError as e:
        raise CommandError(str(e)) from None
    if args.workers is not None:
        try:
            wanted: object = args.workers if args.workers == "auto" else int(args.workers)
            spec = dataclasses.replace(spec, workers=spec_mod.parse_workers(wanted, "--workers"))
        except (ValueError, spec_mod.SpecError) as e:
            raise CommandError(f"{e}" if isinstance(e, spec_mod.SpecError) else
                               f"--workers (or ${WORKERS_ENV}): expected auto or a number, got "
                               f"{args.workers!r}") from None
    level = args.log_level or spec.log_level or "INFO"
    fmt = args.log_format or spec.log_format or "text"
    if level not in logs.LEVELS or fmt not in logs.FORMATS:  # from the environment: argparse did not check
        raise CommandError(
            f"${LOG_LEVEL_ENV}={level!r} / ${LOG_FORMAT_ENV}={fmt!r}: the level is one of "
            f"{', '.join(logs.LEVELS)}, the format one of {', '.join(logs.FORMATS)}")
    logs.configure(level, fmt)
    try:
        asyncio.run(_serve(runtime.Gateway(args.state_dir, spec)))
    except runtime.StartError as e:
        raise CommandError(str(e)) from None
    except OSError as e:
        raise CommandError(
            f"the gateway cannot start: {e.strerror or e}"
            f"{' (' + str(e.filename) + ')' if e.filename else ''}. Check that the state "
            "directory is on a writable disk with free space (check-host tells)."
        ) from None
    return 0


async def _serve(gateway: runtime.Gateway) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await gateway.start()
        # Everything loaded at start lives as long as the process: keep it out of the collector's full passes.
        gc.collect()
        gc.freeze()
        print(
            f"socialweb-computer gateway: admin plane {gateway.admin_url}, API {gateway.api_url}", flush=True
        )
        print(f"gateway.json: {gateway.state.gateway_json}", flush=True)
        print(f"admin kubeconfig: {gateway.state.admin_kubeconfig}", flush=True)
        stopped, failed = asyncio.create_task(stop.wait()), asyncio.create_task(gateway.failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        failed.cancel()
    finally:
        await gateway.close()
    if gateway.failed.is_set():
        raise runtime.StartError(gateway.failure)
