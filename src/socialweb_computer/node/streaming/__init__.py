"""The agent's half of exec, attach and port-forward: from the apiserver to containerd's streaming server.

containerd's CRI streaming server (the kubelet's streaming library) already speaks SPDY/3.1
(v4, v3, v2, v1) and WebSocket v4 for remote commands, and SPDY for port-forward; so for
those the agent asks CRI for a single-use URL and passes the connection through as bytes
(`relay`). Two protocols real clients prefer are missing there, and the agent serves them
itself (`translate`):

- WebSocket `v5.channel.k8s.io` (kubectl's first choice for exec and attach): served here
  and carried to containerd over SPDY v4, stream by stream, so that closing stdin still
  works (v5's close signal becomes a half-close of the SPDY stdin stream);
- WebSocket `SPDY/3.1+portforward.k8s.io` (kubectl's port-forward since 1.31): SPDY bytes
  tunneled in WebSocket messages, unwrapped here onto a SPDY connection to containerd.

So kubectl's default mode succeeds on its first upgrade, with no failed attempt and no
fallback round trip.
"""
