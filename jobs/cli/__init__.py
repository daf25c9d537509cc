"""The `tierq` command, one module per command group."""
