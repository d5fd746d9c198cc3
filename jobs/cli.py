"""The ``anisotropy`` console script: one command, a subcommand per job; and the exit codes every job shares.

    anisotropy diagnose|fit|apply|nightly|vacuum|index|demo --conf FILE [--key-name VALUE ...] [--verbose]

Each subcommand is that job's own ``main`` (``python -m jobs.<job>`` and ``spark-submit jobs/<job>.py`` run
the same code through :func:`run`); ``anisotropy <job> --help`` lists its flags.

Exit codes (:data:`EXIT`, README "Exit codes"): 0 success; 2 config or contract error (bad key, missing file
or path, missing or mistyped column, unusable artifact); 3 quality gate rejected; 4 lost to a concurrent
publish; 5 invalid input (invalid rows with ``on_invalid: error``, fewer than 2 valid rows, zero spread, a row
the transform cannot map); 1 anything else (docs/errors.md). A classified error prints one line naming the problem, no traceback (``--verbose``: also
the traceback); anything else propagates with its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Callable

from anisotropy_core.artifact import ArtifactError
from anisotropy_core.moments import InvalidVectorsError
from anisotropy_spark.contract import InvalidRowsError, SchemaError, TransformRowError
from anisotropy_spark.publish import delta_conflict_name
from anisotropy_spark.worker_errors import worker_error
from jobs.config import ConfigError
from jobs.gate import GateError

log = logging.getLogger("anisotropy")
EXIT = {
    "published": 0,
    "noop": 0,
    "kept": 0,
    "rolled_back": 0,
    "config_error": 2,
    "gate_rejected": 3,
    "concurrent_publish": 4,
    "invalid_input": 5,
    "failed": 1,
}
CLASSES = (
    (ConfigError, "config_error"),
    (SchemaError, "config_error"),
    (ArtifactError, "config_error"),
    (FileNotFoundError, "config_error"),
    (GateError, "gate_rejected"),
    (InvalidRowsError, "invalid_input"),
    (InvalidVectorsError, "invalid_input"),
    (TransformRowError, "invalid_input"),
)
MISSING_PATH = ("PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_PATH_DOES_NOT_EXIST")


def classify(exc: BaseException) -> str | None:
    """The status (a key of :data:`EXIT`) of an error with a documented exit code, else None. Concurrency
    conflicts are found by type anywhere in the cause chain; an error a Python worker raised by its class
    (:func:`~anisotropy_spark.worker_errors.worker_error`); Spark's missing-path errors by their error class."""
    if delta_conflict_name(exc) is not None:
        return "concurrent_publish"
    exc = typed(exc)
    for kind, status in CLASSES:
        if isinstance(exc, kind):
            return status
    condition = getattr(exc, "getCondition", None)
    if callable(condition) and condition() in MISSING_PATH:
        return "config_error"
    return None


def typed(exc: BaseException) -> BaseException:
    """``exc`` when it is of a class of :data:`CLASSES`, else the typed error a Python worker raised inside it
    (:func:`~anisotropy_spark.worker_errors.worker_error`), else ``exc``."""
    if isinstance(exc, tuple(kind for kind, _ in CLASSES)):
        return exc
    return worker_error(exc) or exc


def describe(exc: BaseException) -> str:
    """One line: the error's type and its first message line (Spark's messages run to many lines); for a Spark
    error carrying a Python worker's typed error, that error's."""
    exc = typed(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def run(job_main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``job_main(argv)`` with the shared exit codes: a classified error logs :func:`describe` (plus its traceback
    with ``--verbose``) and returns its code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    try:
        return job_main(argv)
    except Exception as exc:  # noqa: BLE001 — classified here; anything unknown propagates unchanged
        status = classify(exc)
        if status is None:
            raise
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log.error("%s (exit %d)", describe(exc), EXIT[status], exc_info=exc if verbose else None)
        return EXIT[status]


JOBS = {
    "diagnose": "measure how anisotropic an embedding table is (report + metrics row)",
    "fit": "fit a correction and save it as a versioned artifact",
    "apply": "write a corrected copy of a table with a saved artifact",
    "nightly": "diagnose, decide, fit or reuse, apply, gate and publish in one run",
    "vacuum": "delete the data files the nightly's Delta tables no longer reference (Delta VACUUM)",
    "demo": "the whole pipeline on the bundled corpus",
    "index": "build, verify and swap in the faiss index of a table version",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anisotropy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    for name, summary in JOBS.items():
        commands.add_parser(name, help=summary, add_help=False)
    args, rest = parser.parse_known_args(argv)
    job = importlib.import_module(f"jobs.{args.job}")
    return run(job.main, rest)


if __name__ == "__main__":
    sys.exit(main())
