"""One SparkSession (local[2], Delta-enabled) shared by the whole test session."""

import pytest


@pytest.fixture(scope="session")
def spark():
    from anisotropy_spark.session import get_spark

    session = get_spark(
        "anisotropy-tests",
        master="local[2]",
        extra_conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
            "spark.default.parallelism": "4",
            "spark.sql.adaptive.enabled": "false",
            "spark.driver.memory": "4g",
            "spark.task.maxFailures": "2",
        },
    )
    yield session
    session.stop()
