"""The viewer in a real Chromium (Debian ``chromium`` driven by PyPI ``playwright``; no browser download).

Open the page, wait for the first (paused) frame, click the object of a synthetic scene, play, and check from
``window.__vostream`` and from the server that masks arrive and are drawn and that the tracked mask overlaps the
ground truth; then a second object, a correction on a paused frame, and a screenshot that is not blank.
Skipped with a message when chromium or playwright is missing (``.ci/run`` installs both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("playwright.sync_api", reason="needs PyPI playwright (pip install -e '.[test]')")
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/lib/chromium/chromium") if os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

from vostream.pipeline.apps.serve.server import ServerConfig, ServerThread  # noqa: E402
from vostream.samples.scenes import iou, render_scene, write_scene  # noqa: E402
from vostream.sinks.websocket import decode_rle_counts  # noqa: E402

ARTEFACTS = Path(os.environ.get("VOSTREAM_TEST_ARTEFACTS", tempfile.gettempdir())) / "vostream-test-artefacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def scene_media(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("media")
    scene = render_scene("crossing", width=320, height=240, frames=60)
    write_scene(scene, root / "crossing.mp4")
    return root, scene


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="vostream-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 900, "height": 560},
            bypass_csp=True,
        )  # page.evaluate needs eval; the page keeps its CSP otherwise
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


def _click_at(page, x: float, y: float, **kw) -> None:
    """Click source pixel (x, y): map to CSS pixels of the (scaled) canvas, as a user's mouse would land."""
    box = page.locator("#view").bounding_box()
    w, h = page.evaluate("[document.getElementById('view').width, document.getElementById('view').height]")
    page.mouse.click(box["x"] + (x + 0.5) * box["width"] / w, box["y"] + (y + 0.5) * box["height"] / h, **kw)


def test_click_to_track_in_chromium(scene_media, browser) -> None:
    root, scene = scene_media
    config = ServerConfig(port=0, media_root=str(root), default_source="crossing.mp4")
    with ServerThread(config) as server:
        page = browser.new_page()
        logs: list[str] = []
        page.on("console", lambda m: logs.append(m.text))
        page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
        page.goto(server.url)
        page.wait_for_function("window.__vostream && window.__vostream.frames >= 1", timeout=20000)
        st = page.evaluate("window.__vostream")
        assert st["lastIndex"] == 0 and st["state"]["playing"] is False, "the first frame is shown paused"

        # the canvas is shown scaled (window smaller than the frame would also work): click object 1
        x1, y1 = scene.click(1)
        _click_at(page, x1, y1)
        page.wait_for_function("window.__vostream.masksDrawn >= 1", timeout=15000)
        area0 = page.evaluate("window.__vostream.objs[1].area")
        gt0 = scene.masks(0)[0]
        assert area0 > 0.5 * gt0.sum(), "the first click's mask is drawn on the paused frame"

        # a second object with its own colour, before playing
        page.keyboard.press("n")
        x2, y2 = scene.click(2)
        _click_at(page, x2, y2)
        page.wait_for_function(
            "window.__vostream.objs[2] && window.__vostream.objs[2].area > 0", timeout=15000
        )
        assert page.evaluate("window.__vostream.state.objects") == [1, 2]
        assert page.evaluate("document.querySelectorAll('#objects li').length") == 2

        page.keyboard.press("Space")  # play
        page.wait_for_function(f"window.__vostream.lastIndex >= {len(scene) - 1}", timeout=30000)
        st = page.evaluate("window.__vostream")
        assert not [m for m in logs if m.startswith("pageerror")], logs

        # server side: what was sent, decoded with pycocotools, against the ground truth
        session = server.call(lambda: next(iter(server.server.sessions.values())))
        record = dict(session.record.items())
        assert set(range(len(scene))) <= set(record), "every frame reached the viewer sink"
        ious = []
        for t in range(1, len(scene)):
            for oid in (1, 2):
                row = next(r for r in record[t].rows if r[0] == oid)
                pred = decode_rle_counts(row[4], 240, 320) if row[4] else np.zeros((240, 320), bool)
                ious.append(iou(pred, scene.labels[t] == oid))
                browser_area = st["areaByIndex"].get(str(t), {}).get(str(oid))
                if browser_area is not None:  # drawn frames: the browser decoded the same mask
                    assert browser_area == int(pred.sum()), f"frame {t}: browser decoded a different mask"
        assert np.mean(ious) >= 0.8, f"mean IoU {np.mean(ious):.3f} over the clip"
        assert st["frames"] >= len(scene) // 2 and st["masksDrawn"] >= len(scene) // 2
        assert st["p50"] is not None and 0 <= st["p50"] < 1000
        page.wait_for_function("window.__vostream.state.ended === true", timeout=5000)  # held at the end

        # a correction on the paused (held) last frame: a negative click far from object 2 re-tracks that frame
        page.locator("#objects li").nth(1).click()
        drawn = st["frames"]
        _click_at(page, 2, 2, button="right")
        page.wait_for_function(
            f"window.__vostream.frames > {drawn}", timeout=15000
        )  # the frame is re-tracked
        objs = page.evaluate("window.__vostream.objs")
        assert objs["1"]["area"] > 0 and objs["2"]["area"] > 0
        assert page.evaluate("window.__vostream.lastIndex") == len(scene) - 1
        assert page.evaluate("window.__vostream.errors.length") == 0, page.evaluate(
            "window.__vostream.errors"
        )

        # stats overlay and the screenshot
        page.wait_for_function("window.__vostream.server !== null", timeout=5000)
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTEFACTS / "viewer.png"
        page.locator("#view").screenshot(path=str(shot))
        from PIL import Image

        img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        assert img.std() > 10, "the screenshot is blank"
        # object 1's colour (DAVIS 1 = dark red) is blended in somewhere: red clearly above green and blue
        reddish = (img[..., 0] > img[..., 1] + 40) & (img[..., 0] > img[..., 2] + 40)
        assert reddish.sum() > 50, "no mask overlay visible in the screenshot"
        page.close()


def test_viewer_figures_in_chromium(scene_media, browser) -> None:
    """The stats overlay's figures: a redraw after a click is no latency sample (a click after a pause used to
    add the pause as latency), fps counts playing time only, and the clock offset comes from the least disturbed
    ping among pings spread over time (same host here: the true offset is ~0)."""
    root, scene = scene_media
    config = ServerConfig(port=0, media_root=str(root), default_source="crossing.mp4")
    with ServerThread(config) as server:
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_function("window.__vostream && window.__vostream.frames >= 1", timeout=20000)

        # the computations themselves
        api = "window.__vostreamApi"
        assert (
            page.evaluate(f"{api}.clockOffset([{{rtt: 50, offset: 900}}, {{rtt: 2, offset: 3}}]).offset") == 3
        )
        assert page.evaluate(f"{api}.clockOffset([])") is None
        assert page.evaluate(f"{api}.fpsOf([0, 40, 80, 120])") == 25
        for args, want in (
            ("{capture_ms: 1000}, true, 1050, 0, true", 50),
            ("{capture_ms: 1000}, false, 9000, 0, true", None),  # a redraw
            ("{capture_ms: 1000, held: true}, true, 9000, 0, true", None),  # a watcher's held frame
            ("{capture_ms: 1000}, true, 1050, 0, false", None),  # no clock estimate yet
        ):
            assert page.evaluate(f"{api}.latencySample({args})") == want, args

        # clock: several pongs spread over time; on one host the offset is within half the best round trip
        page.wait_for_function("window.__vostream.pongs >= 3", timeout=10000)
        st = page.evaluate("window.__vostream")
        assert abs(st["offset"]) <= st["rtt"] / 2 + 2, (st["offset"], st["rtt"])

        # a click after a pause: the local redraw is no latency sample, the re-tracked frame is (and is fresh)
        page.wait_for_timeout(1500)
        x1, y1 = scene.click(1)
        _click_at(page, x1, y1)
        page.wait_for_function("window.__vostream.masksDrawn >= 1", timeout=15000)
        st = page.evaluate("window.__vostream")
        assert st["redraws"] >= 1
        assert st["lat"] and max(st["lat"]) < 1000, st["lat"]

        # fps over playing time only: play, pause 1.5 s, play again
        page.keyboard.press("Space")
        page.wait_for_function("window.__vostream.lastIndex >= 10", timeout=15000)
        page.keyboard.press("Space")
        page.wait_for_function("window.__vostream.state.playing === false", timeout=5000)
        page.wait_for_timeout(300)
        assert page.evaluate("window.__vostream.fps") == 0, "paused: no fps"
        page.wait_for_timeout(1200)
        start = page.evaluate("window.__vostream.lastIndex")
        page.keyboard.press("Space")
        page.wait_for_function(f"window.__vostream.lastIndex >= {start + 20}", timeout=15000)
        fps = page.evaluate("window.__vostream.fps")
        assert 0.6 * scene.fps <= fps <= 1.5 * scene.fps, (fps, scene.fps)
        assert max(page.evaluate("window.__vostream.lat")) < 1000
        page.close()
