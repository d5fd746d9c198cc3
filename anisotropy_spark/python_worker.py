"""A per-task cost of PySpark's reused Python workers on CPython 3.10 and 3.11, removed inside the workers.

Before every task, a worker calls ``importlib.invalidate_caches()`` (pyspark 4.0's
``worker_util.setup_spark_files``). On CPython 3.10 and 3.11 that makes every ``zipimporter`` in
``sys.path_importer_cache`` re-read its archive's whole central directory, in pure Python. CPython 3.12 makes the
re-read lazy (gh-103200), and Spark calls it only when a task adds files (SPARK-54744, after 4.0).

A worker holds 16 such importers: pyspark.zip, py4j's zip and spark-core's jar (5,261 entries), all on the
PYTHONPATH Spark gives its workers, and one per package imported from them, so the cost is paid again before
every task, in proportion to the archives' sizes and not to the task's work; in a pass of a few dozen tasks it
was a large share of the Python workers' CPU (docs/design.md, timings in bench/RESULTS.md).

:func:`reread_zip_archives_only_when_changed` makes ``zipimporter.invalidate_caches`` re-read an archive only when
its size or modification time changed since that importer last read it. The first call on each importer always
re-reads, so an archive that does change is still re-read, as before. Importing :mod:`anisotropy_spark` inside a
task installs it, once per worker process (:func:`install_in_python_worker`). The driver, and any Python from
3.12 on, are left as they are.
"""

from __future__ import annotations

import functools
import os
import sys
import zipimport

from pyspark import TaskContext

_STAMP = "_anisotropy_archive_stamp"


def _archive_stamp(path: str) -> tuple[int, int] | None:
    """(modification time in ns, size in bytes) of the archive at ``path``; None if it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def reread_zip_archives_only_when_changed() -> None:
    """Wrap ``zipimport.zipimporter.invalidate_caches`` so it calls the original only when the importer's archive
    changed (size or mtime) since its last re-read, or cannot be read; idempotent."""
    reread = zipimport.zipimporter.invalidate_caches
    if getattr(reread, "only_when_changed", False):
        return

    @functools.wraps(reread)
    def invalidate_caches(importer: zipimport.zipimporter) -> None:
        stamp = _archive_stamp(importer.archive)
        if stamp is None or getattr(importer, _STAMP, None) != stamp:
            reread(importer)
            setattr(importer, _STAMP, stamp)

    # a patch of a stdlib method, marked so that it is applied once: set as plain attributes
    setattr(invalidate_caches, "only_when_changed", True)
    setattr(zipimport.zipimporter, "invalidate_caches", invalidate_caches)


def install_in_python_worker() -> bool:
    """Apply :func:`reread_zip_archives_only_when_changed` when running inside a Spark task on CPython 3.10/3.11;
    returns whether it applies here."""
    applies = (3, 10) <= sys.version_info[:2] < (3, 12) and TaskContext.get() is not None
    if applies:
        reread_zip_archives_only_when_changed()
    return applies
