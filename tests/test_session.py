"""Session helpers: local core count of a master URL, Delta snapshot partitions, temporary session confs."""

import os

import pytest

from anisotropy_spark.session import (
    ARROW_JAVA_OPTIONS,
    EMBEDDED_JAVA_OPTIONS,
    JIT_JAVA_OPTIONS,
    embedded_java_options,
    local_cores,
    session_conf,
    snapshot_partitions,
)


@pytest.mark.parametrize(
    "master, cores",
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[*]", os.cpu_count()),
        ("local[4, 2]", 4),
        ("local[*,3]", os.cpu_count()),
        ("spark://host:7077", None),
        ("yarn", None),
        ("local-cluster[2,1,1024]", None),
    ],
)
def test_local_cores_of_a_master_url(master, cores):
    assert local_cores(master) == cores


def test_delta_snapshot_partitions_one_per_local_core_at_most_deltas_50():
    assert (snapshot_partitions("local[2]"), snapshot_partitions("local[64]")) == (2, 50)
    assert snapshot_partitions("spark://host:7077") is None


def test_session_conf_restores_the_previous_value_or_unsets(spark):
    kept, fresh = "spark.sql.files.maxPartitionBytes", "anisotropy.test.only.key"
    spark.conf.set(kept, "64MB")
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with session_conf(spark, {kept: "1GB", fresh: "x"}):
                assert (spark.conf.get(kept), spark.conf.get(fresh)) == ("1GB", "x")
                raise RuntimeError("inside")
        assert spark.conf.get(kept) == "64MB"
        assert spark.conf.get(fresh, None) is None
    finally:
        spark.conf.unset(kept)


def test_the_embedded_local2_session_reads_delta_state_in_two_partitions(spark):
    # conftest starts local[2] without setting the key: the value is get_spark's own
    assert spark.conf.get("spark.databricks.delta.snapshotPartitions") == "2"


def test_embedded_java_options_put_the_callers_own_after_arrows_and_the_jits():
    assert EMBEDDED_JAVA_OPTIONS == ARROW_JAVA_OPTIONS + " " + JIT_JAVA_OPTIONS
    options = embedded_java_options({"spark.driver.extraJavaOptions": "-Darrow.enable_unsafe_memory_access=false"})
    assert options == {
        "spark.driver.extraJavaOptions": EMBEDDED_JAVA_OPTIONS + " -Darrow.enable_unsafe_memory_access=false",
        "spark.executor.extraJavaOptions": EMBEDDED_JAVA_OPTIONS,
    }
    assert embedded_java_options(None) == {
        "spark.driver.extraJavaOptions": EMBEDDED_JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": EMBEDDED_JAVA_OPTIONS,
    }


def test_the_embedded_session_jvm_runs_arrow_without_bounds_and_get_null_checks(spark):
    jvm = spark.sparkContext._jvm
    assert jvm.java.lang.System.getProperty("arrow.enable_unsafe_memory_access") == "true"
    assert jvm.java.lang.System.getProperty("arrow.enable_null_check_for_get") == "false"
    assert not jvm.org.apache.arrow.memory.BoundsChecking.BOUNDS_CHECKING_ENABLED


def test_the_embedded_session_jvm_keeps_profiling_hot_methods_however_long_c2s_queue(spark):
    jvm = spark.sparkContext._jvm
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert hotspot.getVMOption("Tier3DelayOn").getValue() == "100000"
