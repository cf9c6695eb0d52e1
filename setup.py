"""Build of the optional C fast paths: the commit log's (``commitlog/_speedups.c``), the MQTT
codec's (``broker/protocol/_speedups.c``) and the mesh entry codec's (``cluster/_speedups.c``).

Everything else is in pyproject.toml. Both extensions are optional: if one cannot be built
(no compiler, no Python or zlib headers) the install still succeeds and that part runs its
pure-Python code (``commitlog.record.SPEEDUPS`` / ``broker.protocol.codec.SPEEDUPS`` /
``cluster.frames.SPEEDUPS`` is then False).
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
        ),
        Extension(
            "broker.protocol._speedups",
            sources=["broker/protocol/_speedups.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "cluster._speedups",
            sources=["cluster/_speedups.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
)
