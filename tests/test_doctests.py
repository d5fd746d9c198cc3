"""The Examples blocks of the Estimators (fit, transform, save, load) run as doctests on the shared session."""

import doctest

import pytest

import anisotropy_spark.estimators
import anisotropy_spark.kmeans


@pytest.mark.parametrize("module", [anisotropy_spark.estimators, anisotropy_spark.kmeans])
def test_examples(spark, tmp_path, module):
    result = doctest.testmod(
        module, extraglobs={"spark": spark, "temp_path": str(tmp_path)}, optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0, result
