"""The `socialweb-computer` command: one module per command group."""
