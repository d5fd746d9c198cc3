"""Pictures of a diagnosis and a self-contained HTML report (matplotlib's Agg canvas; no pyplot, no display).

Every ``*_figure`` function returns a :class:`matplotlib.figure.Figure`; :func:`write_report_assets` writes
them as PNGs plus ``report.html`` (the PNGs embedded as base64, so the HTML is one portable file).

Inputs are a :func:`~anisotropy_core.diagnostics.diagnose` report (numpy arrays or the lists of its JSON
form) and, for the sample-based plots, ``samples`` — an (m, d) sample of the raw vectors — with
``metadata`` — {column name: (m,) values aligned with the sample rows}.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from typing import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from . import storage
from .diagnostics import RANK_TOLERANCE, power_law_fit, project_on_u1, signal_range

MAX_PAIRS = 20_000
BEFORE_COLOUR, AFTER_COLOUR, NULL_COLOUR = "#c0392b", "#2471a3", "#7f8c8d"


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _spectrum(report: Mapping) -> np.ndarray:
    return np.asarray(report["spectrum"], dtype=np.float64)


def _draw_spectrum(ax, report: Mapping, colour: str, label: str, band: bool, hollow: bool = False) -> None:
    lam = _spectrum(report)
    keep = lam > RANK_TOLERANCE * lam[0]
    k = np.arange(1, lam.shape[0] + 1)
    ax.loglog(
        k[keep],
        lam[keep],
        "o" if hollow else ".",
        ms=5 if hollow else 3,
        color=colour,
        mfc="none" if hollow else colour,
        label=f"{label} eigenvalues",
    )
    k_lo, k_hi = report.get("power_law_range") or signal_range(lam, int(report["n"]), int(report["d"]))
    alpha, scale = power_law_fit(lam, (k_lo, k_hi))
    if math.isfinite(alpha):  # the line is drawn over the range it was fitted on, only
        span = np.arange(k_lo, k_hi + 1)
        ax.loglog(
            span,
            scale * span**-alpha,
            "-",
            lw=1.5,
            color=colour,
            alpha=0.8,
            label=f"{label} fit α = {alpha:.2f} over k = {k_lo}…{k_hi} (above the MP edge)",
        )
    if band:
        ax.axhspan(
            report["mp_lower"],
            report["mp_upper"],
            color=NULL_COLOUR,
            alpha=0.18,
            label=f"Marchenko–Pastur band (isotropic, n={report['n']}, d={report['d']})",
        )
    ax.set_xlabel("component k")
    ax.set_ylabel("centred covariance eigenvalue λ_k")


def spectrum_figure(report: Mapping) -> Figure:
    """Log-log centred spectrum with the Marchenko–Pastur band of an isotropic cloud of equal total variance
    and the fitted power law λ_k ∝ k^−α; title carries top-1 share, effective rank and eigenvalues above MP."""
    fig = _new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    _draw_spectrum(ax, report, AFTER_COLOUR, "", band=True)
    ax.set_title(
        f"Spectrum: top-1 {report['top1_var']:.1%}, effective rank {report['effective_rank']:.1f}/"
        f"{report['d']}, {report['mp_above_upper']} above the MP edge",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    return fig


def sample_pair_cosines(samples: np.ndarray, max_pairs: int = MAX_PAIRS, seed: int = 0) -> np.ndarray:
    """(≤ max_pairs,) cosines of random distinct pairs of rows of ``samples`` (m, d); all pairs when fewer."""
    x = np.asarray(samples, dtype=np.float64)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    m = u.shape[0]
    if m < 2:
        raise ValueError("need at least 2 sample vectors for pairwise cosines")
    if m * (m - 1) // 2 <= max_pairs:
        i, j = np.triu_indices(m, 1)
    else:
        rng = np.random.default_rng(seed)
        i = rng.integers(0, m, size=max_pairs)
        j = (i + rng.integers(1, m, size=max_pairs)) % m  # j ≠ i
    return np.einsum("ij,ij->i", u[i], u[j])


def _draw_cosines(ax, samples: np.ndarray, colour: str, label: str, seed: int) -> None:
    cos = sample_pair_cosines(samples, seed=seed)
    ax.hist(
        cos,
        bins=80,
        range=(-1, 1),
        density=True,
        color=colour,
        alpha=0.55,
        label=f"{label} pairs (mean {cos.mean():.3f})",
    )


def _draw_isotropic_curve(ax, d: int) -> None:
    grid = np.linspace(-1, 1, 801)
    ax.plot(
        grid,
        np.sqrt(d / (2 * np.pi)) * np.exp(-(grid**2) * d / 2),
        color="black",
        lw=1.2,
        label=f"isotropic N(0, 1/d), sd {1 / math.sqrt(d):.3f}",
    )
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cosine of a random pair")
    ax.set_ylabel("density")


def cosine_histogram_figure(samples: np.ndarray, seed: int = 0) -> Figure:
    """Histogram of sampled pairwise cosines of ``samples`` (m, d) against the isotropic N(0, 1/d) curve."""
    d = np.asarray(samples).shape[1]
    fig = _new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    _draw_cosines(ax, samples, AFTER_COLOUR, "sampled", seed)
    _draw_isotropic_curve(ax, d)
    ax.set_title("Pairwise cosines vs the isotropic baseline", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def u1_metadata_figure(report: Mapping, samples: np.ndarray, metadata: Mapping[str, np.ndarray]) -> Figure:
    """One panel per metadata column: the u1 projection (v − μ)·u1 of each sample row against the column.

    Numeric columns are scatter plots titled with |corr| (u1 has no sign); other columns are strip plots per
    value (at most 12 values, most frequent first). ``metadata`` must be non-empty and aligned with ``samples``.
    """
    if not metadata:
        raise ValueError("u1 projection plot needs at least one metadata column")
    proj = project_on_u1(samples, {"mean": np.asarray(report["mean"]), "u1": np.asarray(report["u1"])})
    cols = min(3, len(metadata))
    rows = math.ceil(len(metadata) / cols)
    fig = _new_figure(4.2 * cols, 3.4 * rows)
    for index, (name, values) in enumerate(metadata.items()):
        ax = fig.add_subplot(rows, cols, index + 1)
        values = np.asarray(values)
        if values.shape[0] != proj.shape[0]:
            raise ValueError(f"metadata column {name!r} has {values.shape[0]} values for {proj.shape[0]} samples")
        if np.issubdtype(values.dtype, np.number):
            ax.scatter(values, proj, s=5, alpha=0.45, color=AFTER_COLOUR)
            corr = (
                abs(float(np.corrcoef(values.astype(np.float64), proj)[0, 1]))
                if values.std() > 0 and proj.std() > 0
                else float("nan")
            )
            ax.set_title(f"{name}: |corr| = {corr:.2f}", fontsize=10)
            ax.set_xlabel(name)
        else:
            labels, counts = np.unique(values.astype(str), return_counts=True)
            labels = labels[np.argsort(-counts, kind="stable")][:12]
            rng = np.random.default_rng(0)
            for pos, label in enumerate(labels):
                pick = proj[values.astype(str) == label]
                ax.scatter(pos + rng.uniform(-0.2, 0.2, size=pick.shape[0]), pick, s=5, alpha=0.45)
                ax.plot([pos - 0.3, pos + 0.3], [pick.mean()] * 2, color="black", lw=2)
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=8)
            ax.set_title(f"{name}: mean projection per value", fontsize=10)
        ax.set_ylabel("u1 projection")
    return fig


def artefact_heatmap_figure(directions: Sequence[Mapping]) -> Figure:
    """Direction × metadata column heatmap of |corr(projection on u_j, column)| (the per-direction artefact
    test, ``report.json``'s ``artefact.directions``); undefined correlations (constant column) are grey."""
    columns = sorted({c for row in directions for c in row["abs_corr"]})
    if not columns:
        raise ValueError("artefact heatmap needs at least one metadata column")
    grid = np.array(
        [[np.nan if row["abs_corr"].get(c) is None else row["abs_corr"][c] for c in columns] for row in directions]
    )  # (K, columns)
    fig = _new_figure(1.6 + 1.1 * len(columns), 1.2 + 0.32 * len(directions))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["Reds"].with_extremes(bad=NULL_COLOUR)
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if math.isfinite(value):
            ax.text(
                j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white" if value > 0.6 else "black"
            )
    ax.set_xticks(range(len(columns)), columns, rotation=30, fontsize=8)
    ax.set_yticks(range(len(directions)), [f"u{row['index']}" for row in directions], fontsize=8)
    ax.set_title("|corr(projection, column)| per principal direction", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.05)
    return fig


def before_after_figure(
    before: Mapping, after: Mapping, before_samples: np.ndarray | None = None, after_samples: np.ndarray | None = None
) -> Figure:
    """Before/after panels of a transform: both spectra on log-log axes, both cosine histograms (when both
    samples are given), and the headline numbers side by side."""
    with_cosines = before_samples is not None and after_samples is not None
    panels = 3 if with_cosines else 2
    fig = _new_figure(5.0 * panels, 4.0)
    ax = fig.add_subplot(1, panels, 1)
    _draw_spectrum(ax, before, BEFORE_COLOUR, "before", band=False, hollow=True)
    _draw_spectrum(ax, after, AFTER_COLOUR, "after", band=True)
    ax.set_title("Spectrum before / after", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    if before_samples is not None and after_samples is not None:  # with_cosines
        ax = fig.add_subplot(1, panels, 2)
        _draw_cosines(ax, before_samples, BEFORE_COLOUR, "before", 0)
        _draw_cosines(ax, after_samples, AFTER_COLOUR, "after", 0)
        _draw_isotropic_curve(ax, int(after["d"]))
        ax.set_title("Pairwise cosines before / after", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    ax = fig.add_subplot(1, panels, panels)
    keys = [
        ("anisotropy_A", "A"),
        ("offset_ratio", "offset"),
        ("top1_var", "top-1 var"),
        ("top10_var", "top-10 var"),
        ("erank_frac", "erank / d"),
    ]
    pos = np.arange(len(keys))
    ax.barh(pos + 0.2, [float(before[k]) for k, _ in keys], height=0.4, color=BEFORE_COLOUR, label="before")
    ax.barh(pos - 0.2, [float(after[k]) for k, _ in keys], height=0.4, color=AFTER_COLOUR, label="after")
    ax.set_yticks(pos, [label for _, label in keys])
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, *(float(after[k]) for k, _ in keys)) - 0.05, 1.05)
    ax.set_title("Headline numbers", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def figure_png(fig: Figure) -> bytes:
    """PNG bytes of ``fig``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def scalar_rows(report: Mapping, prefix: str = "") -> list[tuple[str, str]]:
    """(name, formatted value) for every scalar of ``report``, nested mappings flattened as ``a.b``; arrays and
    lists (spectrum, u1, mean, …) are left out."""
    rows = []
    for key, value in report.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows.extend(scalar_rows(value, prefix=name + "."))
        elif isinstance(value, (bool, np.bool_, str)) or value is None:
            rows.append((name, str(value)))
        elif isinstance(value, (int, np.integer)):
            rows.append((name, f"{int(value):,}"))
        elif isinstance(value, (float, np.floating)):
            rows.append((name, f"{float(value):.6g}"))
    return rows


CLUSTER_KEYS = [
    "size",
    "share",
    "anisotropy_A",
    "offset_ratio",
    "top1_var",
    "effective_rank",
    "induced_A_global_centring",
]


def cell_text(value) -> str:
    """A table cell: – for None, 4 significant digits for floats."""
    if value is None:
        return "–"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4g}"
    return str(value)


def _applied_html(applied: Mapping | None) -> str:
    """The opening section when a run applied a correction: its headline (method, Δ ± CI against raw, neighbour
    overlap) and notes (e.g. why the verdict, the evaluation and the run differ)."""
    if not applied:
        return ""
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in applied.get("notes", []))
    return (
        f'<section id="applied"><h2>Applied</h2><p class="headline"><strong>{html.escape(applied["headline"])}'
        f"</strong></p>" + (f'<ul class="notes">{notes}</ul>' if notes else "") + "</section>"
    )


def _verdict_html(verdict: Mapping | None, evaluation: Mapping | None) -> str:
    """The opening section: recommended method, its reasons and warnings, and the candidate table."""
    if not verdict and not evaluation:
        return ""
    parts = ['<section id="verdict"><h2>Verdict</h2>']
    if verdict:
        what = html.escape(str(verdict["method"]))
        detail = [
            f"{key} = {html.escape(str(verdict[key]))}"
            for key in ("directions", "D", "k")
            if verdict.get(key) is not None
        ]
        parts.append(
            f'<p class="recommendation">Recommended correction: <strong>{what}</strong>'
            + (f" ({', '.join(detail)})" if detail else "")
            + "</p>"
        )
        parts.append(
            '<h3>Why</h3><ul class="reasons">'
            + "".join(f"<li>{html.escape(r)}</li>" for r in verdict.get("reasons", []))
            + "</ul>"
        )
        if verdict.get("warnings"):
            parts.append(
                '<h3>Warnings</h3><ul class="warnings">'
                + "".join(f"<li>{html.escape(w)}</li>" for w in verdict["warnings"])
                + "</ul>"
            )
    if evaluation:
        rows = evaluation["candidates"]
        metrics = sorted({m for row in rows.values() for m in row})
        head = "".join(f"<th>{html.escape(m)}</th>" for m in metrics)
        body = "".join(
            ('<tr class="chosen">' if name == evaluation.get("chosen") else "<tr>")
            + f"<th>{html.escape(name)}</th>"
            + "".join(f"<td>{cell_text(row.get(m))}</td>" for m in metrics)
            + "</tr>"
            for name, row in rows.items()
        )
        parts.append(
            f"<h3>Retrieval quality per candidate (best by {html.escape(str(evaluation.get('metric')))}: "
            f'{html.escape(str(evaluation.get("chosen")))}; "none" is the raw vectors)</h3>'
            f'<table id="candidates"><tr><th>candidate</th>{head}</tr>{body}</table>'
        )
    return "\n".join(parts) + "</section>"


def _clusters_html(clusters: Mapping | None) -> str:
    if not clusters:
        return ""
    head = "".join(f"<th>{k}</th>" for k in CLUSTER_KEYS)
    rows = [("all", clusters["global"])] + [(str(r["cluster"]), r) for r in clusters["clusters"]]
    body = "".join(
        f"<tr><th>{html.escape(name)}</th>"
        + "".join(f"<td>{cell_text(row.get(k))}</td>" for k in CLUSTER_KEYS)
        + "</tr>"
        for name, row in rows
    )
    verdict = (
        "globally anisotropic, locally isotropic: every cluster is flatter than the whole corpus"
        if clusters.get("locally_isotropic")
        else "not locally isotropic: some cluster is as concentrated as the whole corpus"
    )
    return (
        f'<section id="clusters"><h2>Per cluster</h2><table id="cluster-table"><tr><th>cluster</th>{head}</tr>'
        f"{body}</table><p>{verdict}</p></section>"
    )


def html_report(
    report: Mapping,
    images: Mapping[str, bytes],
    title: str = "Anisotropy report",
    meanings: Mapping[str, str] | None = None,
    verdict: Mapping | None = None,
    evaluation: Mapping | None = None,
    clusters: Mapping | None = None,
    applied: Mapping | None = None,
) -> str:
    """One self-contained HTML page, in reading order: what was applied (``applied``: ``{"headline": text,
    "notes": [text…]}``, when a run applied a correction), the verdict (``verdict``: a recommendation dict with
    method, D, directions, k, reasons, warnings; ``evaluation``: ``{"candidates": {name: {metric: value}},
    "chosen", "metric"}``), the report's scalar numbers with their ``meanings`` ({name: text}), the per-cluster
    table (``clusters``: a cluster-diagnostics dict) and each PNG of ``images`` ({caption: PNG bytes})
    embedded as a base64 data URI."""
    meanings = meanings or {}
    table = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td>"
        f'<td class="meaning">{html.escape(meanings.get(k, ""))}</td></tr>'
        for k, v in scalar_rows(report)
    )
    figures = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{html.escape(name)}</figcaption></figure>"
        for name, png in images.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}th,td{{padding:2px 10px;border-bottom:1px solid #ddd;text-align:left}}
td{{font-family:monospace}}td.meaning{{font-family:sans-serif;color:#555}}tr.chosen{{background:#eaf2f8}}
img{{max-width:100%}}figure{{margin:1.5em 0}}</style></head>
<body><h1>{html.escape(title)}</h1>
{_applied_html(applied)}
{_verdict_html(verdict, evaluation)}
<section id="numbers"><h2>Numbers</h2><table id="metrics">
<tr><th>number</th><td>value</td><td class="meaning">meaning</td></tr>
{table}
</table></section>
{_clusters_html(clusters)}
<section id="plots"><h2>Plots</h2>
{figures}
</section>
</body></html>
"""


def write_report_assets(
    report: Mapping,
    out_dir: str | os.PathLike,
    samples: np.ndarray | None = None,
    metadata: Mapping[str, np.ndarray] | None = None,
    before: Mapping | None = None,
    before_samples: np.ndarray | None = None,
    title: str = "Anisotropy report",
    artefact_directions: Sequence[Mapping] | None = None,
    **page: Mapping | None,
) -> dict[str, str]:
    """Write the plots of ``report`` as PNGs plus ``report.html`` into ``out_dir`` (a local path or URI, see
    :mod:`anisotropy_core.storage`); returns {asset: path}.

    Always ``spectrum.png``; with ``samples`` (m, d) also ``cosines.png``; with samples and ``metadata``
    ({name: (m,)}) also ``u1_metadata.png``; with ``before`` (the report before a transform; ``report`` is
    the one after) also ``before_after.png`` (cosine panel when ``before_samples`` and ``samples`` are given);
    with ``artefact_directions`` (the per-direction artefact test) also ``artefact_heatmap.png``.
    ``page``: the keyword sections of :func:`html_report` (meanings, verdict, evaluation, clusters).
    """
    figures = {"spectrum": ("Centred spectrum, Marchenko–Pastur band and power-law fit", spectrum_figure(report))}
    if samples is not None:
        figures["cosines"] = ("Sampled pairwise cosines vs isotropic N(0, 1/d)", cosine_histogram_figure(samples))
        if metadata:
            figures["u1_metadata"] = (
                "u1 projection vs metadata (the artefact test)",
                u1_metadata_figure(report, samples, metadata),
            )
    if artefact_directions and any(row["abs_corr"] for row in artefact_directions):
        figures["artefact_heatmap"] = (
            "Per-direction artefact test: |corr| of each principal direction's projection with each metadata column",
            artefact_heatmap_figure(artefact_directions),
        )
    if before is not None:
        figures["before_after"] = (
            "Before / after the transform",
            before_after_figure(before, report, before_samples, samples),
        )
    base = os.fspath(out_dir)
    paths, images = {}, {}
    for name, (caption, fig) in figures.items():
        png = figure_png(fig)
        path = storage.join(base, f"{name}.png")
        storage.write_atomic(path, png)
        paths[name], images[caption] = path, png
    html_path = storage.join(base, "report.html")
    storage.write_atomic(html_path, html_report(report, images, title, **page))
    paths["html"] = html_path
    return paths
