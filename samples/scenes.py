"""Synthetic tracking scenes with exact ground truth, rendered in NumPy/OpenCV.

Each scene is deterministic for a given ``(name, width, height, frames, seed)``: textured backgrounds
(multi-octave value noise, stripes, natural colours), textured objects whose colours partly overlap the
background, sensor noise and a slight blur.  Ground truth is the *visible* part of every object, exact at pixel
level (the raster of the object's outline minus whatever is drawn in front of it).

IoU convention (used by :func:`score_sequence`, the tests and ``benchmarks/bench_tracker.py``): per frame and per
object; when the ground truth is empty (fully occluded / out of view) an empty prediction scores 1.0 and any
non-empty one 0.0; otherwise the standard intersection over union.  The sequence score is the mean over frames and
objects, **excluding frame 0** (the prompted frame).

Command line: ``python -m vostream.samples.scenes --out DIR [--scene NAME] [--size 854x480]`` writes
``DIR/NAME.mp4`` (H.264) and ``DIR/NAME/00000.png``... (palette PNGs, pixel value = object id).

Thread-safety: every function is pure apart from the per-process cache of :func:`render_scene` (thread-safe via
``functools.lru_cache``); returned arrays are shared between callers of the cache, so treat them as read-only.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vostream.pipeline.errors import ConfigError, OutputError, SourceError

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------
# Public types


@dataclass(frozen=True)
class SceneSpec:
    """A named scene: its description, default length and the function that draws it."""

    name: str
    description: str
    frames: int
    n_objects: int
    draw: Callable[[_Ctx], None] = field(repr=False)


@dataclass(eq=False)
class Scene:
    """A rendered scene.

    ``frames`` (T, H, W, 3) RGB uint8; ``labels`` (T, H, W) uint8 ground truth, pixel = object id (0 background);
    ``obj_ids`` the ids 1..N; ``clicks`` (N, 2) float32 ``x, y`` on frame 0, a point well inside each object (its
    distance-transform maximum).
    """

    name: str
    frames: np.ndarray
    labels: np.ndarray
    obj_ids: list[int]
    clicks: np.ndarray
    fps: int = 30

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    def masks(self, t: int) -> np.ndarray:
        """(N, H, W) bool ground-truth masks of frame ``t``, in ``obj_ids`` order."""
        return np.stack([self.labels[t] == oid for oid in self.obj_ids])

    def click(self, obj_id: int) -> tuple[float, float]:
        x, y = self.clicks[self.obj_ids.index(obj_id)]
        return float(x), float(y)


# --------------------------------------------------------------------------------------------------------------
# Texture helpers


def fractal_noise(
    rng: np.random.Generator, h: int, w: int, octaves: int = 5, base: int = 3, persistence: float = 0.55
) -> np.ndarray:
    """(h, w) float32 multi-octave value noise in [0, 1]."""
    out = np.zeros((h, w), np.float32)
    amp, total = 1.0, 0.0
    for o in range(octaves):
        cells = base * 2**o
        gh, gw = max(2, round(cells * h / max(h, w))) + 2, max(2, round(cells * w / max(h, w))) + 2
        grid = rng.random((gh, gw), dtype=np.float32)
        out += amp * cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
        total += amp
        amp *= persistence
    out /= total
    lo, hi = np.percentile(out, (1, 99))
    return np.clip((out - lo) / max(hi - lo, 1e-6), 0, 1)


def colour_field(
    rng: np.random.Generator,
    h: int,
    w: int,
    palette: Sequence[Sequence[int]],
    octaves: int = 5,
    base: int = 3,
    stripes: float = 0.0,
    stripe_period: float = 40.0,
) -> np.ndarray:
    """(h, w, 3) float32 texture mixing ``palette`` colours with noise fields (+ optional stripes)."""
    pal = np.asarray(palette, np.float32)
    img = np.broadcast_to(pal[0], (h, w, 3)).copy()
    for c in pal[1:]:
        n = fractal_noise(rng, h, w, octaves, base)
        a = np.clip((n - 0.35) * 2.2, 0, 1)[..., None]
        img = img * (1 - a) + c * a
    if stripes:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        theta = rng.uniform(0, math.pi)
        s = np.sin(2 * math.pi * (xx * math.cos(theta) + yy * math.sin(theta)) / stripe_period)
        img *= (1 + stripes * s)[..., None]
    detail = fractal_noise(rng, h, w, 3, base=max(8, int(max(h, w) / 12)))
    img *= (0.85 + 0.3 * detail)[..., None]
    return np.clip(img, 0, 255)


def _blob_polygon(
    cx: float,
    cy: float,
    r: float,
    harmonics: Sequence[tuple[int, float, float]],
    angle: float = 0.0,
    aspect: float = 1.0,
    n: int = 96,
) -> np.ndarray:
    """(n, 2) float32 outline: radius r * (1 + sum a_k cos(k theta + phi_k)), rotated by ``angle``."""
    th = np.linspace(0, 2 * math.pi, n, endpoint=False)
    rad = np.ones_like(th)
    for k, a, phi in harmonics:
        rad += a * np.cos(k * th + phi)
    x = r * rad * np.cos(th) * aspect
    y = r * rad * np.sin(th)
    ca, sa = math.cos(angle), math.sin(angle)
    return np.stack([cx + ca * x - sa * y, cy + sa * x + ca * y], 1).astype(np.float32)


def _raster(poly: np.ndarray, h: int, w: int) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    cv2.fillPoly(m, [np.round(poly * 16).astype(np.int32)], 1, lineType=cv2.LINE_8, shift=4)
    return m.astype(bool)


@dataclass
class _Object:
    """A textured object: a square texture patch (side ``2 * tex_r``) mapped by a similarity transform."""

    texture: np.ndarray  # (S, S, 3) float32
    tex_r: float

    def paint(
        self, canvas: np.ndarray, mask: np.ndarray, cx: float, cy: float, scale: float, angle: float = 0.0
    ) -> None:
        """Draw the texture (centred at cx, cy, scaled, rotated) into ``canvas`` where ``mask``."""
        h, w = mask.shape
        s = self.texture.shape[0]
        ca, sa = math.cos(angle) * scale, math.sin(angle) * scale
        m = np.array(
            [[ca, -sa, cx - (ca * s / 2 - sa * s / 2)], [sa, ca, cy - (sa * s / 2 + ca * s / 2)]], np.float32
        )
        ys, xs = np.nonzero(mask)
        if not len(ys):
            return
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        m2 = m.copy()
        m2[:, 2] -= (x0, y0)
        warped = cv2.warpAffine(
            self.texture,
            m2,
            (int(x1 - x0), int(y1 - y0)),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REFLECT,
        )
        sub = mask[y0:y1, x0:x1]
        canvas[y0:y1, x0:x1][sub] = warped[sub]


def _make_object(
    rng: np.random.Generator, r: float, palette: Sequence[Sequence[int]], spots: int = 6, stripes: float = 0.0
) -> _Object:
    s = max(16, int(math.ceil(r * 3)))
    tex = colour_field(rng, s, s, palette, octaves=4, base=2, stripes=stripes, stripe_period=max(6.0, s / 5))
    for _ in range(spots):  # a few darker/lighter spots: the texture is not a flat colour
        c = (int(rng.integers(0, s)), int(rng.integers(0, s)))
        cv2.circle(
            tex,
            c,
            int(rng.integers(max(2, s // 20), max(3, s // 8))),
            tuple(float(v) for v in np.asarray(palette[0], np.float32) * rng.uniform(0.5, 1.3)),
            -1,
            cv2.LINE_AA,
        )
    return _Object(tex, s / 2)


# --------------------------------------------------------------------------------------------------------------
# Rendering context


class _Ctx:
    """What a scene's draw function works with: the size, the rng, and per-frame output buffers."""

    def __init__(self, w: int, h: int, t: int, seed: int, name: str) -> None:
        self.w, self.h, self.t = w, h, t
        self.s = min(w / 854, h / 480)  # length unit: 1 at 854x480
        self.rng = np.random.default_rng([seed, sum(ord(c) * 131**i for i, c in enumerate(name)) % 2**31])
        self.frames = np.zeros((t, h, w, 3), np.uint8)
        self.labels = np.zeros((t, h, w), np.uint8)
        self.noise_sigma = 4.0
        self.blur_sigma = 0.7

    def finish(self, i: int, canvas: np.ndarray, labels: np.ndarray, gain: np.ndarray | float = 1.0) -> None:
        """Apply illumination gain, blur and sensor noise to ``canvas`` and store frame ``i``."""
        img = canvas * gain if not (isinstance(gain, float) and gain == 1.0) else canvas
        img = cv2.GaussianBlur(img, (0, 0), self.blur_sigma)
        noise = np.empty_like(img)
        cv2.randn(noise, 0.0, self.noise_sigma)  # type: ignore[call-overload]  # seeded per frame below for determinism
        img = img + noise
        self.frames[i] = np.clip(img + 0.5, 0, 255).astype(np.uint8)
        self.labels[i] = labels

    def seed_cv(self, i: int) -> None:
        cv2.setRNGSeed(int(self.rng.integers(0, 2**31 - 1)) ^ i)


BG_GREEN = [(70, 95, 50), (120, 130, 70), (45, 60, 35), (150, 140, 105)]
BG_EARTH = [(110, 90, 70), (150, 125, 95), (80, 70, 60), (175, 160, 130)]
BG_URBAN = [(105, 105, 110), (140, 135, 130), (70, 72, 80), (165, 120, 95)]
OBJ_RED = [(175, 55, 45), (205, 95, 70), (120, 40, 35), (150, 125, 95)]  # last colour overlaps BG_EARTH
OBJ_BLUE = [(50, 80, 160), (85, 120, 190), (40, 50, 100), (105, 105, 110)]  # last colour overlaps BG_URBAN
OBJ_YELLOW = [(200, 170, 60), (225, 200, 100), (160, 130, 50), (120, 130, 70)]  # last overlaps BG_GREEN
OBJ_ORANGE = [(200, 110, 40), (230, 150, 80), (150, 80, 30), (150, 140, 105)]


def _path(t: np.ndarray, pts: Sequence[tuple[float, float]]) -> np.ndarray:
    """Piecewise-linear path through ``pts`` (normalised coordinates), eased; t in [0, 1]. Returns (T, 2)."""
    p = np.asarray(pts, np.float32)
    seg = np.clip(t * (len(p) - 1), 0, len(p) - 1 - 1e-6)
    k = seg.astype(int)
    f = seg - k
    f = f * f * (3 - 2 * f)  # ease in/out between waypoints
    return p[k] * (1 - f[:, None]) + p[k + 1] * f[:, None]


# --------------------------------------------------------------------------------------------------------------
# Scenes


def _simple(
    ctx: _Ctx,
    bg_pal: Sequence[Sequence[int]],
    obj_pal: Sequence[Sequence[int]],
    waypoints: list,
    radius: float,
    scale: Callable[[np.ndarray], np.ndarray] | None = None,
    deform: float = 0.0,
    gain: Callable[[int, np.ndarray], np.ndarray | float] | None = None,
    stripes: float = 0.15,
    distractor: tuple[Sequence[Sequence[int]], list] | None = None,
) -> None:
    w, h, t = ctx.w, ctx.h, ctx.t
    bg = colour_field(ctx.rng, h, w, bg_pal, stripes=stripes, stripe_period=48 * ctx.s)
    r = radius * ctx.s
    obj = _make_object(ctx.rng, r, obj_pal)
    harm = [(2, 0.12, ctx.rng.uniform(0, 6.28)), (3, 0.07, ctx.rng.uniform(0, 6.28))]
    tt = np.linspace(0, 1, t)
    path = _path(tt, waypoints) * (w, h)
    sc = scale(tt) if scale is not None else np.ones(t)
    dis = None
    if distractor is not None:
        dis_obj = _make_object(ctx.rng, r * 0.9, distractor[0])
        dis_path = _path(tt, distractor[1]) * (w, h)
        dis = (dis_obj, dis_path)
    for i in range(t):
        ctx.seed_cv(i)
        canvas = bg.copy()
        labels = np.zeros((h, w), np.uint8)
        if dis is not None:
            dp = dis[1][i]
            dpoly = _blob_polygon(
                dp[0], dp[1], r * 0.9, [(2, 0.1, 1.0), (3, 0.08, 2.0)], angle=0.3 + 0.01 * i
            )
            dm = _raster(dpoly, h, w)
            dis[0].paint(canvas, dm, dp[0], dp[1], 1.0, 0.3 + 0.01 * i)
        hi = [(k, a * (1 + deform * math.sin(0.15 * i * k + ph)), ph + deform * 0.1 * i) for k, a, ph in harm]
        if deform:
            hi.append((4, 0.1 * deform * math.sin(0.11 * i), 0.0))
        ang = 0.004 * i
        poly = _blob_polygon(path[i, 0], path[i, 1], r * sc[i], hi, angle=ang, aspect=1.25)
        m = _raster(poly, h, w)
        obj.paint(canvas, m, path[i, 0], path[i, 1], float(sc[i]), ang)
        labels[m] = 1
        ctx.finish(i, canvas, labels, gain(i, canvas) if gain is not None else 1.0)


def _scene_translate(ctx: _Ctx) -> None:
    _simple(ctx, BG_EARTH, OBJ_RED, [(0.2, 0.35), (0.5, 0.6), (0.8, 0.4), (0.6, 0.3)], radius=48)


def _scene_deform(ctx: _Ctx) -> None:
    _simple(
        ctx,
        BG_GREEN,
        OBJ_YELLOW,
        [(0.25, 0.5), (0.5, 0.4), (0.75, 0.55)],
        radius=44,
        scale=lambda tt: 0.7 + 0.8 * np.sin(np.pi * tt) ** 2,
        deform=1.0,
    )


def _scene_illumination(ctx: _Ctx) -> None:
    ctx.noise_sigma = 7.0
    w, h = ctx.w, ctx.h
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)

    def gain(i: int, canvas: np.ndarray) -> np.ndarray:
        g = 1.0 - 0.45 * math.sin(math.pi * i / max(1, ctx.t - 1))  # darkens to 0.55 and back
        lx = w * (0.2 + 0.6 * i / max(1, ctx.t - 1))
        spot = 0.25 * np.exp(-((xx - lx) ** 2 + (yy - h * 0.3) ** 2) / (2 * (0.3 * w) ** 2))
        return (g + spot)[..., None]

    _simple(
        ctx, BG_URBAN, OBJ_BLUE, [(0.3, 0.6), (0.55, 0.45), (0.75, 0.6), (0.5, 0.65)], radius=46, gain=gain
    )


def _scene_distractor(ctx: _Ctx) -> None:
    _simple(
        ctx,
        BG_GREEN,
        OBJ_ORANGE,
        [(0.25, 0.4), (0.45, 0.55), (0.7, 0.45)],
        radius=42,
        distractor=(
            [(190, 105, 45), (225, 145, 85), (140, 75, 30), (150, 140, 105)],
            [(0.6, 0.75), (0.5, 0.7), (0.3, 0.72)],
        ),
    )


def _occluder_scene(
    ctx: _Ctx,
    occ_rects: list[tuple[float, float, float, float]],
    waypoints: list,
    bg_pal: Sequence[Sequence[int]],
    obj_pal: Sequence[Sequence[int]],
    radius: float,
) -> None:
    w, h, t = ctx.w, ctx.h, ctx.t
    bg = colour_field(ctx.rng, h, w, bg_pal, stripes=0.12, stripe_period=40 * ctx.s)
    occ_tex = colour_field(
        ctx.rng,
        h,
        w,
        [(90, 80, 75), (130, 110, 90), (60, 55, 50)],
        base=4,
        stripes=0.25,
        stripe_period=14 * ctx.s,
    )
    occ = np.zeros((h, w), bool)
    for x0, y0, x1, y1 in occ_rects:
        occ[int(y0 * h) : int(y1 * h), int(x0 * w) : int(x1 * w)] = True
    r = radius * ctx.s
    obj = _make_object(ctx.rng, r, obj_pal)
    harm = [(2, 0.1, ctx.rng.uniform(0, 6.28)), (3, 0.06, ctx.rng.uniform(0, 6.28))]
    path = _path(np.linspace(0, 1, t), waypoints) * (w, h)
    for i in range(t):
        ctx.seed_cv(i)
        canvas = bg.copy()
        poly = _blob_polygon(path[i, 0], path[i, 1], r, harm, angle=0.01 * i, aspect=1.2)
        m = _raster(poly, h, w)
        obj.paint(canvas, m, path[i, 0], path[i, 1], 1.0, 0.01 * i)
        canvas[occ] = occ_tex[occ]
        labels = np.zeros((h, w), np.uint8)
        labels[m & ~occ] = 1
        ctx.finish(i, canvas, labels)


def _scene_partial_occlusion(ctx: _Ctx) -> None:
    # a pole narrower than the object: it is cut in two while passing behind it
    _occluder_scene(
        ctx, [(0.47, 0.0, 0.52, 1.0)], [(0.2, 0.5), (0.8, 0.55), (0.3, 0.45)], BG_URBAN, OBJ_RED, 50
    )


def _scene_full_occlusion(ctx: _Ctx) -> None:
    # a wide wall hides the object completely for a while; later it leaves through the right edge and returns
    _occluder_scene(
        ctx,
        [(0.36, 0.15, 0.56, 0.95)],
        [(0.15, 0.55), (0.46, 0.55), (0.7, 0.5), (1.15, 0.5), (0.75, 0.45)],
        BG_EARTH,
        OBJ_BLUE,
        42,
    )


def _scene_crossing(ctx: _Ctx) -> None:
    w, h, t = ctx.w, ctx.h, ctx.t
    bg = colour_field(ctx.rng, h, w, BG_GREEN, stripes=0.15, stripe_period=50 * ctx.s)
    r = 44 * ctx.s
    objs = [_make_object(ctx.rng, r, OBJ_RED), _make_object(ctx.rng, r * 0.95, OBJ_BLUE)]
    tt = np.linspace(0, 1, t)
    paths = [_path(tt, [(0.15, 0.4), (0.85, 0.6)]) * (w, h), _path(tt, [(0.85, 0.45), (0.15, 0.55)]) * (w, h)]
    harm = [[(2, 0.1, 0.5), (3, 0.06, 1.0)], [(2, 0.12, 2.0), (3, 0.05, 0.3)]]
    for i in range(t):
        ctx.seed_cv(i)
        canvas = bg.copy()
        labels = np.zeros((h, w), np.uint8)
        for k in (1, 0):  # object 2 drawn first: object 1 passes in front of it
            p = paths[k][i]
            poly = _blob_polygon(p[0], p[1], r * (1 if k == 0 else 0.95), harm[k], angle=0.01 * i, aspect=1.2)
            m = _raster(poly, h, w)
            objs[k].paint(canvas, m, p[0], p[1], 1.0, 0.01 * i)
            labels[m] = k + 1
        ctx.finish(i, canvas, labels)


def _scene_camera_pan(ctx: _Ctx) -> None:
    w, h, t = ctx.w, ctx.h, ctx.t
    big_w = int(w * 1.8)
    bg = colour_field(ctx.rng, h, big_w, BG_URBAN, stripes=0.2, stripe_period=36 * ctx.s)
    r = 46 * ctx.s
    obj = _make_object(ctx.rng, r, OBJ_ORANGE)
    harm = [(2, 0.1, 0.3), (3, 0.07, 1.3)]
    tt = np.linspace(0, 1, t)
    pan = (big_w - w) * tt  # the camera pans right: the background scrolls left
    path = _path(tt, [(0.3, 0.5), (0.55, 0.4), (0.65, 0.6)]) * (w, h)
    for i in range(t):
        ctx.seed_cv(i)
        m_pan = np.array([[1, 0, -pan[i]], [0, 1, 0]], np.float32)
        canvas = cv2.warpAffine(bg, m_pan, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
        poly = _blob_polygon(path[i, 0], path[i, 1], r, harm, angle=-0.01 * i, aspect=1.3)
        m = _raster(poly, h, w)
        obj.paint(canvas, m, path[i, 0], path[i, 1], 1.0, -0.01 * i)
        labels = np.zeros((h, w), np.uint8)
        labels[m] = 1
        ctx.finish(i, canvas, labels)


SCENES: dict[str, SceneSpec] = {
    s.name: s
    for s in [
        SceneSpec(
            "translate", "textured object translating over a textured background", 90, 1, _scene_translate
        ),
        SceneSpec(
            "deform", "object translating, scaling 0.7x-1.5x and changing its outline", 90, 1, _scene_deform
        ),
        SceneSpec(
            "partial_occlusion",
            "object passing behind a narrow pole (cut in two), then back",
            90,
            1,
            _scene_partial_occlusion,
        ),
        SceneSpec(
            "full_occlusion",
            "object hidden by a wall, re-emerges, leaves the frame right and returns",
            120,
            1,
            _scene_full_occlusion,
        ),
        SceneSpec(
            "crossing", "two objects crossing; object 1 passes in front of object 2", 90, 2, _scene_crossing
        ),
        SceneSpec(
            "camera_pan",
            "camera pans: the whole background scrolls, the object moves relative to it",
            90,
            1,
            _scene_camera_pan,
        ),
        SceneSpec(
            "illumination",
            "global light dims to 55% and back, a moving light spot, stronger noise",
            90,
            1,
            _scene_illumination,
        ),
        SceneSpec(
            "distractor",
            "a similarly coloured (untracked) object passes near the tracked one",
            90,
            1,
            _scene_distractor,
        ),
    ]
}


def _click_points(labels0: np.ndarray, obj_ids: list[int]) -> np.ndarray:
    out = np.zeros((len(obj_ids), 2), np.float32)
    for k, oid in enumerate(obj_ids):
        m = (labels0 == oid).astype(np.uint8)
        if not m.any():
            raise ConfigError(f"scene object {oid} is not visible on frame 0")
        d = cv2.distanceTransform(np.pad(m, 1), cv2.DIST_L2, 5)[1:-1, 1:-1]
        y, x = np.unravel_index(int(np.argmax(d)), d.shape)
        out[k] = (x, y)
    return out


@functools.lru_cache(maxsize=4)
def render_scene(
    name: str, width: int = 854, height: int = 480, frames: int | None = None, seed: int = 0
) -> Scene:
    """Render scene ``name`` (a key of :data:`SCENES`) at ``width`` x ``height``; cached per process.

    ``frames`` defaults to the scene's own length; the motion is spread over whatever length is asked for.
    Raises :class:`ConfigError` for an unknown scene or a size too small to draw it.
    """
    if name not in SCENES:
        raise ConfigError(f"unknown scene {name!r}; choose one of: {', '.join(SCENES)}")
    if width < 64 or height < 48 or width % 2 or height % 2:
        raise ConfigError(f"scene size {width}x{height} is not usable: need even sizes, at least 64x48")
    spec = SCENES[name]
    t = frames if frames is not None else spec.frames
    if t < 2:
        raise ConfigError(f"scene {name!r}: need at least 2 frames, got {t}")
    ctx = _Ctx(width, height, t, seed, name)
    spec.draw(ctx)
    obj_ids = list(range(1, spec.n_objects + 1))
    ctx.frames.setflags(write=False)
    ctx.labels.setflags(write=False)
    return Scene(name, ctx.frames, ctx.labels, obj_ids, _click_points(ctx.labels[0], obj_ids))


# --------------------------------------------------------------------------------------------------------------
# I/O


def write_scene(scene: Scene, path: str | Path, crf: int = 18, gt_dir: str | Path | None = None) -> Path:
    """Encode ``scene.frames`` as H.264 (libx264, yuv420p) MP4 at ``path``; optionally write the GT as palette
    PNGs (``gt_dir/00000.png``..., pixel value = object id).  Raises :class:`OutputError` if it cannot write."""
    import av

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264", rate=scene.fps)
            stream.width, stream.height, stream.pix_fmt = scene.width, scene.height, "yuv420p"
            stream.options = {"crf": str(crf), "preset": "veryfast"}
            for img in scene.frames:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    except (OSError, av.FFmpegError) as exc:
        raise OutputError(f"cannot write scene {scene.name!r} to {path}: {exc}") from exc
    if gt_dir is not None:
        write_gt_pngs(scene, gt_dir)
    return path


def write_gt_pngs(scene: Scene, out_dir: str | Path) -> None:
    """Write the ground truth as DAVIS-style palette PNGs into ``out_dir``."""
    from PIL import Image

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        palette = [0, 0, 0, 220, 40, 40, 40, 90, 230, 240, 200, 40] + [128] * (256 * 3 - 12)
        for i, lab in enumerate(scene.labels):
            im = Image.fromarray(np.ascontiguousarray(lab), mode="P")
            im.putpalette(palette)
            im.save(out / f"{i:05d}.png")
    except OSError as exc:
        raise OutputError(f"cannot write ground-truth PNGs to {out}: {exc}") from exc


def read_video(path: str | Path) -> np.ndarray:
    """Decode every frame of a video file to (T, H, W, 3) RGB uint8 (PyAV).  Raises :class:`SourceError`."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except (OSError, av.FFmpegError, IndexError) as exc:
        raise SourceError(f"cannot decode video {path}: {exc}") from exc
    if not frames:
        raise SourceError(f"video {path} has no frames")
    return np.stack(frames)


def encoded_frames(scene: Scene, workdir: str | Path, crf: int = 18) -> np.ndarray:
    """``scene``'s frames after an H.264 round trip (compression artefacts included)."""
    p = write_scene(scene, Path(workdir) / f"{scene.name}_{scene.width}x{scene.height}.mp4", crf=crf)
    return read_video(p)


# --------------------------------------------------------------------------------------------------------------
# Scoring


def iou(pred: np.ndarray, gt: np.ndarray) -> float:
    """IoU of two boolean masks; 1.0 when both are empty, 0.0 when only one is."""
    pred = np.asarray(pred, bool)
    gt = np.asarray(gt, bool)
    if pred.shape != gt.shape:
        raise ValueError(f"iou: prediction shape {pred.shape} != ground truth shape {gt.shape}")
    union = np.count_nonzero(pred | gt)
    if union == 0:
        return 1.0
    return float(np.count_nonzero(pred & gt)) / union


@dataclass
class SequenceScore:
    """Per-object mean IoU (frame 0 excluded), the overall mean, and the per-frame IoUs (T-1, N)."""

    per_object: dict[int, float]
    mean: float
    per_frame: np.ndarray


def score_sequence(
    preds: Iterable[np.ndarray], scene: Scene, obj_ids: Sequence[int] | None = None
) -> SequenceScore:
    """Score predicted masks against ``scene``'s ground truth.

    ``preds`` yields one entry per frame (frame 0 first): either (N, H, W) bool masks in ``obj_ids`` order
    (default ``scene.obj_ids``) or an (H, W) integer label map.  Frame 0 is skipped (the prompted frame).
    """
    ids = list(obj_ids) if obj_ids is not None else list(scene.obj_ids)
    rows = []
    for t, p in enumerate(preds):
        if t >= len(scene):
            raise ValueError(f"more predictions than the {len(scene)} frames of scene {scene.name!r}")
        if t == 0:
            continue
        p = np.asarray(p)
        gt = scene.labels[t]
        if p.ndim == 2:
            rows.append([iou(p == oid, gt == oid) for oid in ids])
        else:
            rows.append([iou(p[k], gt == oid) for k, oid in enumerate(ids)])
    per_frame = np.asarray(rows, np.float64).reshape(-1, len(ids))
    per_obj = {
        oid: float(per_frame[:, k].mean()) if len(per_frame) else float("nan") for k, oid in enumerate(ids)
    }
    mean = float(per_frame.mean()) if per_frame.size else float("nan")
    return SequenceScore(per_obj, mean, per_frame)


# --------------------------------------------------------------------------------------------------------------
# CLI


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--size must look like 854x480, got {text!r}") from None
    return w, h


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vostream.samples.scenes",
        description="Write synthetic scenes (MP4 + ground-truth PNGs).",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--scene", action="append", choices=sorted(SCENES), help="scene name (repeatable); default: all"
    )
    parser.add_argument("--size", default="854x480", help="WxH (default 854x480)")
    parser.add_argument(
        "--frames", type=int, default=None, help="frames per scene (default: the scene's own)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gt", action="store_true", help="skip the ground-truth PNGs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        w, h = _parse_size(args.size)
        out = Path(args.out)
        for name in args.scene or list(SCENES):
            scene = render_scene(name, w, h, args.frames, args.seed)
            mp4 = write_scene(scene, out / f"{name}.mp4", gt_dir=None if args.no_gt else out / name)
            logger.info("wrote %s (%d frames, %dx%d)", mp4, len(scene), w, h)
    except (ConfigError, OutputError) as exc:
        parser.exit(exc.exit_code, f"error: {exc}\n")
    return 0


__all__ = [
    "SCENES",
    "Scene",
    "SceneSpec",
    "SequenceScore",
    "encoded_frames",
    "iou",
    "read_video",
    "render_scene",
    "score_sequence",
    "write_gt_pngs",
    "write_scene",
]

if __name__ == "__main__":
    raise SystemExit(main())
