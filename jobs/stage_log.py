"""One concise log line per job stage: ``[i/n] name: rows, seconds``, and the stage timings for the run record.

Progress of long Spark stages is Spark's own console progress bar, switched on by
:func:`anisotropy_spark.session.get_spark` only when the terminal is interactive.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator


@contextlib.contextmanager
def timed_stage(log: logging.Logger, timings: list[dict], name: str, position: str = "") -> Iterator[dict]:
    """Time the body; it may set ``info["rows"]`` and other keys (logged as ``key=value``). Appends ``{"name",
    "seconds"[, "rows", …]}`` to ``timings``."""
    info: dict[str, Any] = {"name": name}
    start = time.perf_counter()
    try:
        yield info
    finally:
        info["seconds"] = round(time.perf_counter() - start, 3)
        timings.append(info)
        rows = f"{info['rows']} rows, " if "rows" in info else ""
        extra = "".join(f", {key}={value}" for key, value in info.items() if key not in ("name", "rows", "seconds"))
        log.info("%s%s: %s%.2fs%s", f"[{position}] " if position else "", name, rows, info["seconds"], extra)
