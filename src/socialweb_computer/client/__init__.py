"""A client for the project's own Kubernetes API, used by components that live outside the
API server (the node agent): they see a cluster only through its public API."""
