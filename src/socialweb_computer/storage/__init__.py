"""Storage: the narrow, consumer-owned interface every backend implements.

The API engine stores objects as bytes under string keys. `base.Backend` is the
contract; `sqlite.SqliteBackend` is the embedded default. `docs/storage.md` explains the
revision semantics once.
"""
