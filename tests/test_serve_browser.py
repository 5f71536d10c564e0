"""`vlctl serve` end to end in a real headless Chromium (Debian's /usr/bin/chromium driven by
playwright; no browser is downloaded): text search -> thumbnails loaded; switching the attribute
reorders; Explain renders heatmaps; every tab is reached with Tab and opened with Enter; a
screenshot per tab (into $VLCTL_SCREENSHOTS as serve-<tab>.png when set, else a temporary dir).

The server is uvicorn in a thread on a free port of 127.0.0.1, started once for the module, over
the tiny world of test_serve_api. `test_demo_screenshots` (slow; needs VLCTL_SERVE_DEMO=runs/demo)
does the same walk over the demo's stores: the README's screenshots.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from conftest import CHROMIUM
from test_serve_api import shared_world, world_state

# tests/conftest.py skips the module where Chromium ($VLCTL_CHROMIUM, else /usr/bin/chromium) or playwright is missing.
pytestmark = pytest.mark.needs_chromium
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
TABS = ("search", "steer", "clusters", "explain", "reports")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread."""

    def __init__(self, app):
        import uvicorn

        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.05)
        raise RuntimeError("uvicorn did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def _report(root: Path) -> Path:
    rep = root / "reports" / "tiny-recipe"
    (rep / "figures").mkdir(parents=True)
    Image.new("RGB", (60, 30), (200, 80, 40)).save(rep / "figures" / "bar.png")
    (rep / "report.html").write_text("<!doctype html><h1>tiny-recipe</h1><table><tr><th>metric</th><th>ours</th>"
                                     "</tr><tr><td>mAP</td><td>0.5</td></tr></table><img src='figures/bar.png'>")
    return rep.parent


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, browser):
    from vlctl.serve.app import create_app
    from vlctl.serve.state import find_reports

    root = tmp_path_factory.mktemp("serve-browser")
    state = world_state(shared_world(tmp_path_factory))
    state.reports = find_reports(_report(root))
    with Server(create_app(state)) as s:
        yield s


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("VLCTL_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _all_loaded(page, selector: str) -> int:
    """Wait until every image matching `selector` has decoded pixels; their number."""
    page.wait_for_function("""(sel) => { const im = [...document.querySelectorAll(sel)];
        return im.length > 0 && im.every((i) => i.complete && i.naturalWidth > 0); }""", arg=selector, timeout=20_000)
    return page.eval_on_selector_all(selector, "els => els.length")


def _ids(page, selector: str) -> list[int]:
    return page.eval_on_selector_all(selector, "els => els.map((e) => Number(e.dataset.id))")


def _tab_by_keyboard(page, tab: str) -> None:
    """Reach the tab's button with Tab presses alone and open it with Enter."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.focus("body")
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement && document.activeElement.id") == f"tab-{tab}":
            break
    else:
        raise AssertionError(f"tab-{tab} is not reachable with Tab")
    page.keyboard.press("Enter")
    assert page.get_attribute(f"#tab-{tab}", "aria-selected") == "true"
    assert page.is_visible(f"#panel-{tab}")


def walk(page, url: str, shots: Path, scenario: dict) -> dict:
    """The five tabs as a user drives them; returns what was seen."""
    seen: dict = {}
    page.goto(url)
    page.wait_for_function("document.getElementById('status').textContent === 'ready'", timeout=30_000)
    for tab in (*TABS[1:], TABS[0]):
        _tab_by_keyboard(page, tab)

    # Search: a text query typed and sent with Enter; the thumbnails load.
    page.fill("#search-text", scenario["text"])
    page.press("#search-text", "Enter")
    page.wait_for_selector("#search-results .hit img")
    seen["search"] = _all_loaded(page, "#search-results .hit img")
    first = _ids(page, "#search-results .hit")
    page.screenshot(path=str(shots / "serve-search.png"), full_page=True)
    page.focus("#search-results .hit >> nth=1")  # a result, by keyboard: searches by that image
    page.keyboard.press("Enter")
    page.wait_for_function("(id) => document.getElementById('search-heading').textContent === `Images like image ${id}`",
                           arg=first[1])
    seen["search_by_image"] = first[1] in _ids(page, "#search-results .hit")
    _all_loaded(page, "#search-results .hit img")

    # Steer: the same query image by two attributes, then a blend.
    page.click("#tab-steer")
    if scenario.get("steer_collection"):
        page.select_option("#steer-collection", scenario["steer_collection"])
    page.fill("#steer-image-id", str(scenario["image_id"]))
    page.fill("#steer-attribute", scenario["attributes"][0])
    page.click("#steer-go")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('attribute')")
    a = _ids(page, "#steer-results .hit")
    page.fill("#steer-attribute", scenario["attributes"][1])
    page.dispatch_event("#steer-attribute", "change")  # choosing another attribute re-ranks at once
    page.wait_for_function("(a) => JSON.stringify([...document.querySelectorAll('#steer-results .hit')]"
                           ".map((e) => Number(e.dataset.id))) !== a", arg=str(a).replace(" ", ""), timeout=20_000)
    seen["steer_orders"] = (a, _ids(page, "#steer-results .hit"))
    _all_loaded(page, "#steer-results .hit img")
    page.screenshot(path=str(shots / "serve-steer.png"), full_page=True)
    if scenario.get("tevi_collection"):
        page.select_option("#steer-collection", scenario["tevi_collection"])
        page.check("#steer-tevi")
        page.fill("#steer-text", scenario["tevi_text"])
        page.click("#steer-go")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('TEVI')", timeout=30_000)
        seen["tevi_status"] = page.text_content("#status")
        _all_loaded(page, "#steer-results .hit img")
        page.screenshot(path=str(shots / "serve-steer-tevi.png"), full_page=True)

    # Clusters: a background job, polled; strips of thumbnails.
    page.click("#tab-clusters")
    page.select_option("#cluster-attribute", scenario["attributes"][0])
    page.click("#cluster-go")
    page.wait_for_selector("#cluster-results .cluster", timeout=30_000)
    seen["clusters"] = page.eval_on_selector_all("#cluster-results .cluster", "els => els.length")
    _all_loaded(page, "#cluster-results .hit img")
    page.screenshot(path=str(shots / "serve-clusters.png"), full_page=True)

    # Explain: the picked image with a negative; heatmaps of both models, colour bars, the tree.
    page.click("#tab-explain")
    page.click("#explain-picks .hit >> nth=0")
    page.fill("#explain-negative", scenario.get("negative", ""))
    page.click("#explain-go")
    page.wait_for_selector(".heatmaps img", timeout=60_000)
    seen["heatmaps"] = _all_loaded(page, ".heatmaps img.heatmap")
    seen["bars"] = _all_loaded(page, ".bars img")
    seen["models"] = page.eval_on_selector_all(".model h3", "els => els.map((e) => e.textContent)")
    page.screenshot(path=str(shots / "serve-explain.png"), full_page=True)

    # Reports: the report in its frame.
    page.click("#tab-reports")
    frame = page.frame_locator("#report-frame")
    frame.locator("h1").wait_for(timeout=20_000)
    seen["report_title"] = frame.locator("h1").first.text_content()
    page.screenshot(path=str(shots / "serve-reports.png"), full_page=True)
    return seen


def test_page_in_chromium(browser, server, tmp_path):
    shots = _shots(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    seen = walk(page, server.url, shots, {"text": "a red square", "image_id": 3, "attributes": ("color", "size"),
                                          "tevi_collection": "store",
                                          "tevi_text": "a big blue square"})
    page.close()
    assert seen["search"] == 24 and seen["search_by_image"]
    a, b = seen["steer_orders"]
    assert len(a) == len(b) == 24 and a != b
    assert "results moved" in seen["tevi_status"]
    assert seen["clusters"] == 3
    # No negative here (the Anchor map parses both captions with spaCy, seconds to load; the API test
    # has it): HilaCAM of P per model, and its colour bar.
    assert seen["heatmaps"] == 2 and seen["bars"] == 1 and seen["models"] == ["base", "tuned"]
    assert seen["report_title"] == "tiny-recipe"
    assert not errors, errors
    for tab in TABS:
        with Image.open(shots / f"serve-{tab}.png") as im:
            assert im.size[0] == 1280 and im.size[1] >= 300


@pytest.mark.slow
def test_demo_screenshots(browser, tmp_path):
    """The README's screenshots: VLCTL_SERVE_DEMO=runs/demo VLCTL_SCREENSHOTS=docs/figures."""
    demo = os.environ.get("VLCTL_SERVE_DEMO")
    if not demo:
        pytest.skip("set VLCTL_SERVE_DEMO to the demo's directory (runs/demo)")
    from vlctl.serve.app import create_app
    from vlctl.serve.demo import demo_state

    state = demo_state(demo)
    # What `make demo` leaves behind: MAD is served from its test-split stage (the demo never
    # renders the train split), with its TEVI model.
    assert set(state.collections) == {"shapes", "mad"} and state.collections["mad"].tevi is not None
    state.warm()
    shots = _shots(tmp_path)
    with Server(create_app(state)) as s:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        seen = walk(page, s.url, shots, {"text": "a red circle", "image_id": 12, "attributes": ("color", "shape"),
                                         "negative": "a small blue plain star",
                                         "tevi_collection": "mad" if getattr(state.collections.get("mad"), "tevi", None) else None,
                                         "tevi_text": "3 - red - small"})
        page.close()
    assert seen["heatmaps"] == 8 and seen["steer_orders"][0] != seen["steer_orders"][1]
