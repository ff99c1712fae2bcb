"""Who may do what: certificate authorities and client certificates (`pki`, `kubeconfig`),
client-certificate authentication (`authn`, `identity`), impersonation, request attributes,
and RBAC with its bootstrap policy, aggregation, escalation checks and the per-cluster state
that ties them together (`policy.ClusterPolicy`). See docs/auth.md."""
