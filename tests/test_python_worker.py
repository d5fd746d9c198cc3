"""Python workers: zip archives on the import path are re-read only when they changed, and only inside tasks on
CPython 3.10/3.11 is ``zipimporter.invalidate_caches`` replaced."""

import sys
import zipfile
import zipimport

from anisotropy_spark.python_worker import install_in_python_worker, reread_zip_archives_only_when_changed

ON_PYTHON_3_10_OR_3_11 = (3, 10) <= sys.version_info[:2] < (3, 12)


def write_archive(path, modules):
    with zipfile.ZipFile(path, "w") as archive:
        for name in modules:
            archive.writestr(f"{name}.py", f"NAME = {name!r}\n")


def test_an_archive_is_reread_only_when_its_size_or_mtime_changed(tmp_path, monkeypatch):
    rereads = []
    original = zipimport.zipimporter.invalidate_caches

    def counted(importer):
        rereads.append(importer.archive)
        original(importer)

    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", counted)  # restored after the test
    path = tmp_path / "code.zip"
    write_archive(path, ["first"])
    importer = zipimport.zipimporter(str(path))
    reread_zip_archives_only_when_changed()
    reread_zip_archives_only_when_changed()  # idempotent: wraps once
    for _ in range(3):
        importer.invalidate_caches()
    assert rereads == [str(path)]  # the first call re-reads, the unchanged archive is not
    assert importer.find_spec("second") is None
    write_archive(path, ["first", "second"])
    importer.invalidate_caches()
    assert rereads == [str(path)] * 2
    assert importer.find_spec("second") is not None  # a module added to the archive is found, as before
    path.unlink()
    importer.invalidate_caches()  # an archive that cannot be read goes to the original
    assert rereads == [str(path)] * 3


def test_installed_inside_tasks_only_and_only_on_python_3_10_and_3_11(spark):
    assert install_in_python_worker() is False  # the driver is left as it is
    assert not getattr(zipimport.zipimporter.invalidate_caches, "only_when_changed", False)

    def in_task(_):
        import zipimport as worker_zipimport

        yield (
            install_in_python_worker(),
            getattr(worker_zipimport.zipimporter.invalidate_caches, "only_when_changed", False),
        )

    assert spark.sparkContext.parallelize([0], 1).mapPartitions(in_task).collect() == [
        (ON_PYTHON_3_10_OR_3_11, ON_PYTHON_3_10_OR_3_11)
    ]
