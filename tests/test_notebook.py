"""notebooks/diagnose.ipynb executes headless, top to bottom, on the committed demo corpus."""

import pathlib

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "diagnose.ipynb"


def test_notebook_executes_and_shows_the_plots():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 4  # spectrum, cosines, u1 vs metadata, before/after
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    for expected in (
        "anisotropy_A",
        "A_isotropic_se",
        "isoscore",
        "adjusted_intra_sim",
        "mev_over_floor",
        "HTML report:",
    ):
        assert expected in text, expected
