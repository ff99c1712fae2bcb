"""`socialweb-computer apiserver`: a development server for one logical cluster.

It keeps everything in one state directory: the SQLite store, a serving CA and a
ClientCA, and an admin kubeconfig (system:admin in system:masters). The same directory
serves again after a restart, with the same certificates and objects. With
--etcd-servers (kube-apiserver's flag names) the objects live in etcd instead, under
--etcd-prefix, which this process claims while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal

from socialweb_computer import logs
from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn
from socialweb_computer.clusterprovider import layout
from socialweb_computer.controllers import endpoints
from socialweb_computer.storage import base as storage
from socialweb_computer.storage import sqlite

DEFAULT_PORT = 6443
CLUSTER_NAME = "default"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "apiserver", help="serve one Kubernetes API (logical cluster) over HTTPS on loopback",
        description="Serve one logical cluster over HTTPS on loopback, with state (SQLite, CAs, admin "
                    "kubeconfig) in --state-dir. Prints how to reach it with kubectl.")
    p.add_argument("--state-dir", default=os.environ.get("SOCIALWEB_STATE_DIR", "state"),
                   help="directory for the database, CAs and admin.kubeconfig (default: ./state, "
                        "or $SOCIALWEB_STATE_DIR)")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (127.0.0.1 or ::1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to bind, 0 picks a free one "
                   f"(default: {DEFAULT_PORT})")
    p.add_argument("--history-limit", type=int, default=sqlite.DEFAULT_HISTORY_LIMIT,
                   help="revisions of watch history kept before compaction (default: %(default)s)")
    p.add_argument("--compact-interval", type=float, default=sqlite.DEFAULT_COMPACT_INTERVAL,
                   help="seconds between compactions, 0 disables (default: %(default)s)")
    p.add_argument("--etcd-servers", default="",
                   help="comma-separated etcd client URLs: keep the objects in etcd instead of SQLite")
    p.add_argument("--etcd-prefix", default="/socialweb-computer",
                   help="etcd key prefix for this server's objects (default: %(default)s)")
    p.add_argument("--etcd-cafile", default=None, help="CA that signed the etcd members' certificates")
    p.add_argument("--etcd-certfile", default=None, help="client certificate for etcd")
    p.add_argument("--etcd-keyfile", default=None, help="key of --etcd-certfile")
    p.add_argument("--log-level", default="INFO", choices=logs.LEVELS)
    p.add_argument("--log-format", default="text", choices=logs.FORMATS,
                   help="text (one line per event) or json (one object per line)")
    p.set_defaults(run=run)


async def open_store(args: argparse.Namespace, state_dir: str) -> storage.Backend:
    if not args.etcd_servers:
        return await sqlite.SqliteBackend.open(os.path.join(state_dir, "state.db"),
                                               history_limit=args.history_limit,
                                               compact_interval=args.compact_interval)
    from socialweb_computer.cli.main import CommandError
    from socialweb_computer.storage import etcd

    try:
        backend = await etcd.EtcdBackend.open(
            [url.strip() for url in args.etcd_servers.split(",") if url.strip()], prefix=args.etcd_prefix,
            ca_file=args.etcd_cafile, cert_file=args.etcd_certfile, key_file=args.etcd_keyfile,
            history_limit=args.history_limit, compact_interval=args.compact_interval)
    except (etcd.ConfigError, storage.StorageError) as e:
        raise CommandError(f"--etcd-servers: {e}") from None
    try:
        await backend.claim_ownership(etcd.process_record("apiserver", state_dir),
                                      is_stale=etcd.process_is_gone)
    except storage.StorageError as e:
        await backend.close()
        raise CommandError(f"{e}; stop it, or choose another --etcd-prefix") from None
    return backend


async def serve(args: argparse.Namespace) -> None:
    state_dir = os.path.abspath(args.state_dir)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    plane = layout.PlanePki(os.path.join(state_dir, "pki"))
    plane.ensure()
    backend = await open_store(args, state_dir)
    cluster = LogicalCluster(CLUSTER_NAME, backend, keys=plane.token_keys(),
                             root_ca_pem=plane.serving_ca_pem(),
                             client_ca=(plane.client_ca, plane.client_ca_key))
    await cluster.start()
    # Everything loaded so far (schemas, tables, bootstrap objects) lives as long as the process:
    # keeping it out of the cyclic collector's full passes removed 15-40 ms pauses from list and watch tails.
    gc.collect()
    gc.freeze()
    context = app_mod.server_ssl_context(plane.serving_cert, plane.serving_key, plane.client_ca)
    authenticator = authn.ClientCertAuthenticator.from_pem_file(plane.client_ca)
    runner, port = await app_mod.serve(app_mod.build_app(cluster, authenticator=authenticator),
                                       host=args.host, port=args.port, ssl_context=context)
    url = f"https://{app_mod.url_host(args.host)}:{port}"
    cluster.tokens.issuer = url  # ServiceAccount tokens name the URL that serves their keys
    await endpoints.publish_apiserver(cluster.store, app_mod.loopback_ip(args.host), port)
    kubeconfig_path = os.path.join(state_dir, "admin.kubeconfig")
    plane.write_admin_kubeconfig(kubeconfig_path, context="socialweb-computer", server=url)
    print(f"socialweb-computer apiserver serving {url}", flush=True)
    print(f"admin kubeconfig: {kubeconfig_path}", flush=True)
    print(f"try: kubectl --kubeconfig {kubeconfig_path} get namespaces", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await cluster.close()
        await backend.close()


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level, args.log_format)
    from socialweb_computer.cli.main import CommandError

    try:
        app_mod.require_loopback(args.host)
    except app_mod.LoopbackOnlyError as e:
        raise CommandError(str(e)) from None
    try:
        asyncio.run(serve(args))
    except OSError as e:
        raise CommandError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}. Choose another "
                           "--port, or stop whatever holds it.") from None
    return 0
