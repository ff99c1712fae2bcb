"""The gateway: one process that turns this host into a provider of tenant clusters.

    spec.py        the operator's YAML spec (clusters to ensure, listen ports, node defaults)
    runtime.py     Gateway: store, admin plane, Cluster controller, HTTP API, gateway.json
    resource.py    the Cluster CRD of the admin plane and its status helpers
    controller.py  Cluster objects → running tenant control planes (and back)
    tenants.py     one tenant: a LogicalCluster behind its own loopback TLS listener
    httpapi.py     the dashboard, /api/config, /api/overview(/stream), /metrics, /healthz, /readyz
    observer.py    per-tenant rows of nodes and pods, the event ring, change notification
    overview.py    the /api/overview document (dashboard, `status`)
    metrics.py     the host's /metrics
    capacityview.py  what the capacity controller registers to be shown (a Protocol)
    dashboard/     the page, its script and style, served as they are

It builds on `apiserver` (logical clusters, listeners), `controllers` (work queue) and
`clusterprovider` (the state directory's files); the CLI (`cli/gateway.py`) runs it.
docs/gateway.md is the operator's reference; docs/observability.md covers the view.
"""
