"""Lets PySpark find ``format("meshmq")`` without a registration call.

PySpark (4.x, ``pyspark/sql/worker/lookup_data_sources.py``) imports every importable top-level
module whose name starts with ``pyspark_`` and registers its ``DefaultSource`` under
``DefaultSource.name()``. It uses ``pkgutil.iter_modules()``, i.e. ``sys.path`` directories: an
installed wheel is found; a setuptools *editable* install (served by an import hook) is not,
unless the checkout is on ``PYTHONPATH`` (see the README's "Spark" section).
"""

from spark_connector.source import MeshmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
