"""meshmq: the node entry package (CLI, config, logging, metrics, admin HTTP, node assembly)."""

__version__ = "0.1.0"
