"""The one row of a DataFrame that has one: a global aggregate, or the newest entry of a Delta table's history."""

from __future__ import annotations

from pyspark.sql import DataFrame, Row


def one_row(df: DataFrame) -> Row:
    """``df.first()``, for a ``df`` that always holds a row (``first`` returns None only on an empty DataFrame,
    which is then an error here rather than a ``TypeError`` on the first field read)."""
    row = df.first()
    if row is None:
        raise ValueError("expected at least one row, the DataFrame is empty")
    return row
