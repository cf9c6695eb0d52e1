"""Runnable examples of the Spark connector (see the README's "Spark" section)."""
