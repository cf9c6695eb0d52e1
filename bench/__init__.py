"""meshmq benchmark: ``python -m bench --help``."""
