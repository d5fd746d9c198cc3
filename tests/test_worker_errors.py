"""Errors raised in Python workers reach the driver as their own class (issue 44, item 4), and the contract's
length checks (issue 45): ``norm_overflow``, ``norm_outlier`` and the length sketch the median comes from.
Numpy and pyarrow only, but for one Spark action showing a task's typed error arriving through Spark's wrapping."""

import pickle

import numpy as np
import pyarrow as pa
import pytest

from anisotropy_core.norms import MEDIAN_ERROR, LengthSketch, max_norm
from anisotropy_spark.contract import (
    ForeignDimensionError,
    InvalidRowError,
    InvalidRowsError,
    TransformRowError,
    check_batch,
)
from anisotropy_spark.table_files import FileLayoutError
from anisotropy_spark.worker_errors import FRAME_START, WorkerFailure, decode, frame, raised_in_workers, worker_error

ERRORS = [
    InvalidRowError(id_col="id", row_id=7, column="vector", reason="non_finite"),
    ForeignDimensionError(length=8, dimension=16),
    TransformRowError(
        column="vector",
        row={"id": 3, "title": "x"},
        reason="center: row 0: non-finite output value after the cast to float32",
    ),
    FileLayoutError("part-0.parquet has no column(s) ['tokens']"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_a_frame_and_a_pickle_give_back_the_class_and_its_fields(error):
    text = f"Traceback (most recent call last):\n  ...\nWorkerFailure: {error} {frame(error)}\n\tat org.apache..."
    for back in (decode(text), pickle.loads(pickle.dumps(error))):
        assert type(back) is type(error) and back.values() == error.values() and str(back) == str(error)


def test_the_messages_name_row_column_and_reason():
    invalid, foreign, transform, layout = (str(e) for e in ERRORS)
    assert invalid == (
        "invalid input row: non_finite in column 'vector', id [7]; nothing was written. "
        "Fix the input or set on_invalid: quarantine."
    )
    assert isinstance(ERRORS[0], InvalidRowsError)  # the exit-5 class the driver already catches
    assert foreign == "input vectors have dimension 8, not the transform's 16"
    assert transform.endswith("after the cast to float32 [column 'vector', row {'id': 3, 'title': 'x'}]")
    assert layout == "part-0.parquet has no column(s) ['tokens']"


def test_only_registered_well_formed_frames_decode():
    assert decode("no frame here") is None
    assert decode(FRAME_START + "not base64!" + ">") is None
    unknown = FRAME_START + "eyJ0eXBlIjogIm9zLnN5c3RlbSIsICJmaWVsZHMiOiB7fX0=" + ">"  # {"type": "os.system", ...}
    assert decode(unknown) is None
    assert isinstance(decode(unknown + " " + frame(ERRORS[1])), ForeignDimensionError)  # the next frame is read
    with pytest.raises(TypeError, match="takes the fields"):
        ForeignDimensionError(length=8)


def test_the_wrapper_frames_worker_errors_only_and_the_cause_chain_is_searched():
    @raised_in_workers
    def task(kind):
        yield 1
        raise kind

    with pytest.raises(WorkerFailure) as framed:
        list(task(ERRORS[0]))
    with pytest.raises(OSError, match="disk gone"):  # an I/O error stays itself: Spark retries the task
        list(task(OSError("disk gone")))
    try:
        raise RuntimeError("py4j said so") from framed.value
    except RuntimeError as outer:
        assert worker_error(outer).values() == ERRORS[0].values()
    assert worker_error(ERRORS[1]) is ERRORS[1] and worker_error(ValueError("plain")) is None
    try:
        try:
            raise RuntimeError(frame(ERRORS[0]))
        except RuntimeError:
            raise KeyError("the job's own error, raised from None") from None
    except KeyError as own:
        assert worker_error(own) is None


def test_a_typed_error_raised_in_a_spark_task_arrives_as_its_class(spark):
    @raised_in_workers
    def fails(batches):
        for batch in batches:
            if 5 in batch.column(0).to_pylist():
                raise InvalidRowError(id_col="id", row_id=5, column="vector", reason="zero_norm")
            yield batch

    with pytest.raises(Exception) as caught:
        spark.range(10).mapInArrow(fails, "id long").collect()
    assert not isinstance(caught.value, InvalidRowError)  # Spark's wrapping, holding the frame
    found = worker_error(caught.value)
    assert isinstance(found, InvalidRowError) and (found.row_id, found.reason) == (5, "zero_norm")


def batch_of(rows, element=pa.float64()):
    return pa.RecordBatch.from_pydict({"id": list(range(len(rows))), "vector": pa.array(rows, pa.list_(element))})


def test_squared_lengths_that_overflow_float64_are_norm_overflow_not_float32s_largest():
    checked = check_batch(
        batch_of([[1e300, 0.0], [3.0, 4.0], [0.0, 0.0], [np.nan, 1.0], [1e200, 1e200]]), "vector", "id", 2
    )
    assert list(checked.reasons) == ["norm_overflow", None, "zero_norm", "non_finite", "norm_overflow"]
    assert checked.lengths.tolist() == [5.0]
    big = check_batch(batch_of([[3e38, 3e38], [1.0, 0.0]], pa.float32()), "vector", "id", 2)
    assert big.reasons is None and np.allclose(big.lengths, [np.hypot(3e38, 3e38), 1.0], rtol=1e-6)


def test_rows_longer_than_max_norm_are_norm_outlier_after_every_other_reason():
    rows = [[3.0, 4.0], [300.0, 400.0], [1e300, 1.0], [np.inf, 1e9]]
    assert check_batch(batch_of(rows), "vector", "id", 2).reasons.tolist() == [
        None,
        None,
        "norm_overflow",
        "non_finite",
    ]
    checked = check_batch(batch_of(rows), "vector", "id", 2, max_norm=100.0)
    assert checked.reasons.tolist() == [None, "norm_outlier", "norm_overflow", "non_finite"]
    assert checked.matrix.tolist() == [[3.0, 4.0]] and checked.lengths.tolist() == [5.0]


def test_the_length_sketch_median_is_within_its_stated_error_and_merges_exactly():
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.normal(2.0, 3.0, size=10_001))
    whole = LengthSketch.of(lengths)
    parts = LengthSketch.of(lengths[:3000]).merge(LengthSketch.of(lengths[3000:]))
    assert np.array_equal(whole.counts, parts.counts) and whole.maximum == parts.maximum == lengths.max()
    assert abs(whole.median() / np.median(lengths) - 1) <= MEDIAN_ERROR < 0.01
    again = LengthSketch.from_bytes(whole.to_bytes())
    assert np.array_equal(again.counts, whole.counts) and again.maximum == whole.maximum
    assert LengthSketch.empty().median() is None and LengthSketch.from_bytes(LengthSketch.empty().to_bytes()).n == 0
    assert max_norm(2.0, 1e3) == 2000.0 and max_norm(2.0, None) is None and max_norm(2.0, 0) is None
    assert max_norm(None, 1e3) is None
