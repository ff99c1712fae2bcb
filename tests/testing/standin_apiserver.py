"""A stand-in for `socialweb-computer apiserver`, used to prove ApiServerProcess without the real server.

It speaks the same contract: `apiserver --state-dir DIR --port PORT`, serves HTTPS with client
certificates required on 127.0.0.1, writes DIR/admin.kubeconfig with embedded credentials,
prints the kubeconfig path, and answers GET /readyz.  Flags make it misbehave in the ways the
helper must survive: slow to write the kubeconfig, slow to become ready, exiting early,
never ready, ignoring SIGTERM, leaving a child process behind.  Launched by
tests/testing/test_apiserver_process.py as `python standin_apiserver.py apiserver ...`.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from socialweb_computer.testing import pki


def main() -> None:
    args = _parse()
    state_dir = Path(args.state_dir)
    (state_dir / "standin.pid").write_text(str(os.getpid()))
    if args.exit_early is not None:
        print("standin: boom, refusing to start", file=sys.stderr, flush=True)
        sys.exit(args.exit_early)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else _exit_cleanly)
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (state_dir / "standin-child.pid").write_text(str(child.pid))

    credentials = pki.generate(state_dir / "standin-pki")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args, time.monotonic()))
    server.socket = credentials.server_ssl_context().wrap_socket(
        server.socket, server_side=True, do_handshake_on_connect=False)
    port = server.server_address[1]

    time.sleep(args.kubeconfig_delay)
    kubeconfig = state_dir / "admin.kubeconfig"
    text = yaml.safe_dump(credentials.kubeconfig(f"https://127.0.0.1:{port}"))
    _write_slowly(kubeconfig, text, pause=args.kubeconfig_delay)
    print(f"standin: wrote {kubeconfig}", flush=True)
    server.serve_forever(poll_interval=0.05)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["apiserver"])
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig-delay", type=float, default=0.0)
    parser.add_argument("--ready-after", type=float, default=0.0)
    parser.add_argument("--never-ready", action="store_true")
    parser.add_argument("--exit-early", type=int)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    return parser.parse_args()


def _exit_cleanly(signum: int, frame: object) -> None:
    sys.exit(0)


def _write_slowly(path: Path, text: str, *, pause: float) -> None:
    # Half a file first: the helper must treat a partly written kubeconfig as "not yet".
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text[: len(text) // 2])
        handle.flush()
        time.sleep(pause)
        handle.write(text[len(text) // 2:])


def _handler(args: argparse.Namespace, started: float) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/readyz":
                ready = not args.never_ready and time.monotonic() - started >= args.ready_after
                self._reply(200 if ready else 500, b"ok" if ready else b"[-]standin not ready yet")
            elif self.path == "/whoami":
                subject = dict(item[0] for item in self.connection.getpeercert()["subject"])
                self._reply(200, json.dumps({"commonName": subject["commonName"],
                                             "home": os.environ.get("HOME", "")}).encode())
            else:
                self._reply(404, b"404 page not found")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *log_args: object) -> None:
            print("standin:", format % log_args, file=sys.stderr, flush=True)

    return Handler


if __name__ == "__main__":
    main()
