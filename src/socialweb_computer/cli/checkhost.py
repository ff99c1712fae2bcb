"""`socialweb-computer check-host`: say, before anything boots, whether this host can run the
gateway (role gateway) or its nodes (role node), one line per check with the fix.

The checks are the table in hostcheck.checks; docs/host-contract.md explains each one.
Exit status: 0 when every check passes, 1 when any fails, 2 for a usage error (an unknown
role, an unreadable or invalid spec): argparse's usage convention, kept apart from 1 so a
script can tell "this host is not ready" from "this command was called wrong".
Single-dash long flags (`-role gateway -state-dir DIR`) are accepted as well as `--role`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.hostcheck import checks, context

DESCRIPTION = """\
Check that this host can run the socialweb-computer gateway (-role gateway) or boot and run
its nodes (-role node), before anything is started. Prints one line per check:

  NAME  ok|FAIL  what was found  [fix: what to do]

Run it as the account that runs the gateway, with the same environment (TMPDIR, PATH,
limits), since that is what the checks look at. docs/host-contract.md explains every check."""

EPILOG_HEAD = """\
exit status: 0 every check passed, 1 at least one check failed, 2 usage error.

checks, in output order (roles):
"""


def _epilog() -> str:
    width = max(len(check.name) for check in checks.CHECKS)
    rows = [f"  {check.name:<{width}}  {', '.join(r for r in context.ROLES if r in check.roles)}"
            for check in checks.CHECKS]
    return EPILOG_HEAD + "\n".join(rows)


def _spec(path: str) -> spec_mod.GatewaySpec:
    try:
        return spec_mod.load(path)
    except spec_mod.SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    state_default = os.environ.get("SOCIALWEB_STATE_DIR") or None
    p = sub.add_parser("check-host", help="check that this host can run the gateway or its nodes",
                       description=DESCRIPTION, epilog=_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-role", "--role", required=True, choices=context.ROLES,
                   help="gateway: the host and account running the gateway (and booting its nodes); "
                        "node: a host that only boots and runs nodes")
    p.add_argument("-state-dir", "--state-dir", required=state_default is None, default=state_default,
                   metavar="DIR", help="the gateway's state directory (default: $SOCIALWEB_STATE_DIR)")
    p.add_argument("-spec", "--spec", type=_spec, default=os.environ.get("SOCIALWEB_GATEWAY_SPEC") or None,
                   metavar="FILE", help="the gateway spec, for its ports, clusters and node sizes "
                                        "(default: $SOCIALWEB_GATEWAY_SPEC, else the built-in defaults)")
    p.add_argument("-json", "--json", action="store_true",
                   help="print a JSON list of {name, ok, found, fix} instead of lines")
    p.set_defaults(run=run)


def render(results: list[checks.Result]) -> str:
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for r in results:
        line = f"{r.name:<{width}}  {'ok' if r.ok else 'FAIL':<4}  {r.found}"
        lines.append(line + (f"  fix: {r.fix}" if r.fix else ""))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    ctx = context.Context(role=args.role, state_dir=os.path.abspath(args.state_dir),
                          spec=args.spec or spec_mod.load(None))
    results = checks.run(ctx)
    failed = [r.name for r in results if not r.ok]
    if args.json:
        print(json.dumps([r.as_json() for r in results], indent=2))
    else:
        print(render(results), flush=True)
        summary = (f"{len(failed)} of {len(results)} checks failed: {', '.join(failed)}" if failed
                   else f"all {len(results)} checks passed")
        print(f"check-host (role {args.role}): {summary}", file=sys.stderr)
    return 1 if failed else 0
