"""The index job with a kill −9 injected: a TEST-ONLY entry point (``python tests/index_with_faults.py``, same flags
as ``jobs/index.py``). Production code has no fault hooks; ``KILL_AT`` chooses where this script SIGKILLs its own
process: ``merge`` — when the driver starts merging the shards the Spark tasks wrote; ``ondisk_merge`` — when
faiss's on-disk merge (run with ``merge_memory_mb: 0``) has written the ``.ivfdata`` in its workspace; ``pointer`` — when the new
version is written and read back and ``CURRENT`` is about to be replaced."""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from anisotropy_core import index as core  # noqa: E402
from anisotropy_core import storage  # noqa: E402
from jobs import cli  # noqa: E402
from jobs import index as index_job  # noqa: E402


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def killing_merge(trained, shards):
    kill()


def killing_ondisk_merge(merge):
    def run(trained, shard_files, ivfdata):
        merge(trained, shard_files, ivfdata)  # the .ivfdata is written in the workspace, then the kill
        kill()

    return run


def killing_pointer(write):
    def run(path, payload):
        if os.path.basename(path) == core.CURRENT:
            kill()
        write(path, payload)

    return run


if __name__ == "__main__":
    where = os.environ["KILL_AT"]
    if where == "merge":
        core.merge_shards = killing_merge
    elif where == "ondisk_merge":
        core.merge_shards_ondisk = killing_ondisk_merge(core.merge_shards_ondisk)
    elif where == "pointer":
        storage.write_atomic = killing_pointer(storage.write_atomic)
    else:
        raise SystemExit(f"KILL_AT must be merge, ondisk_merge or pointer, got {where!r}")
    sys.exit(cli.run(index_job.main))
