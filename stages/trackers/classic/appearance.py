"""Per-object colour appearance model: foreground vs local-background RGB histograms.

Colours are quantised to ``BINS`` levels per channel (``BINS**3`` cells).  :func:`quantise` maps an RGB image to
cell indices once per frame; :class:`ColourModel` turns indices into a log likelihood ratio
``log p(c | object) / p(c | background)`` with a lookup table.  Not thread-safe (owned by one session).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)

BITS = 4
BINS = 1 << BITS
CELLS = BINS**3
LLR_CLIP = 4.0  #: the log likelihood ratio is clipped to +-this
#: a histogram is smoothed by keeping SMOOTH_SELF of each cell's mass and giving SMOOTH_NEIGHBOUR to each of its 6
#: neighbours (0.4 + 6 x 0.1 = 1)
SMOOTH_SELF = 0.4
SMOOTH_NEIGHBOUR = 0.1
#: a model update needs more than this many pixels of a kind
MIN_UPDATE_PIXELS = 20
#: added to both histograms before their ratio: this x a uniform histogram's cell
EPS_MASS = 0.1
#: Gaussian sigma (px) of the colour log likelihood ratio where a region is found from colour alone - the rough
#: region under a click, the holes of a box's mask, the candidates of a re-acquisition - and thresholded: with no
#: shape prior to regularise it, the blur makes the thresholded region coherent.  (A tracked object's ratio, added
#: to a shape prior, is blurred less: ``ColourParams.blur``.)
REGION_BLUR = 1.5


def quantise(rgb: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(H, W) uint16 colour-cell index of an RGB uint8 image."""
    q = rgb >> (8 - BITS)
    if out is None:
        out = np.empty(rgb.shape[:2], np.uint16)
    np.multiply(q[..., 0], BINS * BINS, out=out, dtype=np.uint16)
    out += q[..., 1].astype(np.uint16) * BINS
    out += q[..., 2]
    return out


def _smooth(h: np.ndarray) -> np.ndarray:
    """Spread each cell's mass to its 6 neighbours (a small 3-D blur), so unseen but similar colours count."""
    c = h.reshape(BINS, BINS, BINS)
    out = c * SMOOTH_SELF
    for ax in range(3):
        out[(slice(None),) * ax + (slice(1, None),)] += (
            SMOOTH_NEIGHBOUR * c[(slice(None),) * ax + (slice(None, -1),)]
        )
        out[(slice(None),) * ax + (slice(None, -1),)] += (
            SMOOTH_NEIGHBOUR * c[(slice(None),) * ax + (slice(1, None),)]
        )
    return out.reshape(-1)


def histogram(idx: np.ndarray) -> np.ndarray:
    """Normalised, smoothed (CELLS,) float64 histogram of colour-cell indices (uniform when ``idx`` is empty)."""
    if idx.size == 0:
        return np.full(CELLS, 1.0 / CELLS)
    h = _smooth(np.bincount(idx.ravel(), minlength=CELLS).astype(np.float64))
    return h / h.sum()


def bhattacharyya(p: np.ndarray, q: np.ndarray) -> float:
    """Bhattacharyya distance sqrt(1 - sum sqrt(p q)) of two normalised histograms (0 same, 1 disjoint)."""
    bc = float(np.sqrt(p * q).sum())
    return float(np.sqrt(max(0.0, 1.0 - bc)))


@dataclass
class ColourModel:
    """Foreground and background colour histograms and their log-likelihood-ratio table."""

    fg: np.ndarray = field(default_factory=lambda: np.full(CELLS, 1.0 / CELLS))
    bg: np.ndarray = field(default_factory=lambda: np.full(CELLS, 1.0 / CELLS))
    table: np.ndarray = field(default_factory=lambda: np.zeros(CELLS, np.float32))

    @classmethod
    def from_pixels(cls, fg_idx: np.ndarray, bg_idx: np.ndarray) -> ColourModel:
        m = cls(histogram(fg_idx), histogram(bg_idx))
        m._refresh()
        return m

    def update(
        self, fg_idx: np.ndarray | None, bg_idx: np.ndarray | None, fg_rate: float, bg_rate: float
    ) -> None:
        """Blend new pixel histograms in with exponential forgetting (``rate`` = weight of the new data)."""
        if fg_idx is not None and fg_idx.size > MIN_UPDATE_PIXELS and fg_rate > 0:
            self.fg = (1 - fg_rate) * self.fg + fg_rate * histogram(fg_idx)
        if bg_idx is not None and bg_idx.size > MIN_UPDATE_PIXELS and bg_rate > 0:
            self.bg = (1 - bg_rate) * self.bg + bg_rate * histogram(bg_idx)
        self._refresh()

    def _refresh(self) -> None:
        eps = EPS_MASS / CELLS
        self.table = np.clip(np.log((self.fg + eps) / (self.bg + eps)), -LLR_CLIP, LLR_CLIP).astype(
            np.float32
        )

    def llr(self, idx: np.ndarray) -> np.ndarray:
        """float32 log likelihood ratio per pixel for an index image."""
        return self.table[idx]


__all__ = ["BINS", "CELLS", "REGION_BLUR", "ColourModel", "bhattacharyya", "histogram", "quantise"]
