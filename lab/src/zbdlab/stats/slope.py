"""Orthogonal (total least squares) fits of per-cell means: y = a*x through the origin, as the original
comparator drew in its baseline-vs-set scatter, and a free line on log scale. Both take arrays with the
cells on the last axis, so one call fits every bootstrap replicate at once."""

from __future__ import annotations

import numpy as np


def _tls_slope(sxx: np.ndarray, syy: np.ndarray, sxy: np.ndarray) -> np.ndarray:
    # Direction of the principal axis of [[sxx, sxy], [sxy, syy]]; minimises perpendicular distances.
    with np.errstate(divide="ignore", invalid="ignore"):
        return (syy - sxx + np.sqrt((syy - sxx) ** 2 + 4 * sxy**2)) / (2 * sxy)


def tls_through_origin(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _tls_slope((x * x).sum(-1), (y * y).sum(-1), (x * y).sum(-1))


def tls_line(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slope and intercept of the orthogonal fit y = c + d*x."""
    xc = x - x.mean(-1, keepdims=True)
    yc = y - y.mean(-1, keepdims=True)
    d = _tls_slope((xc * xc).sum(-1), (yc * yc).sum(-1), (xc * yc).sum(-1))
    return d, y.mean(-1) - d * x.mean(-1)
