"""`socialweb-computer status`: the dashboard's summary in a terminal, or as JSON for scripts.

It reads the running gateway's `GET /api/overview` (gateway/overview.py), found through
`gateway.json` in the state directory, or at `--api URL`. It changes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from socialweb_computer.cli import gateway as gateway_cli

DEFAULT_API = "http://127.0.0.1:8788"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "status", help="summarize the running gateway: clusters, nodes, pending pods, events",
        description="Print what the dashboard shows: clusters (phase, URL, nodes, pods by phase), nodes, "
                    "pending pods and why they wait, capacity, recent events. Reads the running "
                    "gateway's /api/overview, found through gateway.json in the state directory.")
    p.add_argument("--state-dir", default=os.environ.get(gateway_cli.STATE_DIR_ENV),
                   help=f"the gateway's state directory (or ${gateway_cli.STATE_DIR_ENV}); its gateway.json "
                        "names the HTTP API")
    p.add_argument("--api",
                   help=f"the gateway's HTTP API instead (default: from gateway.json, else {DEFAULT_API})")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text",
                   help="text (tables) or json (the /api/overview document)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    api = (args.api or _api_from_state(args.state_dir) or DEFAULT_API).rstrip("/")
    try:
        with urllib.request.urlopen(f"{api}/api/overview", timeout=10) as response:
            document = json.loads(response.read())
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(
            f"cannot read the gateway's status at {api}/api/overview: {reason}. Is the gateway running? "
            "(systemctl --user status socialweb-computer-gateway.service); pass --state-dir DIR or "
            "--api URL if it runs elsewhere") from None
    if args.output == "json":
        print(json.dumps(document, indent=2))
    else:
        sys.stdout.write(render(document))
    return 0


def _api_from_state(state_dir: str | None) -> str:
    if not state_dir:
        return ""
    from socialweb_computer.cli.main import CommandError

    path = Path(state_dir) / "gateway.json"
    try:
        return str(json.loads(path.read_text())["apiURL"])
    except (OSError, ValueError, KeyError) as e:
        raise CommandError(
            f"cannot read {path}: {getattr(e, 'strerror', None) or e}. The gateway writes it once it "
            "listens: is it running with this --state-dir?") from None


# ---------------------------------------------------------------------- text


def render(doc: dict[str, Any], *, now: datetime.datetime | None = None) -> str:
    moment = now or datetime.datetime.now(datetime.UTC)
    out: list[str] = []
    gateway, store = doc.get("gateway", {}), doc.get("store")
    line = f"gateway {gateway.get('version', '?')} at {gateway.get('apiURL', '?')}"
    line += " (ready)" if gateway.get("ready") else " (not ready)"
    if store:
        line += (f", store {store['backend']} {_bytes(store['sizeBytes'])} at revision {store['revision']}, "
                 f"{store['watches']} watches")
    out += [line, ""]
    out += _section("CLUSTERS", ["NAME", "PHASE", "URL", "NODES", "PODS"],
                    [[c["name"], c["phase"] or "-", c["url"] or "-", str(c["nodes"]), _pods(c["pods"])]
                     for c in doc.get("clusters", [])], "no clusters")
    out += _section("NODES", ["CLUSTER", "NAME", "READY", "BIDDER", "SIZE", "IMAGE", "AGE", "PODS"],
                    [[n["cluster"], n["name"], n["ready"] + (",cordoned" if n.get("unschedulable") else ""),
                      n["bidder"] or "-", n.get("size") or "-", n["image"] or "-",
                      _age(n["created"], moment), str(len(n["pods"]))] for n in doc.get("nodes", [])],
                    "no nodes")
    pending = doc.get("pending", [])
    out += _section("PENDING PODS", ["CLUSTER", "POD", "AGE", "WHY"],
                    [[p["cluster"], f"{p['namespace']}/{p['name']}", _age(p["created"], moment), p["reason"]]
                     for p in pending], "no pod is waiting")
    if doc.get("pendingTotal", len(pending)) > len(pending):
        out.insert(-1, f"({doc['pendingTotal'] - len(pending)} more)")
    out += _capacity(doc.get("capacity"), moment)
    events = doc.get("events", [])[:10]
    out += _section("RECENT EVENTS", ["AGE", "CLUSTER", "TYPE", "REASON", "OBJECT", "MESSAGE"],
                    [[_age(e["time"], moment), e["cluster"], e["type"], e["reason"], e["object"],
                      e["message"]] for e in events], "no events")
    return "\n".join(out).rstrip() + "\n"


def _capacity(capacity: dict[str, Any] | None, moment: datetime.datetime) -> list[str]:
    if capacity is None:
        return ["CAPACITY", "no capacity controller: nodes are not rented, no host budget or warm pool yet",
                ""]
    lines = ["CAPACITY"]
    if "bidder" in capacity:
        bidder = capacity["bidder"]
        lines.append(f"bidder: {bidder}" if bidder not in ("", "none") else
                     "bidder: none (capacity.bidder in the gateway spec): no node is rented")
    for b in capacity["budget"]:
        lines.append(f"{b['resource']}: {b['used']:g} of {b['total']:g} {b['unit']} used, {b['free']:g} free")
    lines.append(f"warm pool: {capacity['warmPool']['size']} of {capacity['warmPool']['target']}")
    lines.append("")
    return lines + _section("RENTED NODES", ["NAME", "CLUSTER", "BIDDER", "STATE", "SIZE", "SINCE", "WHY"],
                            [[n["name"], n["cluster"] or "(warm)", n["bidder"], n["state"],
                              f"{n['vcpu']} vCPU/{n['memMiB']} MiB", _age(n["since"], moment), n["reason"]]
                             for n in capacity["nodes"]], "no rented nodes")


def _section(title: str, header: list[str], rows: list[list[str]], empty: str) -> list[str]:
    if not rows:
        return [title, empty, ""]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [title]
    for row in [header, *rows]:
        lines.append("   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return [*lines, ""]


def _pods(pods: dict[str, int]) -> str:
    parts = [f"{n} {phase}" for phase, n in pods.items() if n]
    return ", ".join(parts) if parts else "none"


def _age(stamp: str, moment: datetime.datetime) -> str:
    try:
        then = datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return "-"
    seconds = max(int((moment - then).total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _bytes(n: int) -> str:
    if n < 0:
        return "(size unknown)"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}" if unit != "B" else f"{n} B"
