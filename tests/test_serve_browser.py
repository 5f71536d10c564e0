"""`vlctl serve` end to end in a real headless Chromium (Debian's /usr/bin/chromium driven by
playwright; no browser is downloaded): text search -> thumbnails loaded, named by their files;
Steer and Explain pick their image by a click; switching the attribute reorders; Explain renders
heatmaps; the Latents tab lists the SAE's named latents, opens one's top images and finds one by
name; every tab is reached with Tab and opened with Enter; no request fails; at 420 px wide nothing
scrolls sideways; /docs renders with every other host unreachable; a screenshot per tab (into
$VLCTL_SCREENSHOTS as serve-<tab>.png when set, else a temporary dir).

The server is uvicorn in a thread on a free port of 127.0.0.1, started once for the module, over
the tiny world of test_serve_api. `test_demo_screenshots` (slow; needs VLCTL_SERVE_DEMO=runs/demo)
does the same walk over the demo's stores: the README's screenshots.
"""

from __future__ import annotations

import os
import re
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
TABS = ("search", "steer", "clusters", "explain", "latents", "reports")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread."""

    def __init__(self, app):
        import uvicorn

        self.app = app
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
def world_state_no_reports(tmp_path_factory, browser):
    """A second server: the same world, no reports, no SAE."""
    from vlctl.serve.app import create_app
    from vlctl.serve.state import state_for_store

    world = shared_world(tmp_path_factory)
    with Server(create_app(state_for_store(world["store"], controlembed=world["ce"]))) as s:
        yield s


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


def _sideways(page) -> int:
    """How far the page scrolls sideways (0: it fits the viewport)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


def _shot(page, shots: Path, tab: str, seen: dict) -> None:
    page.screenshot(path=str(shots / f"serve-{tab}.png"), full_page=True)
    seen.setdefault("sideways", {})[tab] = _sideways(page)


def walk(page, url: str, shots: Path, scenario: dict) -> dict:
    """The six tabs as a user drives them; returns what was seen."""
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
    seen["files"] = page.eval_on_selector_all("#search-results .hit .file", "els => els.map((e) => e.textContent)")
    seen["titles"] = page.eval_on_selector_all("#search-results .hit", "els => els.map((e) => e.title)")
    _shot(page, shots, "search", seen)
    page.focus("#search-results .hit >> nth=1")  # a result, by keyboard: searches by that image
    page.keyboard.press("Enter")
    page.wait_for_function("(f) => document.getElementById('search-heading').textContent === `Images like ${f}`",
                           arg=seen["files"][1])
    seen["search_by_image"] = first[1] in _ids(page, "#search-results .hit")
    _all_loaded(page, "#search-results .hit img")
    seen["plurals"] = page.evaluate("[plural(1, 'image'), plural(2, 'image'), plural(0, 'result')]")
    seen["label_clamp"] = page.eval_on_selector_all(
        "#search-results .hit .label", "els => [...new Set(els.map((e) => getComputedStyle(e).webkitLineClamp))]")
    if scenario.get("refused_text"):  # an error leaves no earlier results under it
        page.fill("#search-text", scenario["refused_text"])
        page.press("#search-text", "Enter")
        page.wait_for_selector("#status.error")
        seen["after_error"] = (page.text_content("#status"), _ids(page, "#search-results .hit"),
                               page.text_content("#search-heading"))

    # Steer: a query image picked by a click, steered by two attributes, then a blend.
    page.click("#tab-steer")
    if scenario.get("steer_collection"):
        page.select_option("#steer-collection", scenario["steer_collection"])
    page.fill("#steer-attribute", scenario["attributes"][0])
    page.wait_for_selector("#steer-picks .hit img")
    pick = page.locator(f"#steer-picks .hit >> nth={scenario['pick']}")
    seen["steer_pick"] = (int(pick.get_attribute("data-id")), pick.locator(".file").text_content())
    pick.click()
    page.wait_for_function("document.getElementById('status').textContent.startsWith('attribute')")
    seen["steer_picked"] = (int(page.input_value("#steer-image-id")), page.text_content("#steer-picked-name"),
                            page.text_content("#steer-heading"))
    a = _ids(page, "#steer-results .hit")
    page.fill("#steer-attribute", scenario["attributes"][1])
    page.dispatch_event("#steer-attribute", "change")  # choosing another attribute re-ranks at once
    page.wait_for_function("(a) => JSON.stringify([...document.querySelectorAll('#steer-results .hit')]"
                           ".map((e) => Number(e.dataset.id))) !== a", arg=str(a).replace(" ", ""), timeout=20_000)
    seen["steer_orders"] = (a, _ids(page, "#steer-results .hit"))
    page.fill("#steer-attribute-b", scenario["attributes"][0])
    page.dispatch_event("#steer-attribute-b", "input")
    seen["alpha_label"] = page.text_content("#steer-alpha-label")
    page.fill("#steer-attribute-b", "")
    page.dispatch_event("#steer-attribute-b", "input")
    _all_loaded(page, "#steer-results .hit img")
    _shot(page, shots, "steer", seen)
    if scenario.get("tevi_collection"):
        page.select_option("#steer-collection", scenario["tevi_collection"])
        page.check("#steer-tevi")
        page.fill("#steer-text", scenario["tevi_text"])
        page.click("#steer-go")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('TEVI')", timeout=30_000)
        seen["tevi_status"] = page.text_content("#status")
        seen["tevi_marked"] = page.eval_on_selector_all("#steer-results .hit.moved", "els => els.length")
        seen["tevi_kept"] = page.eval_on_selector_all("#steer-results .hit .latent-use .kept",
                                                      "els => els.map((e) => e.textContent)")
        _all_loaded(page, "#steer-results .hit img")
        page.screenshot(path=str(shots / "serve-steer-tevi.png"), full_page=True)

    # Clusters: a background job, polled; strips of thumbnails.
    page.click("#tab-clusters")
    page.select_option("#cluster-attribute", scenario["attributes"][0])
    page.click("#cluster-go")
    page.wait_for_selector("#cluster-results .cluster", timeout=30_000)
    seen["clusters"] = page.eval_on_selector_all("#cluster-results .cluster", "els => els.length")
    seen["cluster_names"] = page.eval_on_selector_all("#cluster-results h3", "els => els.map((e) => e.textContent)")
    _all_loaded(page, "#cluster-results .hit img")
    _shot(page, shots, "clusters", seen)

    # Explain: an image picked by a click, with a negative; heatmaps of both models, colour bars, the tree.
    page.click("#tab-explain")
    pick = page.locator(f"#explain-picks .hit >> nth={scenario['pick']}")
    seen["explain_pick"] = (int(pick.get_attribute("data-id")), pick.locator(".file").text_content())
    pick.click()
    seen["explain_picked"] = (int(page.input_value("#explain-id")), page.text_content("#explain-picked-name"))
    page.fill("#explain-negative", scenario.get("negative", ""))
    page.click("#explain-go")
    page.wait_for_selector(".heatmaps img", timeout=60_000)
    seen["heatmaps"] = _all_loaded(page, ".heatmaps img.heatmap")
    seen["bars"] = _all_loaded(page, ".bars img")
    seen["models"] = page.eval_on_selector_all(".model h3", "els => els.map((e) => e.textContent)")
    seen["explain_heading"] = page.text_content("#explain-heading")
    _shot(page, shots, "explain", seen)

    # Latents: the SAE's latents, named; one opened; one found by name.
    if scenario.get("latents_collection"):
        page.click("#tab-latents")
        page.select_option("#latents-collection", scenario["latents_collection"])
        page.wait_for_selector("#latents-list .latent", timeout=60_000)
        seen["latent_names"] = page.eval_on_selector_all("#latents-list .latent .name", "els => els.map((e) => e.textContent)")
        seen["latent_ids"] = page.eval_on_selector_all("#latents-list .latent", "els => els.map((e) => Number(e.dataset.latent))")
        page.click("#latents-list .latent >> nth=0")
        page.wait_for_selector("#latent-images .hit img")
        seen["latent_images"] = _all_loaded(page, "#latent-images .hit img")
        seen["latent_heading"] = page.text_content("#latent-heading")
        _shot(page, shots, "latents", seen)
        wanted = seen["latent_names"][-1]
        page.fill("#latents-q", wanted)
        page.press("#latents-q", "Enter")
        page.wait_for_function("(n) => { const e = document.querySelector('#latents-list .latent .name');"
                               " return e && e.textContent === n && document.getElementById('status').textContent"
                               ".includes('named like'); }", arg=wanted)
        seen["latent_found"] = (wanted, page.eval_on_selector_all("#latents-list .latent",
                                                                   "els => els.map((e) => Number(e.dataset.latent))"))
    else:
        page.click("#tab-latents")
        _shot(page, shots, "latents", seen)

    # Reports: the report in its frame.
    page.click("#tab-reports")
    frame = page.frame_locator("#report-frame")
    frame.locator("h1").wait_for(timeout=20_000)
    seen["report_title"] = frame.locator("h1").first.text_content()
    _shot(page, shots, "reports", seen)
    return seen


SCENARIO = {"text": "a red square", "pick": 3, "attributes": ("color", "size"), "tevi_collection": "store",
            "tevi_text": "a big blue square", "latents_collection": "store", "refused_text": "a purple square"}


def _failures(page) -> list[str]:
    """Every response of 400 or more the page gets (a missing favicon included), collected."""
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return failed


def test_page_in_chromium(browser, server, tmp_path):
    shots = _shots(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    failed = _failures(page)
    seen = walk(page, server.url, shots, SCENARIO)
    page.close()
    assert seen["search"] == 24 and seen["search_by_image"]
    # issue 43: every image named by its file, the path and caption on hover
    assert all(re.fullmatch(r"img\d\d\.png", f) for f in seen["files"]), seen["files"]
    assert seen["plurals"] == ["1 image", "2 images", "0 results"]  # not "1 images"
    assert seen["label_clamp"] == ["2"]  # whole lines, then an ellipsis; the full text in the title
    assert "unknown word 'purple'" in seen["after_error"][0] and seen["after_error"][1:] == ([], "Results")
    assert all(t.split("\n")[0].endswith(f"/photos/{f}") and t.split("\n")[1].endswith("square")
               for t, f in zip(seen["titles"], seen["files"]))
    # Steer and Explain: the image picked by a click, named by its file
    row, name = seen["steer_pick"]
    assert seen["steer_picked"] == (row, name, f"Images like {name} by color") and name == f"img{row:02d}.png"
    row, name = seen["explain_pick"]
    assert seen["explain_picked"] == (row, name) and seen["explain_heading"] == f"Explained: {name}"
    a, b = seen["steer_orders"]
    assert len(a) == len(b) == 24 and a != b
    assert seen["alpha_label"] == "\u03b1: weight of \u201csize\u201d (1 \u2212 \u03b1: \u201ccolor\u201d)"
    moved = int(re.match(r"TEVI: (\d+) of 24 results moved", seen["tevi_status"]).group(1))
    assert moved == seen["tevi_marked"] < 24 and seen["tevi_kept"] and all(k.startswith("kept: ") for k in seen["tevi_kept"])
    assert seen["clusters"] == 3 and len(set(seen["cluster_names"])) == 3
    # issue 46: the Latents tab lists the SAE's named latents, opens one's top images, finds one by name
    state = server.app.state.vlctl.collections["store"]
    live = sorted((r for r in state.latents["table"]["rows"]), key=lambda r: (-r["frequency"], r["latent"]))
    assert seen["latent_ids"] == [r["latent"] for r in live]
    assert seen["latent_names"] == [r["names"][0]["name"] for r in live]
    assert seen["latent_images"] == len(live[0]["top_images"]) and seen["latent_heading"].startswith(
        f"Latent #{live[0]['latent']}: {live[0]['names'][0]['name']}")
    wanted, found = seen["latent_found"]
    assert found[0] == next(r["latent"] for r in live if r["names"][0]["name"] == wanted)
    assert failed == [f"400 {server.url}api/search"], failed  # the refused text alone
    # No negative here (the Anchor map parses both captions with spaCy, seconds to load; the API test
    # has it): HilaCAM of P per model, and its colour bar.
    assert seen["heatmaps"] == 2 and seen["bars"] == 1 and seen["models"] == ["base", "tuned"]
    assert seen["report_title"] == "tiny-recipe"
    assert not errors, errors
    for tab in TABS:
        with Image.open(shots / f"serve-{tab}.png") as im:
            assert im.size[0] == 1280 and im.size[1] >= 300


def test_narrow_viewport_scrolls_no_sideways(browser, server, tmp_path):
    """Issue 43: at 420 px wide the header's last tabs fell off and the page scrolled sideways."""
    page = browser.new_page(viewport={"width": 420, "height": 800})
    seen = walk(page, server.url, tmp_path, SCENARIO)
    page.close()
    assert seen["sideways"] == {t: 0 for t in TABS}, seen["sideways"]


def test_docs_and_empty_reports_offline(browser, world_state_no_reports):
    """Issue 43: /docs was blank offline (Swagger UI from a CDN): with every other host unreachable
    it lists the API. An empty Reports tab says there are none and how to make one."""
    page = browser.new_page()
    outside: list[str] = []

    def only_here(route):
        if route.request.url.startswith(world_state_no_reports.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_here)
    failed = _failures(page)
    page.goto(world_state_no_reports.url + "docs")
    page.wait_for_selector(".endpoint h2", timeout=20_000)
    heads = page.eval_on_selector_all(".endpoint h2 code", "els => els.map((e) => e.textContent)")
    assert {"POST /api/search", "POST /api/steer", "GET /api/latents/{collection}"} <= set(heads)
    page.goto(world_state_no_reports.url + "#reports")
    page.wait_for_function("document.getElementById('status').textContent === 'ready'", timeout=30_000)
    assert "vlctl reproduce" in page.text_content("#report-list .empty")
    assert not page.is_visible("#report-frame")
    page.close()
    assert not outside and not failed, (outside, failed)


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
        seen = walk(page, s.url, shots, {"text": "a red circle", "pick": 2, "attributes": ("color", "shape"),
                                         "negative": "a small blue plain star",
                                         "tevi_collection": "mad" if getattr(state.collections.get("mad"), "tevi", None) else None,
                                         "tevi_text": "3 - red - small",
                                         "latents_collection": "mad" if state.collections["mad"].sae else None})
        page.close()
    assert seen["heatmaps"] == 8 and seen["steer_orders"][0] != seen["steer_orders"][1]
