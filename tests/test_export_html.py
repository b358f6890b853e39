"""The page of the week in a real browser (Debian's chromium, headless,
driven by Playwright with the system's executable): it loads without a
console error and without fetching anything, shows the seeded bookings in
the right cells, runs no script from a hostile note or name, has its
landmarks, table headers and keyboard path, and every text is at least
4.5:1 against its background in the light and the dark theme (measured
from computed styles).  Screenshots of both themes are kept (the path is
printed; ``BK_TEST_ARTIFACTS`` chooses the directory).  Without a browser,
the page's structure and escapes are checked as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from helpers_export import rich, world

from bk.core.models import parse_iso
from bk.export import html
from bk.service.exports import week_start

NOW = parse_iso("2026-07-15T09:20:00Z")          # a Wednesday, 11:20 in Berlin
BERLIN = ZoneInfo("Europe/Berlin")
CHROMIUM = "/usr/bin/chromium"
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def page_of(data, now=NOW, tz=BERLIN) -> bytes:
    return html.render(data, tz=tz, zone_name="Europe/Berlin", week_start=week_start(now, tz), generator="bk test")


# ------------------------------------------------------------- as text

def test_the_page_is_self_contained_ascii_and_escaped():
    page = page_of(rich(NOW, hostile=HOSTILE))
    page.decode("ascii")
    text = page.decode()
    assert "<script" not in text.lower() and "onerror=" not in text.replace("onerror=&quot;", "")
    assert "&lt;script&gt;" in text and "&lt;img src=x" in text
    plain = page_of(rich(NOW)).decode()
    for outside in ("http://", "https://", "<link", "src=", "url(", "@import", "<script"):
        assert outside not in plain, outside
    assert "&#26446;&#38647;" in text                    # 李雷, as character references


def test_days_have_the_hours_they_really_have():
    # Berlin's week of the fall-back (Sunday 2026-10-25 has 25 hours) and of the spring-forward.
    for day, n in (("2026-10-25T10:00:00Z", 25), ("2026-03-29T10:00:00Z", 23)):
        now = parse_iso(day)
        text = page_of(world(now), now=now).decode()
        sunday = text.split(f'id="d{day[:10]}"')[1].split("</tr>")[0]
        assert sunday.count('<th scope="col"') == n + 1, day      # the GPU column, then the hours
    fold = page_of(world(parse_iso("2026-10-25T10:00:00Z")), now=parse_iso("2026-10-25T10:00:00Z")).decode()
    assert "02 CEST" in fold and "02 CET" in fold


# ------------------------------------------------------------- in chromium

def _contrast(fg: tuple, bg: tuple) -> float:
    def lum(c):
        out = []
        for v in c[:3]:
            v /= 255
            out.append(v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4)
        return 0.2126 * out[0] + 0.7152 * out[1] + 0.0722 * out[2]
    a, b = sorted((lum(fg), lum(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


COLOURS = """() => {
  const rgb = s => { const m = s.match(/[\\d.]+/g); return m ? m.map(Number) : null; };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const r = el.getBoundingClientRect();
    const cs = getComputedStyle(el);
    if (r.width === 0 || r.height === 0 || cs.visibility === 'hidden' || r.right < 0) continue;
    if (cs.clip === 'rect(0px, 0px, 0px, 0px)') continue;   // visually hidden text for screen readers
    let bg = null, p = el;
    while (p) {
      const c = rgb(getComputedStyle(p).backgroundColor);
      if (c && (c.length < 4 || c[3] > 0)) { bg = c; break; }
      p = p.parentElement;
    }
    out.push({tag: el.tagName, text: el.textContent.trim().slice(0, 40), fg: rgb(cs.color),
              bg: bg || rgb(getComputedStyle(document.documentElement).backgroundColor) || [255, 255, 255],
              size: parseFloat(cs.fontSize), weight: parseInt(cs.fontWeight)});
  }
  return out;
}"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the dev extra's playwright drives chromium")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    profile = tmp_path_factory.mktemp("chromium-profile")       # a new, empty user data directory
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                   args=ARGS, viewport={"width": 1400, "height": 1000})
        try:
            yield ctx
        finally:
            ctx.close()


def _artifacts(tmp_path: Path) -> Path:
    where = Path(os.environ.get("BK_TEST_ARTIFACTS") or tmp_path) / "export-html"
    where.mkdir(parents=True, exist_ok=True)
    return where


def _open(ctx, path: Path, scheme: str = "light"):
    page = ctx.new_page()
    problems, fetched = [], []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: fetched.append(r.url))
    page.emulate_media(color_scheme=scheme)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems, fetched


@pytest.mark.slow
def test_the_seeded_week_in_a_real_browser(browser, pyz, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "Europe/Berlin",
           "BK_DATA_DIR": str(tmp_path / "d"), "BK_GPU_COUNT": "3", "XDG_CACHE_HOME": str(tmp_path / "c")}

    def bk(*args, now="2026-07-15T09:20:00Z"):
        got = subprocess.run([sys.executable, str(pyz), *args], env={**env, "BK_NOW": now}, capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 0, (args, got.stderr)
        return got

    # Thursday 10:00-12:00 Berlin on GPU 1, shared; Wednesday now-13:00 exclusive on GPU 2, with a hostile note.
    bk("1", "2h", "-g", "1", "-t", "2026-07-16 10:00")
    bk("x", "1", "1h40m", "-g", "2", "--note", HOSTILE)
    out = tmp_path / "www"
    bk("export", "html", str(out))
    path = out / "index.html"
    page, problems, fetched = _open(browser, path)
    try:
        assert problems == []
        assert fetched == [path.as_uri()], fetched                  # nothing but the page itself
        assert page.evaluate("() => window.__pwned") is None
        assert page.evaluate("() => document.querySelectorAll('script, img, iframe, object').length") == 0

        def cell(gpu: int, hour_utc: str) -> str:
            return page.inner_text(f'td[data-gpu="{gpu}"][data-hour="{hour_utc}"]').strip()

        assert cell(1, "2026-07-16T08:00:00Z") == "root 1/2" and cell(1, "2026-07-16T09:00:00Z") == "root 1/2"
        assert cell(1, "2026-07-16T07:00:00Z") == "" and cell(1, "2026-07-16T10:00:00Z") == ""
        assert cell(0, "2026-07-16T08:00:00Z") == ""
        assert cell(2, "2026-07-15T09:00:00Z") == "root excl." and cell(2, "2026-07-15T10:00:00Z") == "root excl."
        assert cell(2, "2026-07-15T11:00:00Z") == ""
        # Now: this hour's column header, and the note shown as the text it is.
        now_th = page.locator('th[aria-current="time"]')
        assert now_th.count() == 1 and now_th.inner_text().startswith("11")
        assert page.locator("#list").inner_text().count(HOSTILE) == 1
    finally:
        page.close()


@pytest.mark.slow
def test_landmarks_keyboard_and_contrast_in_both_themes(browser, tmp_path):
    data = rich(NOW, hostile=HOSTILE)
    path = tmp_path / "index.html"
    path.write_bytes(page_of(data))
    shots = _artifacts(tmp_path)
    for scheme in ("light", "dark"):
        page, problems, fetched = _open(browser, path, scheme)
        try:
            assert problems == [] and fetched == [path.as_uri()]
            assert page.evaluate("() => window.__pwned") is None
            for selector, n in (("header", 1), ("nav", 1), ("main", 1), ("footer", 1), ("h1", 1)):
                assert page.locator(selector).count() == n, selector
            assert page.locator("nav").get_attribute("aria-label")
            assert page.evaluate("() => [...document.querySelectorAll('table')].every(t => t.caption)")
            assert page.evaluate("() => [...document.querySelectorAll('th')].every(th => th.scope)")
            assert page.evaluate("""() => [...document.querySelectorAll('[role=region]')].every(r =>
                r.tabIndex === 0 && (r.getAttribute('aria-label') || r.getAttribute('aria-labelledby')))""")
            assert page.locator(".maint").count() > 0 and "driver update tonight <b>&</b>" in page.inner_text("main")
            # The keyboard: the first Tab lands on the skip link, which leads to the main landmark.
            page.keyboard.press("Tab")
            assert page.evaluate("() => document.activeElement.className") == "skip"
            assert page.evaluate("() => document.activeElement.getAttribute('href')") == "#main"
            bad = []
            for c in page.evaluate(COLOURS):
                ratio = _contrast(tuple(c["fg"]), tuple(c["bg"]))
                large = c["size"] >= 24 or (c["size"] >= 18.66 and c["weight"] >= 700)
                if ratio < (3.0 if large else 4.5):
                    bad.append((round(ratio, 2), c))
            assert bad == [], f"{scheme}: text below the contrast it needs: {bad[:5]}"
            shot = shots / f"week-{scheme}.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            page.close()
    # Under pytest's tmp_path unless BK_TEST_ARTIFACTS names a directory
    # (pytest keeps the last three runs' temporary directories).
    print(f"screenshots of the page of the week: {shots}")


def test_an_empty_week_says_so():
    text = page_of(world(NOW)).decode()
    assert "No bookings this week." in text and "GPUs now" in text
    assert text.count('aria-current="time"') == 1
