"""`socialweb-computer apiserver`: a development server for one logical cluster.

It keeps everything in one state directory: the SQLite store, a serving CA and a
ClientCA, and an admin kubeconfig (system:admin in system:masters). The same directory
serves again after a restart, with the same certificates and objects.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn, kubeconfig, pki
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
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(run=run)


def ensure_pki(state_dir: str) -> dict[str, str]:
    """Create (once) the serving CA, ClientCA, serving certificate and admin client certificate."""
    pki_dir = os.path.join(state_dir, "pki")
    os.makedirs(pki_dir, mode=0o700, exist_ok=True)
    paths = {name: os.path.join(pki_dir, name) for name in (
        "serving-ca.crt", "serving-ca.key", "client-ca.crt", "client-ca.key", "serving.crt", "serving.key",
        "admin.crt", "admin.key")}
    if not os.path.exists(paths["serving-ca.key"]):
        pki.new_ca("socialweb-computer serving CA").save(paths["serving-ca.crt"], paths["serving-ca.key"])
    if not os.path.exists(paths["client-ca.key"]):
        pki.new_ca("socialweb-computer client CA").save(paths["client-ca.crt"], paths["client-ca.key"])
    serving_ca = pki.KeyPair.load(paths["serving-ca.crt"], paths["serving-ca.key"])
    client_ca = pki.KeyPair.load(paths["client-ca.crt"], paths["client-ca.key"])
    if not os.path.exists(paths["serving.key"]):
        pki.new_serving_cert(serving_ca).save(paths["serving.crt"], paths["serving.key"])
    if not os.path.exists(paths["admin.key"]):
        pki.new_client_cert(client_ca, "system:admin", ("system:masters",)).save(paths["admin.crt"],
                                                                                  paths["admin.key"])
    return paths


async def serve(args: argparse.Namespace) -> None:
    state_dir = os.path.abspath(args.state_dir)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    paths = ensure_pki(state_dir)
    backend = await sqlite.SqliteBackend.open(os.path.join(state_dir, "state.db"),
                                              history_limit=args.history_limit,
                                              compact_interval=args.compact_interval)
    cluster = LogicalCluster(CLUSTER_NAME, backend)
    await cluster.start()
    # Everything loaded so far (schemas, tables, bootstrap objects) lives as long as the process:
    # keeping it out of the cyclic collector's full passes removes 15-40 ms pauses (bench/README.md).
    gc.collect()
    gc.freeze()
    context = app_mod.server_ssl_context(paths["serving.crt"], paths["serving.key"], paths["client-ca.crt"])
    authenticator = authn.ClientCertAuthenticator.from_pem_file(paths["client-ca.crt"])
    runner, port = await app_mod.serve(app_mod.build_app(cluster, authenticator=authenticator),
                                       host=args.host, port=args.port, ssl_context=context)
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"https://{host}:{port}"
    kubeconfig_path = os.path.join(state_dir, "admin.kubeconfig")
    with open(paths["serving-ca.crt"], "rb") as ca, open(paths["admin.crt"], "rb") as crt, \
            open(paths["admin.key"], "rb") as key:
        kubeconfig.write(kubeconfig_path, cluster="socialweb-computer", server=url, ca_pem=ca.read(),
                         user="system:admin", cert_pem=crt.read(), key_pem=key.read())
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
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
