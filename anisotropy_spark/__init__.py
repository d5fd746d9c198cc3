"""Spark-facing library of the anisotropy pipeline (the README's layout table summarises its modules).

Imported inside a Spark task, which happens when a task unpickles one of this package's partition functions, it
removes a per-task start-up cost of the Python workers on CPython 3.10 and 3.11 (:mod:`.python_worker`).
"""

from .python_worker import install_in_python_worker

install_in_python_worker()
