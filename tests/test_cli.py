"""The ``anisotropy`` console script dispatches to each job's own main (no Spark needed for these checks)."""

import pytest

from jobs import cli


@pytest.mark.parametrize(
    "job,flag",
    [
        ("diagnose", "--sample-size"),
        ("fit", "--max-D"),
        ("apply", "--artifact"),
        ("nightly", "--output-bounds"),
        ("vacuum", "--allow-short-retention"),
        ("demo", "--corpus-parquet"),
    ],
)
def test_every_subcommand_is_the_jobs_cli(job, flag, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([job, "--help"])
    assert done.value.code == 0 and flag in capsys.readouterr().out


def test_config_errors_come_back_as_the_jobs_exit_code(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text("input: a\noutput: b\nretries: 3\n")
    assert cli.main(["nightly", "--conf", str(conf)]) == 2


def test_unknown_subcommand_is_refused():
    with pytest.raises(SystemExit) as done:
        cli.main(["train"])
    assert done.value.code == 2
