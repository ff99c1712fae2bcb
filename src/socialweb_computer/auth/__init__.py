"""Authentication material and identity: certificate authorities, client certificates,
kubeconfigs, and (in a later issue) authorization."""
