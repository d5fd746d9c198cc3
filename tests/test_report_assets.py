"""Report pictures and the self-contained HTML report."""

import base64
import json
import re

import numpy as np
import pytest

from anisotropy_core.diagnostics import diagnose
from anisotropy_core.report import (
    html_report,
    sample_pair_cosines,
    scalar_rows,
    u1_metadata_figure,
    write_report_assets,
)
from anisotropy_core.synthetic import cone

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 80, size=1500)
    x = cone(1500, 32, offset=3.0, alpha=1.0, seed=4) + np.outer(tokens / 10.0, np.eye(32)[0])
    return x, {
        "token_count": tokens,
        "char_length": tokens * 4.5 + rng.normal(size=1500),
        "source": np.array(["wiki", "news", "code"])[rng.integers(0, 3, size=1500)],
    }


def test_pair_cosines_all_pairs_and_sampled():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 5))
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.array([u[i] @ u[j] for i in range(30) for j in range(i + 1, 30)])
    np.testing.assert_allclose(np.sort(sample_pair_cosines(x)), np.sort(brute), atol=1e-14)
    big = rng.normal(size=(5000, 3))
    sampled = sample_pair_cosines(big, max_pairs=1000, seed=2)
    assert sampled.shape == (1000,) and (sampled < 1 - 1e-12).all()  # never a vector with itself


def test_write_report_assets_writes_every_picture_and_html(tmp_path, corpus):
    x, metadata = corpus
    before = diagnose(x)
    after = {**diagnose(x - x.mean(0)), "sampling": {"A_z": 0.3, "method": "simulation"}}
    paths = write_report_assets(
        after,
        tmp_path,
        samples=(x - x.mean(0))[:600],
        metadata={k: v[:600] for k, v in metadata.items()},
        before=before,
        before_samples=x[:600],
        title="Demo <corpus>",
    )
    assert set(paths) == {"spectrum", "cosines", "u1_metadata", "before_after", "html"}
    for name in ("spectrum", "cosines", "u1_metadata", "before_after"):
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    page = (tmp_path / "report.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 4 and all(base64.b64decode(e).startswith(PNG_MAGIC) for e in embedded)
    assert "Demo &lt;corpus&gt;" in page and "<th>sampling.A_z</th><td>0.3</td>" in page
    assert f"<th>anisotropy_A</th><td>{after['anisotropy_A']:.6g}</td>" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


def test_report_assets_from_json_report_and_minimal_inputs(tmp_path, corpus):
    x, _ = corpus
    as_json = json.loads(json.dumps(diagnose(x).to_json()))
    paths = write_report_assets(as_json, tmp_path)
    assert set(paths) == {"spectrum", "html"}
    assert (tmp_path / "spectrum.png").read_bytes().startswith(PNG_MAGIC)


def test_scalar_rows_skip_arrays_and_flatten():
    rows = dict(scalar_rows({"n": 1200, "A": 0.25, "spectrum": np.ones(3), "nested": {"ok": True, "v": None}}))
    assert rows == {"n": "1,200", "A": "0.25", "nested.ok": "True", "nested.v": "None"}
    assert "<td>1,200</td>" in html_report({"n": 1200}, {})


def test_u1_metadata_rejects_misaligned_or_missing_columns(corpus):
    x, metadata = corpus
    report = diagnose(x)
    with pytest.raises(ValueError, match="1500 samples"):
        u1_metadata_figure(report, x, {"token_count": metadata["token_count"][:10]})
    with pytest.raises(ValueError, match="at least one metadata column"):
        u1_metadata_figure(report, x, {})


def test_u1_metadata_title_reports_the_correlation(corpus):
    x, metadata = corpus
    report = diagnose(x)
    fig = u1_metadata_figure(report, x, {"token_count": metadata["token_count"]})
    proj = (x - report["mean"]) @ report["u1"]
    corr = abs(np.corrcoef(proj, metadata["token_count"])[0, 1])
    assert fig.axes[0].get_title() == f"token_count: |corr| = {corr:.2f}"
    assert corr > 0.9  # the planted length direction dominates u1
