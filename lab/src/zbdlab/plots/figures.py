"""Figures of a comparison. Every function returns a `data:image/png;base64,...` URI so the HTML page
stays self-contained (no files next to it, no network)."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

from zbdlab.parsers.model import CellKey  # noqa: E402
from zbdlab.stats.compare import Analysis, Slope  # noqa: E402
from zbdlab.stats.describe import describe  # noqa: E402

DPI = 80
COLORS = ["#1f4e79", "#c0392b", "#2e8b57", "#8e44ad", "#d68910", "#17a589", "#7f8c8d", "#a04000"]


def _uri(fig: plt.Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _size_label(kb: int | None) -> str:
    if kb is None:
        return "-"
    for unit, factor in (("G", 1024 * 1024), ("M", 1024)):
        if kb >= factor and kb % factor == 0:
            return f"{kb // factor}{unit}"
    return f"{kb}k"


def color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def quartile_plot(analysis: Analysis, operation: str, attr: str, unit: str) -> str:
    """Median with first-to-third-quartile bars against file size or record size, every set."""
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    sizes = sorted(
        {getattr(c, attr) for cells in analysis.cells.values() for c in cells if c.operation == operation},
        key=lambda v: -1 if v is None else v,
    )
    positions = np.arange(len(sizes), dtype=float)
    width = 0.6 / max(1, len(analysis.sets))
    for index, data in enumerate(analysis.sets):
        cells = analysis.cells[data.name]
        xs, med, low, high = [], [], [], []
        for pos, size in zip(positions, sizes, strict=True):
            parts = [v for c, v in cells.items() if c.operation == operation and getattr(c, attr) == size]
            if not parts:
                continue
            q1, median, q3 = np.percentile(np.concatenate(parts), [25, 50, 75])
            xs.append(pos - 0.3 + width * (index + 0.5))
            med.append(median)
            low.append(median - q1)
            high.append(q3 - median)
        ax.errorbar(xs, med, yerr=[low, high], fmt="o", ms=3, capsize=2, color=color(index), label=data.name)
    ax.set_xticks(positions, [_size_label(s) for s in sizes], rotation=60, fontsize=7)
    ax.set_xlabel("file size" if attr == "file_size_kb" else "record size")
    ax.set_ylabel(unit)
    ax.set_title(f"{operation}: median and quartiles", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _uri(fig)


def scatter_plot(analysis: Analysis, set_name: str, cells: list[CellKey], slope: Slope | None) -> str:
    """Per-cell means, baseline on x and set on y, with y = x and the fitted slope and its band."""
    base = analysis.baseline.name
    x = np.array([analysis.cells[base][c].mean() for c in cells])
    y = np.array([analysis.cells[set_name][c].mean() for c in cells])
    fig, ax = plt.subplots(figsize=(3.6, 3.4))
    below = y < x
    ax.scatter(x[below], y[below], s=8, color="#c0392b", label=f"faster in {base}")
    ax.scatter(x[~below], y[~below], s=8, color="black", label=f"faster in {set_name}")
    top = float(max(x.max(), y.max())) * 1.05
    line = np.array([0.0, top])
    ax.plot(line, line, color="black", lw=0.8, label="y = x")
    if slope is not None:
        ax.fill_between(line, line * slope.ci_low, line * slope.ci_high, color="#e74c3c", alpha=0.25, lw=0)
        ax.plot(line, line * slope.slope, color="#e74c3c", lw=1, label=f"y = {slope.slope:.3f}x")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel(f"{base} (mean per cell)")
    ax.set_ylabel(f"{set_name} (mean per cell)")
    ax.set_title(f"{cells[0].operation}: {set_name} vs {base}", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    ax.grid(alpha=0.3)
    return _uri(fig)


def heatmap_plot(analysis: Analysis, set_name: str, cells: list[CellKey], significant: set[CellKey]) -> str:
    """% difference of per-cell means over file size x record size; dots mark cells that differ (BH)."""
    base = analysis.baseline.name
    files = sorted({c.file_size_kb for c in cells}, key=lambda v: -1 if v is None else v)
    records = sorted({c.record_size_kb for c in cells}, key=lambda v: -1 if v is None else v)
    grid = np.full((len(records), len(files)), np.nan)
    for c in cells:
        change = (analysis.cells[set_name][c].mean() / analysis.cells[base][c].mean() - 1) * 100
        grid[records.index(c.record_size_kb), files.index(c.file_size_kb)] = change
    limit = max(5.0, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 5.0)
    limit = min(limit, 100.0)
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdBu", norm=TwoSlopeNorm(0.0, -limit, limit))
    for c in cells:
        if c in significant:
            ax.plot(files.index(c.file_size_kb), records.index(c.record_size_kb), "k.", ms=3)
    ax.set_xticks(range(len(files)), [_size_label(f) for f in files], rotation=60, fontsize=7)
    ax.set_yticks(range(len(records)), [_size_label(r) for r in records], fontsize=7)
    ax.set_xlabel("file size")
    ax.set_ylabel("record size")
    ax.set_title(f"{cells[0].operation}: % difference {set_name} vs {base} (dot: q < alpha)", fontsize=9)
    fig.colorbar(image, ax=ax, label="%")
    return _uri(fig)


def summary_boxplot(analysis: Analysis, operations: list[str]) -> str:
    """Minimum, quartiles, median and maximum per operation and set (whiskers at min and max)."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(operations) * len(analysis.sets)), 3.6))
    count = len(analysis.sets)
    width = 0.8 / count
    for index, data in enumerate(analysis.sets):
        groups, positions = [], []
        for pos, op in enumerate(operations):
            parts = [v for c, v in analysis.cells[data.name].items() if c.operation == op]
            if parts:
                groups.append(np.concatenate(parts))
                positions.append(pos - 0.4 + width * (index + 0.5))
        if not groups:
            continue
        boxes = ax.boxplot(
            groups,
            positions=positions,
            widths=width * 0.9,
            whis=(0, 100),
            patch_artist=True,
            manage_ticks=False,
        )
        for box in boxes["boxes"]:
            box.set(facecolor=color(index), alpha=0.55)
        ax.plot([], [], color=color(index), lw=6, alpha=0.55, label=data.name)
    ax.set_xticks(range(len(operations)), operations, rotation=40, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("MB/s (log scale)")
    ax.set_title("All cells and runs per operation: min, quartiles, median, max", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="best")
    return _uri(fig)


def detail_plot(analysis: Analysis, operation: str, fixed_attr: str, fixed: int | None, unit: str) -> str:
    """Detail mode: mean with its confidence interval over the other size, every set."""
    other = "record_size_kb" if fixed_attr == "file_size_kb" else "file_size_kb"
    fig, ax = plt.subplots(figsize=(6.0, 2.8))
    sizes = sorted(
        {
            getattr(c, other)
            for cells in analysis.cells.values()
            for c in cells
            if c.operation == operation and getattr(c, fixed_attr) == fixed
        },
        key=lambda v: -1 if v is None else v,
    )
    offset = 0.5 / max(1, len(analysis.sets))
    for index, data in enumerate(analysis.sets):
        xs, mean, err = [], [], []
        for pos, size in enumerate(sizes):
            key = (
                CellKey(operation, fixed, size)
                if fixed_attr == "file_size_kb"
                else CellKey(operation, size, fixed)
            )
            values = analysis.cells[data.name].get(key)
            if values is None:
                continue
            s = describe(values, analysis.options.confidence)
            xs.append(pos - 0.25 + offset * (index + 0.5))
            mean.append(s.mean)
            err.append(0.0 if not np.isfinite(s.ci_high) else s.ci_high - s.mean)
        ax.errorbar(xs, mean, yerr=err, fmt="o", ms=3, capsize=2, color=color(index), label=data.name)
    ax.set_xticks(range(len(sizes)), [_size_label(s) for s in sizes], rotation=60, fontsize=7)
    ax.set_xlabel("record size" if other == "record_size_kb" else "file size")
    ax.set_ylabel(unit)
    conf = round(analysis.options.confidence * 100)
    ax.set_title(
        f"{operation}, {fixed_attr.replace('_kb', '')} {_size_label(fixed)}: mean and {conf} % CI", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _uri(fig)


size_label = _size_label
