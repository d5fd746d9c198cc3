"""Names of the columns the jobs add to the tables they write. Spark-free, so that the settings modules
(:mod:`jobs.nightly_config`) can check a configured column against them without importing a job."""

VERSION_COLUMN = "transform_version"  # apply and nightly outputs: the artifact version that corrected the row
CLUSTER_COLUMN = "cluster_id"  # cluster_recenter outputs: the cluster the row landed in
