"""meshmq's fault-injection suite with a history checker (issue 23): ``python -m tests.chaos``
for long runs, ``tests/chaos/test_*.py`` for CI. See tests/README.md, "Chaos runs"."""
