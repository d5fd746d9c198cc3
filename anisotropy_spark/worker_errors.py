"""Errors raised in Python workers that reach the driver as their own class, never recognised by their message.

A Python exception raised inside a Spark task does not travel to the driver as an object: the worker sends its
formatted traceback, and the driver raises pyspark's ``PythonException`` (or a ``Py4JJavaError`` wrapping the
``SparkException`` that failed the job) whose text holds it. So the class and fields of an error are carried across
that boundary as data in a fixed frame:

* :class:`WorkerError` is the base of every error a worker raises on purpose about the data it reads (an invalid
  row, a file pyarrow cannot read as the table's columns, a vector the transform cannot map). Each subclass keeps
  its fields (row id, column, reason, …) as attributes, builds its message from them, and pickles by those fields.
* :func:`raised_in_workers` wraps a partition function (``mapInArrow``, ``mapPartitions``): a :class:`WorkerError`
  it raises is re-raised as :class:`WorkerFailure`, whose message is the error's readable line followed by one
  frame, ``anisotropy-worker-error<`` + base64(JSON {"type": registered name, "fields": {…}}) + ``>``. Any other
  exception passes through unchanged. Either way the task still fails, so Spark retries it as it retries any
  failed task (``spark.task.maxFailures``): an I/O error that goes away succeeds on a retry, a data error fails
  the same way each time and then fails the job.
* :func:`worker_error` on the driver finds the first frame in the text of an exception and of its causes, and
  rebuilds the error of the registered class from its fields (the JSON is only ever decoded into a class
  registered here, so text that only looks like a frame cannot run code, as unpickling it could). The jobs then
  catch the class (:func:`jobs.cli.classify` maps it to its exit code).
"""

from __future__ import annotations

import base64
import functools
import json
from typing import Any, Callable, Iterator, ParamSpec, TypeVar

FRAME_START = "anisotropy-worker-error<"
FRAME_END = ">"

_REGISTRY: dict[str, type["WorkerError"]] = {}
P = ParamSpec("P")
T = TypeVar("T")


class WorkerError(Exception):
    """An error about the data that a worker raises on purpose. A subclass declares ``fields`` (its constructor's
    keyword arguments, JSON values) and a ``message()`` built from them; it registers itself by class name."""

    fields: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    def __init__(self, **values: Any):
        missing = [f for f in self.fields if f not in values]
        if missing or set(values) - set(self.fields):
            raise TypeError(f"{type(self).__name__} takes the fields {list(self.fields)}, got {sorted(values)}")
        for name in self.fields:
            setattr(self, name, values[name])
        super().__init__(self.message())

    def message(self) -> str:
        raise NotImplementedError

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields}

    def __reduce__(self):
        return _rebuild, (type(self).__name__, self.values())


def _rebuild(name: str, values: dict[str, Any]) -> WorkerError:
    return _REGISTRY[name](**values)


class WorkerFailure(RuntimeError):
    """What a task raises for a :class:`WorkerError`: its readable line, then its frame (module docstring)."""


def frame(error: WorkerError) -> str:
    """The frame carrying ``error``'s class and fields."""
    payload = json.dumps({"type": type(error).__name__, "fields": error.values()}, default=str)
    return FRAME_START + base64.b64encode(payload.encode()).decode("ascii") + FRAME_END


def raised_in_workers(function: Callable[P, Iterator[T]]) -> Callable[P, Iterator[T]]:
    """``function`` (a generator function run in a task) with its :class:`WorkerError` re-raised as a
    :class:`WorkerFailure` carrying the frame; other exceptions unchanged."""

    @functools.wraps(function)
    def framed(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        try:
            yield from function(*args, **kwargs)
        except WorkerError as exc:
            raise WorkerFailure(f"{type(exc).__name__}: {exc} {frame(exc)}") from exc

    return framed


def worker_error(exc: BaseException) -> WorkerError | None:
    """The :class:`WorkerError` a task raised inside ``exc`` (a Spark job's error, or its chain of causes and
    contexts, but not past a ``raise … from None``), rebuilt as its own class; ``exc`` itself when it is one (raised
    on the driver); None when there is none."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, WorkerError):
            return seen
        found = decode(str(seen))
        if found is not None:
            return found
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return None


def decode(text: str) -> WorkerError | None:
    """The error of the first well-formed frame in ``text`` whose type is registered, else None."""
    start = text.find(FRAME_START)
    while start >= 0:
        begin = start + len(FRAME_START)
        end = text.find(FRAME_END, begin)
        if end < 0:
            return None
        try:
            payload = json.loads(base64.b64decode(text[begin:end], validate=True))
            cls = _REGISTRY.get(payload["type"])
            if cls is not None:
                return cls(**payload["fields"])
        except (ValueError, KeyError, TypeError):
            pass  # not one of our frames: look for the next
        start = text.find(FRAME_START, end)
    return None
