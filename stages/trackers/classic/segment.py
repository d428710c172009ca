"""Initial object masks from prompts (clicks, a box, a mask) at the working resolution, with OpenCV only.

Clicks: a colour model seeded at the positive clicks is grown into a rough region (likelihood ratio against the
surroundings, connected component holding the click, two re-estimation rounds), then refined by ``cv2.grabCut``
on a local region of interest; then ``cv2.grabCut`` in boxes of several sizes around the click may find more of the
object (``_scale_search``; the rule is above it).  Box: ``cv2.grabCut`` in rectangle mode.  Checks by motion,
run by the session a few frames after a prompt with the flow since its frame: ``refine_box_by_motion`` (what in
the box moves like the background leaves the mask) and ``refine_click_by_motion`` (a click's part grows to what
moves with it).  Pure functions, thread-safe.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from .appearance import REGION_BLUR, ColourModel, bhattacharyya, histogram, quantise
from .state import NEIGHBOURS

logger = logging.getLogger(__name__)

#: size of the colour-model buffers that ``cv2.grabCut`` takes (fixed by OpenCV: 5 Gaussians x 13 numbers)
GMM_SIZE = 65
#: grabCut iterations: a click's region refined (``_grabcut``'s default), a box prompt's mask, a box search's
#: candidate
CLICK_ITERS = 3
BOX_ITERS = 4
COARSE_ITERS = 2
#: clicks inside a box are hard constraints: discs of CLICK_RADIUS x the frame's short side (at least
#: MIN_CLICK_RADIUS px)
CLICK_RADIUS = 0.01
MIN_CLICK_RADIUS = 2


def _disc(shape: tuple[int, int], pts: np.ndarray, r: int) -> np.ndarray:
    m = np.zeros(shape, np.uint8)
    for x, y in pts:
        cv2.circle(m, (int(round(x)), int(round(y))), r, 1, -1)
    return m.astype(bool)


def _click_radius(h: int, w: int) -> int:
    """Radius (px) of a click's hard-constraint disc in a box (``CLICK_RADIUS``)."""
    return max(MIN_CLICK_RADIUS, int(round(CLICK_RADIUS * min(h, w))))


def _component_at(mask: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """The union of the connected components of ``mask`` that hold (or are nearest to) the points."""
    n, lab = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    if n <= 1:
        return np.zeros_like(mask, bool)
    keep = set()
    for x, y in pts:
        xi, yi = int(round(x)), int(round(y))
        lid = lab[yi, xi]
        if lid == 0:  # the click fell in a hole: take the nearest component
            ys, xs = np.nonzero(lab)
            j = int(np.argmin((xs - xi) ** 2 + (ys - yi) ** 2))
            lid = lab[ys[j], xs[j]]
        keep.add(int(lid))
    return np.isin(lab, list(keep))


def _fill_holes(mask: np.ndarray, max_frac: float | None = None) -> np.ndarray:
    """``mask`` with its holes filled; with ``max_frac``, only the holes up to that fraction of the filled area."""
    m = mask.astype(np.uint8)
    cnts, _ = cv2.findContours(m, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    out = np.zeros_like(m)
    cv2.drawContours(out, cnts, -1, 1, -1)
    filled = out.astype(bool)
    if max_frac is None:
        return filled
    holes = filled & ~mask
    if not holes.any():
        return filled
    _, lab, stats, _ = cv2.connectedComponentsWithStats(holes.astype(np.uint8), connectivity=4)
    small = stats[:, cv2.CC_STAT_AREA] <= max_frac * np.count_nonzero(filled)
    small[0] = False
    return mask | small[lab]


def _roi(mask: np.ndarray, pad: float, min_pad: int) -> tuple[int, int, int, int]:
    h, w = mask.shape
    ys, xs = np.nonzero(mask)
    x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
    px = max(min_pad, int((x1 - x0) * pad))
    py = max(min_pad, int((y1 - y0) * pad))
    return max(0, x0 - px), max(0, y0 - py), min(w, x1 + px), min(h, y1 + py)


# grabCut's colour models start from k-means on OpenCV's RNG, and on real footage two runs can differ by a whole
# background region (a fence behind a hockey player).  A box's mask, which the rest of the clip depends on, is the
# pixel-wise majority of VOTES runs.
VOTES = 3


def _grabcut(
    img: np.ndarray,
    init: np.ndarray,
    roi: tuple[int, int, int, int],
    iters: int = CLICK_ITERS,
    votes: int = 1,
) -> np.ndarray:
    """grabCut in mask mode on ``roi``; ``init`` holds GC_* labels for the whole image.  ``votes`` > 1: the
    pixel-wise majority of that many runs."""
    x0, y0, x1, y1 = roi
    crop = np.ascontiguousarray(img[y0:y1, x0:x1])
    count = np.zeros((y1 - y0, x1 - x0), np.int32)
    for _ in range(votes):
        sub = init[y0:y1, x0:x1].copy()  # grabCut writes its labels here: each run starts from ``init``
        bgd, fgd = np.zeros((1, GMM_SIZE), np.float64), np.zeros((1, GMM_SIZE), np.float64)
        try:
            cv2.grabCut(
                crop, sub, (0, 0, 0, 0), bgd, fgd, iters, cv2.GC_INIT_WITH_MASK
            )  # rect ignored in mask mode
        except cv2.error as exc:  # degenerate ROI (e.g. no background sample): keep the initial labelling
            logger.debug("grabCut failed on roi %s: %s", roi, exc)
        count += (sub == cv2.GC_FGD) | (sub == cv2.GC_PR_FGD)
    out = np.zeros(init.shape, bool)
    out[y0:y1, x0:x1] = 2 * count > votes
    return out


#: a region's surroundings, for its distinctness: a ring from OBJECTNESS_GAP px outside it to OBJECTNESS_RING x
#: the square root of its area (at least OBJECTNESS_MIN_RING px)
OBJECTNESS_GAP = 2
OBJECTNESS_RING = 0.3
OBJECTNESS_MIN_RING = 4


def _objectness(qidx: np.ndarray, mask: np.ndarray) -> float:
    """How distinct a candidate region is from its surroundings (Bhattacharyya distance fg vs ring)."""
    m = mask.astype(np.uint8)
    size = max(OBJECTNESS_MIN_RING, int(np.sqrt(m.sum()) * OBJECTNESS_RING))
    ring = cv2.dilate(m, NEIGHBOURS, iterations=size).astype(bool) & ~cv2.dilate(
        m, NEIGHBOURS, iterations=OBJECTNESS_GAP
    ).astype(bool)
    return bhattacharyya(histogram(qidx[mask]), histogram(qidx[ring]))


# One click, no box: grabCut is tried in boxes of several sizes and two shapes centred on the click.  The object is
# taken to be the best-scoring candidate (log(area) + 4 x distinctness, so larger and more distinct regions win) that
# (a) its box holds (the mask touches at most 5 % of the box's border) and (b) stands out from its surroundings
# (Bhattacharyya distance to its ring >= 0.5, and >= 0.7 in the two largest boxes, which hold more background that a
# weak region could absorb).  None qualifies: the colour region under the click is kept.  Chosen on the DAVIS-2016
# dev split (frame-0 IoU 0.32 -> 0.54; docs/classic-tracker.md).
SCALES = (0.11, 0.16, 0.23, 0.32, 0.45)  # half-height of the box, as a fraction of the frame's short side
ASPECTS = (1.3, 0.7)  # half-width / half-height
MAX_TOUCH = 0.05
MIN_DISTINCT = 0.5
MIN_DISTINCT_LARGE = 0.7  # for boxes of SCALES >= LARGE
LARGE = 0.3
DISTINCT_WEIGHT = 4.0
# ...unless the colour region under the click is itself all but perfectly separable from its ring (distinctness
# >= OWN_DISTINCT, e.g. a flat-coloured object) and stands out more than the box search's region: then it is the
# whole object, and the larger box region is that object plus look-alike background (a smooth ramp, JPEG noise).
OWN_DISTINCT = 0.95
COLOUR_MARGIN = 0.2
COARSE_PIXELS = 12_000  # candidates in larger boxes are segmented on a shrunk image ...
COARSE_MIN_SHRINK = 1.25  # ... when it shrinks them by more than this
MIN_COARSE_SIDE = 2  # px of the shrunk image


def _coarse_box_mask(
    img: np.ndarray, box: tuple[float, float, float, float], pos: np.ndarray, neg: np.ndarray
) -> np.ndarray:
    """``mask_from_box`` (2 iterations, no fallback) on an image shrunk so that the box holds at most
    ``COARSE_PIXELS`` pixels: a candidate only needs the object's extent, and grabCut's cost grows with the area."""
    h, w = img.shape[:2]
    f = float(np.sqrt((box[2] - box[0]) * (box[3] - box[1]) / COARSE_PIXELS))
    if f <= COARSE_MIN_SHRINK:
        return mask_from_box(img, box, pos, neg, fallback=False, iters=COARSE_ITERS)
    sw, sh = max(MIN_COARSE_SIDE, int(round(w / f))), max(MIN_COARSE_SIDE, int(round(h / f)))
    sx, sy = sw / w, sh / h
    small = cv2.resize(img, (sw, sh), interpolation=cv2.INTER_AREA)
    scale = np.array([sx, sy], np.float32)
    m = mask_from_box(
        small,
        (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy),
        pos * scale,
        neg * scale,
        fallback=False,
        iters=COARSE_ITERS,
    )
    return cv2.resize(m.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)


def _scale_search(img: np.ndarray, qidx: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> np.ndarray | None:
    """The object under the click, from grabCut in boxes of several sizes around it; None when no box holds one."""
    h, w = qidx.shape
    cx, cy = pos.mean(axis=0)
    best: tuple[float, np.ndarray] | None = None
    for aspect in ASPECTS:
        for frac in SCALES:
            r = frac * min(h, w)
            box = (max(0.0, cx - aspect * r), max(0.0, cy - r), min(w, cx + aspect * r), min(h, cy + r))
            m = _coarse_box_mask(img, box, pos, neg)
            if not m.any():
                continue
            m = _component_at(m, pos)
            if not all(m[int(round(y)), int(round(x))] for x, y in pos):
                continue  # the region next to the click, not under it (a click on background near an object)
            bx0, by0, bx1, by1 = (int(v) for v in box)
            edge = np.concatenate(
                [m[by0, bx0:bx1], m[by1 - 1, bx0:bx1], m[by0:by1, bx0], m[by0:by1, bx1 - 1]]
            )
            touch = float(edge.mean()) if len(edge) else 0.0
            distinct = _objectness(qidx, m)
            score = float(np.log(m.sum())) + DISTINCT_WEIGHT * distinct
            logger.debug(
                "box %.2f/%.1f: area %d touch %.2f distinct %.2f score %.2f",
                frac,
                aspect,
                m.sum(),
                touch,
                distinct,
                score,
            )
            need = MIN_DISTINCT_LARGE if frac >= LARGE else MIN_DISTINCT
            if touch < MAX_TOUCH and distinct >= need and (best is None or score > best[0]):
                best = (score, m)
    return None if best is None else best[1]


# A click's colour region: a colour model seeded at a disc of SEED_RADIUS x the frame's short side (at least
# MIN_SEED_RADIUS px) around each positive click, against the pixels beyond FAR_RADII x that radius, grown to the
# connected pixels whose likelihood ratio (blurred: ``appearance.REGION_BLUR``) is over REGION_LLR; then the model
# is re-estimated against the ring around the region (from RING_GAP px to RING_RADII x the seed radius, at least
# RING_MIN px) and the region grown again, REGION_ROUNDS times in all.  A region over LEAK_AREA of the frame has
# leaked into the background: it is cut back to LEAK_RADII x the seed radius around the clicks.
SEED_RADIUS = 0.022
MIN_SEED_RADIUS = 3
FAR_RADII = 5
REGION_LLR = 0.5
REGION_ROUNDS = 3
RING_GAP = 2
RING_RADII = 2
RING_MIN = 6
LEAK_AREA = 0.25
LEAK_RADII = 4
# grabCut then refines the region in its box padded by GRABCUT_PAD x its size (at least GRABCUT_PAD_RADII x the
# seed radius): the region's core (eroded by half the seed radius, at least MIN_SURE_RADIUS px) and discs of that
# radius at the clicks are sure labels, the border of that box sure background.  Its result replaces the region
# only when its area is within [AGREE_MIN, AGREE_MAX] x the region's.
GRABCUT_PAD = 0.6
GRABCUT_PAD_RADII = 3
MIN_SURE_RADIUS = 2
AGREE_MIN = 0.3
AGREE_MAX = 3


def mask_from_points(
    img: np.ndarray,
    qidx: np.ndarray,
    pos: np.ndarray,
    neg: np.ndarray,
    prior: np.ndarray | None = None,
    search: bool = True,
) -> np.ndarray:
    """Segment the object under the positive clicks ``pos`` ((K, 2) x, y at working resolution).

    ``neg`` points are definite background.  ``prior`` (optional bool mask) is a current estimate to refine, used
    for negative-only corrections.  ``search=False`` skips the box search (about 20x cheaper: the colour region
    under the click only).  Never empty: falls back to a disc around the clicks.
    """
    h, w = qidx.shape
    r0 = max(MIN_SEED_RADIUS, int(round(SEED_RADIUS * min(h, w))))
    seeds = pos if len(pos) else np.zeros((0, 2), np.float32)
    if prior is not None and prior.any():
        rough = prior.copy()
    else:
        rough = _colour_region(qidx, seeds, neg, r0)
    out = _refine_region(img, rough, seeds, neg, r0)
    if search and prior is None and len(seeds):
        out = _with_box_search(img, qidx, out, seeds, neg, r0)
    if not out.any():
        logger.warning("segmentation of the clicked object came out empty; using a disc around the click")
        out = _disc((h, w), seeds if len(seeds) else neg, r0)
    return out


def _colour_region(qidx: np.ndarray, seeds: np.ndarray, neg: np.ndarray, r0: int) -> np.ndarray:
    """The colour region under the clicks ``seeds`` (described above); ``r0``: the seed radius."""
    h, w = qidx.shape
    seed = _disc((h, w), seeds, r0)
    far = ~_disc((h, w), seeds, r0 * FAR_RADII)
    rough = seed
    for _ in range(REGION_ROUNDS):
        model = ColourModel.from_pixels(qidx[rough], qidx[far])
        llr = cv2.GaussianBlur(model.llr(qidx), (0, 0), REGION_BLUR)
        cand = (llr > REGION_LLR) | seed
        if len(neg):
            cand &= ~_disc((h, w), neg, r0)
        cand = cv2.morphologyEx(cand.astype(np.uint8), cv2.MORPH_OPEN, NEIGHBOURS).astype(bool)
        cand |= seed
        rough = _fill_holes(_component_at(cand, seeds))
        if rough.sum() > LEAK_AREA * h * w:  # leaked into the background: stop growing
            rough = seed | (_disc((h, w), seeds, r0 * LEAK_RADII) & rough)
            break
        ring = cv2.dilate(rough.astype(np.uint8), NEIGHBOURS, iterations=max(RING_MIN, r0 * RING_RADII))
        far = ring.astype(bool) & ~cv2.dilate(rough.astype(np.uint8), NEIGHBOURS, iterations=RING_GAP).astype(
            bool
        )
    return rough


def _refine_region(
    img: np.ndarray, rough: np.ndarray, seeds: np.ndarray, neg: np.ndarray, r0: int
) -> np.ndarray:
    """The region ``rough`` refined by grabCut (described above), or ``rough`` when grabCut disagrees with it."""
    h, w = rough.shape
    sure = max(MIN_SURE_RADIUS, r0 // 2)
    init = np.full((h, w), cv2.GC_PR_BGD, np.uint8)
    init[rough] = cv2.GC_PR_FGD
    core = cv2.erode(rough.astype(np.uint8), NEIGHBOURS, iterations=sure).astype(bool)
    init[core] = cv2.GC_FGD
    if len(seeds):
        init[_disc((h, w), seeds, sure)] = cv2.GC_FGD
    if len(neg):
        init[_disc((h, w), neg, sure)] = cv2.GC_BGD
    x0, y0, x1, y1 = _roi(rough, GRABCUT_PAD, GRABCUT_PAD_RADII * r0)
    border = np.zeros((h, w), bool)
    border[y0:y1, x0:x1] = True
    border[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1] = False
    init[border & (init != cv2.GC_FGD)] = cv2.GC_BGD
    out = _grabcut(img, init, (x0, y0, x1, y1))
    if len(seeds):
        out = _component_at(out, seeds) if out.any() else out
    out = _fill_holes(out) if out.any() else out
    area, rough_area = out.sum(), max(1, rough.sum())
    if not (AGREE_MIN * rough_area <= area <= AGREE_MAX * rough_area):
        logger.debug(
            "grabCut disagreed with the colour region (%d vs %d px); keeping the colour region",
            area,
            rough_area,
        )
        out = rough
    return out


def _with_box_search(
    img: np.ndarray, qidx: np.ndarray, out: np.ndarray, seeds: np.ndarray, neg: np.ndarray, r0: int
) -> np.ndarray:
    """``out`` (the click's region) or the box search's region (``_scale_search``) when that finds more of the
    object (see ``OWN_DISTINCT``)."""
    alt = _scale_search(img, qidx, seeds, neg)
    if alt is None:
        return out
    own = _objectness(qidx, out) if out.any() else 0.0
    distinct = _objectness(qidx, alt)
    # the box search is there to find more of the object than the colour region under the click: a region that is
    # smaller and less distinct than that colour region does not replace it, nor one smaller than the seed disc at
    # the click (a detail under the click, e.g. a reflection on a car door); nor does one only a little more
    # distinct than a colour region that is all but perfectly separable (a flat-coloured object)
    smaller = alt.sum() < out.sum() and (distinct <= own or alt.sum() < np.pi * r0 * r0)
    if not smaller and (own < OWN_DISTINCT or distinct + COLOUR_MARGIN >= own):
        return _fill_holes(alt)
    return out


def _around_box(roi: tuple[int, int, int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """The ROI's pixels outside ``box`` (both x0, y0, x1, y1 in frame pixels), in ROI coordinates."""
    x0, y0, x1, y1 = roi
    bx0, by0, bx1, by1 = box
    ring = np.ones((y1 - y0, x1 - x0), bool)
    ring[by0 - y0 : by1 - y0, bx0 - x0 : bx1 - x0] = False
    return ring


# grabCut's smoothness fills regions that the object encloses but that show the background through it (the wheels
# of a bicycle): a region inside the mask whose colour is more likely under the background's model than under the
# mask's, at least HOLE_MIN of the mask and not touching its outline, is opened.  Chosen on the DAVIS-2016 dev split:
# bmx-bumps frame-0 IoU 0.59 -> 0.70 (docs/classic-tracker.md).
HOLE_MIN = 0.02


def _open_holes(
    img: np.ndarray,
    mask: np.ndarray,
    roi: tuple[int, int, int, int],
    box: tuple[int, int, int, int],
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """``mask`` without the enclosed background-coloured regions described above, except those that touch
    ``keep`` (the positive clicks); background model: the ROI outside the box."""
    if not mask.any():
        return mask
    x0, y0, x1, y1 = roi
    q = quantise(np.ascontiguousarray(img[y0:y1, x0:x1]))
    m = mask[y0:y1, x0:x1]
    ring = _around_box(roi, box)
    if not ring.any():
        return mask
    llr = cv2.GaussianBlur(ColourModel.from_pixels(q[m], q[ring]).llr(q), (0, 0), REGION_BLUR)
    cand = cv2.morphologyEx((m & (llr < 0)).astype(np.uint8), cv2.MORPH_OPEN, NEIGHBOURS)
    n, lab, stats, _ = cv2.connectedComponentsWithStats(cand, connectivity=4)
    if n <= 1:
        return mask
    outline = m & ~cv2.erode(m.astype(np.uint8), NEIGHBOURS).astype(bool)
    touching = np.zeros(n, bool)
    touching[np.unique(lab[outline])] = True
    if keep is not None:
        touching[np.unique(lab[keep[y0:y1, x0:x1]])] = True
    drop = (stats[:, cv2.CC_STAT_AREA] >= HOLE_MIN * np.count_nonzero(m)) & ~touching
    drop[0] = False
    if not drop.any():
        return mask
    out = mask.copy()
    out[y0:y1, x0:x1] &= ~drop[lab]
    return out


# A box holds background too, often most of it (a kite-surfer whose box reaches to the kite is 92 % sea).  grabCut
# started with the whole box as probable object learns the background's colours as the object's and keeps them
# where the ring around the box lacks them (the sea near the horizon is darker than the sea around the box).  So
# each box pixel is first scored by how much more often its colour occurs in the box than around it *at the same
# height* (scenes are layered: sky, horizon, ground): CONTRAST_BANDS horizontal bands of the box, each against the
# ring pixels within a band's height of it.  Pixels whose colour is not CONTRAST_MIN (log ratio) more frequent in
# the box start as probable background.  When that finds almost nothing (the object's colours also fill its
# surroundings: a white boat beside its white wake) the plain start is used.  Chosen on the DAVIS-2016 dev split
# (docs/classic-tracker.md).
CONTRAST_BANDS = 4
CONTRAST_MIN = 0.5
ALMOST_NOTHING = 0.05  # of the box's area
BAND_MIN_RING = 50  # ring pixels near a band needed to compare it with them (else: the whole ring)
CONTRAST_EPS = 1e-5  # added to both histograms' frequencies before their ratio
CONTRAST_BLUR = 1.0  # Gaussian sigma (px) of the contrast map
# The grabCut region of a box: the box padded by half its size on each side (at least BOX_MIN_PAD px).  A box under
# MIN_BOX_SIDE px across is its own mask; grabCut finding almost nothing gives the box's inscribed ellipse, its axes
# ELLIPSE_AXES x the box's sides.
BOX_MIN_PAD = 8
MIN_BOX_SIDE = 2
ELLIPSE_AXES = 0.9


def _box_contrast(
    q: np.ndarray, box: tuple[int, int, int, int], roi: tuple[int, int, int, int]
) -> np.ndarray:
    """log(frequency of each box pixel's colour in its band of the box / frequency in the ring around that band),
    lightly blurred; (by1 - by0, bx1 - bx0) float32.  ``q``: the frame's colour-cell indices."""
    bx0, by0, bx1, by1 = box
    x0, y0, x1, y1 = roi
    ring = _around_box(roi, box)
    qr = q[y0:y1, x0:x1]
    out = np.zeros((by1 - by0, bx1 - bx0), np.float32)
    edges = np.linspace(by0, by1, CONTRAST_BANDS + 1).astype(int)
    bh = max(1, (by1 - by0) // CONTRAST_BANDS)
    for ya, yb in zip(edges[:-1], edges[1:]):
        if yb <= ya:
            continue
        near = ring.copy()
        near[: max(0, ya - bh - y0)] = False
        near[max(0, yb + bh - y0) :] = False
        bg = qr[near] if np.count_nonzero(near) >= BAND_MIN_RING else qr[ring]
        band = q[ya:yb, bx0:bx1]
        table = np.log((histogram(band) + CONTRAST_EPS) / (histogram(bg) + CONTRAST_EPS)).astype(np.float32)
        out[ya - by0 : yb - by0] = table[band]
    return cv2.GaussianBlur(out, (0, 0), CONTRAST_BLUR)


def mask_from_box(
    img: np.ndarray,
    box: tuple[float, float, float, float],
    pos: np.ndarray,
    neg: np.ndarray,
    fallback: bool = True,
    iters: int = BOX_ITERS,
    contrast: bool = False,
) -> np.ndarray:
    """grabCut inside ``box`` (x0, y0, x1, y1 at working resolution); clicks are hard constraints.  ``contrast``
    (a box prompt's mask): start from the box's pixels coloured unlike their surroundings (``_box_contrast``),
    falling back to the whole box when that finds almost nothing, and take the majority of ``VOTES`` grabCut runs;
    without it (the click's box search), one run from the whole box."""
    h, w = img.shape[:2]
    bx0, by0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    bx1, by1 = min(w, int(np.ceil(box[2]))), min(h, int(np.ceil(box[3])))
    if bx1 - bx0 < MIN_BOX_SIDE or by1 - by0 < MIN_BOX_SIDE:
        out = np.zeros((h, w), bool)
        out[by0 : max(by1, by0 + 1), bx0 : max(bx1, bx0 + 1)] = True
        return out
    init = np.full((h, w), cv2.GC_BGD, np.uint8)
    init[by0:by1, bx0:bx1] = cv2.GC_PR_FGD
    r = _click_radius(h, w)
    clicked = _disc((h, w), pos, r) if len(pos) else None
    if clicked is not None:
        init[clicked] = cv2.GC_FGD
    if len(neg):
        init[_disc((h, w), neg, r)] = cv2.GC_BGD
    pw, ph = max(BOX_MIN_PAD, (bx1 - bx0) // 2), max(BOX_MIN_PAD, (by1 - by0) // 2)
    roi = (max(0, bx0 - pw), max(0, by0 - ph), min(w, bx1 + pw), min(h, by1 + ph))
    area = (bx1 - bx0) * (by1 - by0)
    out = np.zeros((h, w), bool)
    if contrast:
        cinit = init.copy()
        sub = cinit[by0:by1, bx0:bx1]
        sub[
            (sub == cv2.GC_PR_FGD) & (_box_contrast(quantise(img), (bx0, by0, bx1, by1), roi) <= CONTRAST_MIN)
        ] = cv2.GC_PR_BGD
        if (sub == cv2.GC_PR_FGD).any():
            out = _grabcut(img, cinit, roi, iters=iters, votes=VOTES)
    if out.sum() < ALMOST_NOTHING * area:
        out = _grabcut(img, init, roi, iters=iters, votes=VOTES if contrast else 1)
    if out.any():
        n, lab, stats, _ = cv2.connectedComponentsWithStats(out.astype(np.uint8), connectivity=8)
        if n > 2:  # keep the largest component
            out = lab == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
        out = _open_holes(img, _fill_holes(out), roi, (bx0, by0, bx1, by1), keep=clicked)
    if fallback and out.sum() < ALMOST_NOTHING * area:
        logger.warning("grabCut found almost nothing in box %s; using the box's inscribed ellipse", box)
        out = np.zeros((h, w), np.uint8)
        cv2.ellipse(
            out,
            (
                ((bx0 + bx1) / 2, (by0 + by1) / 2),
                ((bx1 - bx0) * ELLIPSE_AXES, (by1 - by0) * ELLIPSE_AXES),
                0.0,
            ),
            1,
            -1,
        )
        out = out.astype(bool)
    return out


# A box prompt, checked by motion a few frames later: grabCut in a box often takes a background region that the
# box holds (a red fence behind a hockey player, the sand under a horse).  Where the object moves against the
# background, the pixels of the prompt frame whose flow to a later frame the background's motion explains are
# background, whatever their colour.  Chosen on the DAVIS-2016 dev split: frame-0 IoU 0.685 -> 0.71 for boxes,
# 6 -> 4 sequences whose mask is mostly background (docs/classic-tracker.md).
BOX_CHECK_FRAMES = 3  # processed frames after the prompt by which the check has run
# The check runs at the first of those frames at which the object in the box has moved far enough against the
# background for its flow to tell it apart (``box_motion`` >= BOX_CHECK_MOTION working pixels): a fast object (a
# spinning dancer, a running dog) is checked one frame after the prompt, before flow over a large displacement
# breaks down; a slow one waits for up to BOX_CHECK_FRAMES frames.  A check that leaves the mask as it is runs
# again on the next frame, up to BOX_CHECK_FRAMES.  Chosen on the DAVIS-2016 dev split: frame-0 IoU of a box 0.719
# (always 3 frames) -> 0.729; box prompts whose mask ends up mostly background 10.2 % -> 6.0 % of frames
# (docs/classic-tracker.md).
BOX_CHECK_MOTION = 3.0
MOVING_FACTOR = 1.5  # a pixel moves when its residual exceeds this x the 90th percentile of the background's
MIN_KEEP = 0.5  # the checked mask keeps at least this fraction of the box mask (else: a flow failure) ...
# ... unless at least SURE_DROP of what it drops is surely background (textured, moving just like the background):
# then the mask ran into a static look-alike larger than the object's moving part (DAVIS drift-chicane: a click on
# a car's red stripe took the red-rimmed sign in front of it, the sign the larger part; click wrong-object rate 6.4 %
# -> 4.3 % over 3 seeds, with the session's handling of such a part, ``session._moving_part``).  A flat object whose
# flow follows its surroundings drops untextured pixels, and is still rejected.
SURE_DROP = 0.5
STATIC_FACTOR = 0.25  # textured pixels with a residual under this x that percentile are surely background
MIN_SIDE = 40  # boxes narrower than this (working pixels: ~3 DIS patches) are not checked: too little flow
TEXTURE = 100.0  # structure-tensor eigenvalue over which a pixel is textured (flow is trustworthy there)
# The background's residual level is its 90th percentile, but at most this x its median.  Flow noise alone gives
# p90 ~ 1.8 x median; a background with a heavy tail (waves, glints and reflections on water around a boat) has
# p90 far above that, and every pixel of the object then counted as "not moving".  boat on the DAVIS dev split:
# p90 4.6 px, median 1.0, the boat's own median 3.3 - its box check found nothing to keep (frame-0 IoU 0.35;
# with the cap 0.71).  Only for a box prompt's check: in a click's checks (its region growth and its box-style
# check) it took in more background (hockey, horsejump-high): click wrong-object rate 6.4 % -> 7.7 % over 3 seeds.
HEAVY_TAIL = 3.0
BG_PERCENTILE = 90  # the background's residual level: this percentile of its residuals (capped as above)
# The background's motion is fitted to the flow on a grid of one point every BG_GRID px (outside the box), with at
# least BG_MIN_POINTS points, RANSAC inlier threshold BG_RANSAC_PX
BG_GRID = 8
BG_MIN_POINTS = 12
BG_RANSAC_PX = 1.0
MIN_MOVING_PX = 1.0  # a pixel moves only when its residual is also over this many px
MIN_LEVEL = 0.5  # px: the background's residual level is at least this for the "surely background" test
TEXTURE_WINDOW = 7  # px: window of the structure tensor
MOTION_PERCENTILE = 75  # ``box_motion``: this percentile of the mask's residuals
CORE_ERODE = 2  # px the moving part of the mask is eroded by to give grabCut's sure object
BOX_ROI_PAD = 0.5  # grabCut runs in the box padded by this x its size ...
BOX_ROI_MIN_PAD = 8  # ... and at least this many px


def padded_box(mask: np.ndarray, pad: float) -> tuple[float, float, float, float]:
    """The bounding box of ``mask`` (non-empty) grown by ``pad`` x its size on every side, clipped to the frame."""
    h, w = mask.shape
    x0, y0, x1, y1 = _roi(mask, 0.0, 0)
    px, py = pad * (x1 - x0), pad * (y1 - y0)
    return max(0.0, x0 - px), max(0.0, y0 - py), min(float(w), x1 + px), min(float(h), y1 + py)


def _inside(shape: tuple[int, int], box: tuple[float, float, float, float]) -> np.ndarray:
    h, w = shape
    out = np.zeros((h, w), bool)
    bx0, by0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    bx1, by1 = min(w, int(np.ceil(box[2]))), min(h, int(np.ceil(box[3])))
    out[by0:by1, bx0:bx1] = True
    return out


def _residual(flow: np.ndarray, exclude: np.ndarray, robust: bool = False) -> tuple[np.ndarray, float] | None:
    """How far each pixel's flow is from the background's motion, and the background's level of that: its 90th
    percentile outside ``exclude`` (``robust``: capped at ``HEAVY_TAIL`` x its median there).  Background motion:
    an affine map fitted by RANSAC to the flow on a grid outside ``exclude``.  None when it cannot be fitted."""
    h, w = exclude.shape
    ys, xs = np.mgrid[BG_GRID // 2 : h : BG_GRID, BG_GRID // 2 : w : BG_GRID]
    ys, xs = ys.ravel(), xs.ravel()
    sel = ~exclude[ys, xs]
    if sel.sum() < BG_MIN_POINTS:
        return None
    src = np.stack([xs[sel], ys[sel]], 1).astype(np.float32)
    bg, _ = cv2.estimateAffine2D(
        src, src + flow[ys[sel], xs[sel]], method=cv2.RANSAC, ransacReprojThreshold=BG_RANSAC_PX
    )
    if bg is None:
        return None
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    rx = flow[..., 0] - (bg[0, 0] * gx + bg[0, 1] * gy + bg[0, 2] - gx)
    ry = flow[..., 1] - (bg[1, 0] * gx + bg[1, 1] * gy + bg[1, 2] - gy)
    resid = np.sqrt(rx * rx + ry * ry)
    out = resid[~exclude]
    p90 = float(np.percentile(out, BG_PERCENTILE))
    return resid, min(p90, HEAVY_TAIL * float(np.median(out))) if robust else p90


def _moving(flow: np.ndarray, exclude: np.ndarray) -> np.ndarray | None:
    """Pixels whose flow the background's motion does not explain: residual (``_residual``) over
    ``MOVING_FACTOR`` x its 90th percentile outside ``exclude``, and over 1 px."""
    r = _residual(flow, exclude)
    return None if r is None else r[0] > max(MIN_MOVING_PX, MOVING_FACTOR * r[1])


def _textured(img: np.ndarray) -> np.ndarray:
    """Pixels where optical flow is trustworthy: the smaller eigenvalue of the 7x7 structure tensor is over
    ``TEXTURE`` (flat regions - sky, a painted wall - get whatever flow their surroundings have)."""
    g = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).astype(np.float32)
    gx, gy = cv2.Sobel(g, cv2.CV_32F, 1, 0), cv2.Sobel(g, cv2.CV_32F, 0, 1)
    win = (TEXTURE_WINDOW, TEXTURE_WINDOW)
    jxx, jyy, jxy = cv2.blur(gx * gx, win), cv2.blur(gy * gy, win), cv2.blur(gx * gy, win)
    return 0.5 * (jxx + jyy - np.sqrt((jxx - jyy) ** 2 + 4 * jxy**2)) > TEXTURE


def box_motion(box: tuple[float, float, float, float], mask: np.ndarray, flow: np.ndarray) -> float:
    """How far the box's mask has moved against the background in ``flow`` (working pixels): the 75th percentile
    of its pixels' residual (``_residual``, background fitted outside the box); 0 when the background's motion
    cannot be fitted or the mask is empty."""
    if not mask.any():
        return 0.0
    r = _residual(flow, _inside(mask.shape, box))
    return 0.0 if r is None else float(np.percentile(r[0][mask], MOTION_PERCENTILE))


def refine_box_by_motion(
    img: np.ndarray,
    box: tuple[float, float, float, float],
    mask: np.ndarray,
    flow: np.ndarray,
    pos: np.ndarray | None = None,
    neg: np.ndarray | None = None,
    votes: int = 1,
    robust: bool = False,
) -> np.ndarray | None:
    """The box prompt's mask on its frame ``img``, re-segmented with motion: ``flow`` is the dense flow from that
    frame to a later one.  Pixels in the box that move against the background (``_moving``, background fitted
    outside the box) move with the object.  grabCut in mask mode then takes moving pixels of the mask as sure
    object, other moving pixels in the box as probable object, static ones as probable background (surely
    background where textured and moving just like the background); only its components that hold sure-object
    pixels are kept.  The prompt's clicks (``pos``, ``neg``: (K, 2) x, y) stay hard constraints, as in
    ``mask_from_box``, and a component holding a positive click is kept.  None when the box is under ``MIN_SIDE``
    across, nothing in it moves against the background, the background's motion cannot be fitted, or the result
    keeps less than ``MIN_KEEP`` of ``mask`` (textureless objects whose flow follows the background) while less
    than ``SURE_DROP`` of what it drops is surely background.  ``votes``: grabCut runs to take the majority of
    (``_grabcut``); ``robust``: the background's residual level is capped (``HEAVY_TAIL``)."""
    h, w = mask.shape
    if min(box[2] - box[0], box[3] - box[1]) < MIN_SIDE or not mask.any():
        return None
    inbox = _inside((h, w), box)
    r = _residual(flow, inbox, robust=robust)
    if r is None:
        return None
    resid, p90 = r
    moving = inbox & (resid > max(MIN_MOVING_PX, MOVING_FACTOR * p90))
    core = cv2.erode((moving & mask).astype(np.uint8), NEIGHBOURS, iterations=CORE_ERODE).astype(bool)
    if not core.any():
        return None
    init = np.full((h, w), cv2.GC_BGD, np.uint8)
    init[inbox] = cv2.GC_PR_BGD
    init[moving] = cv2.GC_PR_FGD
    # textured pixels that move exactly like the background are background, whatever their colour
    still = inbox & (resid < STATIC_FACTOR * max(p90, MIN_LEVEL)) & _textured(img)
    init[still] = cv2.GC_BGD
    init[core] = cv2.GC_FGD
    r0 = _click_radius(h, w)
    seeds = core.copy()
    if pos is not None and len(pos):
        clicked = _disc((h, w), pos, r0)
        init[clicked] = cv2.GC_FGD
        seeds |= clicked
    if neg is not None and len(neg):
        init[_disc((h, w), neg, r0)] = cv2.GC_BGD
    bx0, by0, bx1, by1 = _roi(inbox, BOX_ROI_PAD, BOX_ROI_MIN_PAD)
    out = _grabcut(img, init, (bx0, by0, bx1, by1), votes=votes)
    n, lab = cv2.connectedComponents(out.astype(np.uint8), connectivity=8)
    if n > 1:  # a look-alike static region that does not touch the moving object is not part of it
        ids = np.unique(lab[seeds & out])
        out = np.isin(lab, ids[ids > 0])
    if out.sum() < MIN_KEEP * mask.sum():
        dropped = mask & ~out
        if (dropped & still).sum() < SURE_DROP * dropped.sum():
            return None
    out = _open_holes(img, _fill_holes(out), (bx0, by0, bx1, by1), _roi(inbox, 0.0, 0), keep=seeds)
    if neg is not None and len(neg):  # filling holes must not take a negative click back in
        out &= ~_disc((h, w), neg, r0)
    return out


# One click, checked by motion: the click's mask is often one part of the object (a patch of a cow, one car of a
# train).  The region that moves against the background and is connected to the mask gives the object's box, and
# the box check above re-segments it.  Flow errors (a flat wall, ground churned up under an animal's feet) also
# "move", so the result is taken only when two estimates, from the flow to CLICK_CHECK_FRAMES[0] and to
# CLICK_CHECK_FRAMES[1] frames after the click, agree (IoU >= CLICK_AGREE), and only when it does not reach the
# frame's border unless the click's own mask did (backgrounds run past the frame).  Chosen on the DAVIS-2016 dev
# split: frame-0 IoU of a click 0.54 -> 0.59 (docs/classic-tracker.md).
CLICK_CHECK_FRAMES = (3, 6)
CLICK_AGREE = 0.65
CLICK_MIN_MOVING = 0.3  # at least this fraction of the click's mask must move against the background
CLICK_MAX_AREA = 0.4  # the moving region may cover at most this fraction of the frame
CLICK_EXCLUDE_PAD = 0.3  # the background's motion is fitted outside the mask's box padded by this x its size
CLICK_OPEN = 5  # px: the moving pixels are opened with a square of this side (flow noise)
CLICK_BOX_PAD = 0.1  # the moving region's box, padded by this x its size, is checked as a box prompt
BORDER = 2  # px: a mask this near the frame's edge touches its border


def touches_border(mask: np.ndarray) -> bool:
    """Whether ``mask`` reaches within ``BORDER`` pixels of the frame's border."""
    b = BORDER
    return bool(mask[:b].any() or mask[-b:].any() or mask[:, :b].any() or mask[:, -b:].any())


def refine_click_by_motion(
    img: np.ndarray,
    mask: np.ndarray,
    flow: np.ndarray,
    pos: np.ndarray | None = None,
    neg: np.ndarray | None = None,
) -> np.ndarray | None:
    """The click's mask ``mask`` on its frame ``img``, re-segmented with the motion ``flow`` to a later frame: the
    box of the region that moves against the background (fitted outside the mask's box padded by
    ``CLICK_EXCLUDE_PAD``) and is connected to the mask, padded by ``CLICK_BOX_PAD``, checked by ``refine_box_by_motion`` (the clicks ``pos``/``neg`` stay hard
    constraints).  None when the mask does not move against the background, the moving region is too large, or
    the result leaves the click's own frame border."""
    h, w = mask.shape
    if not mask.any():
        return None
    moving = _moving(flow, _inside((h, w), padded_box(mask, CLICK_EXCLUDE_PAD)))
    if moving is None:
        return None
    moving = cv2.morphologyEx(
        moving.astype(np.uint8), cv2.MORPH_OPEN, np.ones((CLICK_OPEN, CLICK_OPEN), np.uint8)
    ).astype(bool)
    if (moving & mask).sum() < CLICK_MIN_MOVING * mask.sum():
        return None
    if neg is not None and len(neg):
        moving &= ~_disc((h, w), neg, _click_radius(h, w))
    # the moving region connected to the mask, and every part of the mask (several clicks: several parts)
    region = _component_at(moving | mask, np.argwhere(mask)[:1, ::-1].astype(np.float32)) | mask
    if region.sum() > CLICK_MAX_AREA * h * w:
        return None
    out = refine_box_by_motion(img, padded_box(region, CLICK_BOX_PAD), mask, flow, pos, neg)
    if out is None or (touches_border(out) and not touches_border(mask)):
        return None
    return out


__all__ = [
    "box_motion",
    "mask_from_box",
    "mask_from_points",
    "refine_box_by_motion",
    "refine_click_by_motion",
    "touches_border",
]
