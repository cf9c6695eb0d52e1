"""Build of the optional C fast path of the commit log (``commitlog/_speedups.c``).

Everything else is in pyproject.toml. The extension is optional: if it cannot be built
(no compiler, no Python or zlib headers) the install still succeeds and the commit log
runs its pure-Python code (``commitlog.record.SPEEDUPS`` is then False).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "commitlog._speedups",
            sources=["commitlog/_speedups.c"],
            libraries=["z"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
)
