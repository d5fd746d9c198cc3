"""The ``anisotropy`` console script: one command, a subcommand per job.

    anisotropy diagnose|fit|apply|nightly|demo --conf FILE [--key-name VALUE ...]

Each subcommand is that job's own ``main`` (``python -m jobs.<job>`` and ``spark-submit jobs/<job>.py`` run
the same code); ``anisotropy <job> --help`` lists its flags.
"""
from __future__ import annotations

import argparse
import importlib
import sys

JOBS = {
    "diagnose": "measure how anisotropic an embedding table is (report + metrics row)",
    "fit": "fit a correction and save it as a versioned artifact",
    "apply": "write a corrected copy of a table with a saved artifact",
    "nightly": "diagnose, decide, fit or reuse, apply, gate and publish in one run",
    "demo": "the whole pipeline on the bundled corpus",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anisotropy", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    for name, summary in JOBS.items():
        commands.add_parser(name, help=summary, add_help=False)
    args, rest = parser.parse_known_args(argv)
    job = importlib.import_module(f"jobs.{args.job}")
    return job.main(rest)


if __name__ == "__main__":
    sys.exit(main())
