"""The node agent: the kubelet of socialweb-computer.

It runs beside one containerd, talks to exactly one tenant cluster through that cluster's
public API with a node credential (like a kubelet), and runs the Pods bound to its Node
through containerd's CRI. It imports nothing of the API server: see docs/node.md.
"""
