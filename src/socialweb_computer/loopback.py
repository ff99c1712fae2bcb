"""The one listening rule: loopback only (127.0.0.1, ::1 or localhost), and the error that says why.

A leaf module, so that what only reads configuration (the gateway spec, check-host, `image`)
can apply the rule without importing the API server.
"""

from __future__ import annotations

import ipaddress


class LoopbackOnlyError(ValueError):
    pass


def require_loopback(host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise LoopbackOnlyError(
            f"refusing to listen on {host}: socialweb-computer binds loopback only (127.0.0.1 or ::1). "
            "The tenant apiserver is reachable only from this host on purpose; publishing it is a "
            "deliberate trust-boundary change (an authenticated front), not a listen address."
        )
