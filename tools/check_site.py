"""The built docs site (site/), checked in a real headless browser: ``./dev docs check``.

Serves site/ on a free loopback port and opens it in Chromium (Debian's ``chromium``, driven by
Playwright; no browser is downloaded). It fails, naming the page, when:

- the search box finds nothing for "rebalance" (the search index or its worker did not load);
- a page's screenshot is blank (one colour), or the page logs a JavaScript error;
- a page asks for anything from another host (the site must work offline);
- a table cell shows a literal ``\\|`` (GitHub's escape for a pipe, which MkDocs keeps), or an option
  name in a table breaks over two lines;
- a line of code in a highlighted block runs past the edge of its block (hidden, not wrapped).

Every page is visited. ``python tools/check_site.py [SITE_DIR] [--shots DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import io
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from PIL import Image
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
#: Chromium's flags on a machine with a closed network (no background requests, no sandbox as root).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SEARCH_TERM = "rebalance"

#: JavaScript run in each page: what the reader would see wrong, as a list of sentences.
LAYOUT_CHECK = r"""
() => {
  const found = [];
  for (const cell of document.querySelectorAll("article table td, article table th")) {
    if (cell.textContent.includes("\\|")) {
      found.push(`a table cell shows "\\|": ${cell.textContent.trim().slice(0, 60)}`);
    }
  }
  for (const code of document.querySelectorAll("article table td:first-child code")) {
    if (code.getClientRects().length > 1) found.push(`the option name ${code.textContent} breaks over two lines`);
  }
  for (const code of document.querySelectorAll("article .highlight:not(.language-text) pre > code")) {
    if (code.scrollWidth > code.clientWidth + 1) {
      found.push(`a code block's lines run past its edge: ${code.textContent.trim().split("\n")[0].slice(0, 60)}`);
    }
  }
  return found;
}
"""


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """``directory`` over HTTP on a free loopback port, for the duration of the block."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def pages(site: Path, base: str) -> list[str]:
    """Every page's URL: each ``index.html`` under ``site`` (MkDocs writes one per page)."""
    found = sorted(p.parent.relative_to(site).as_posix() for p in site.rglob("index.html"))
    return [base + ("" if d == "." else d + "/") for d in found if not d.startswith(("assets", "search"))]


def blank(png: bytes) -> bool:
    """Whether a screenshot is one colour (or as good as: under 1 % of its pixels differ from the
    most common one)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 16)
    if colours is None:  # more colours than that: certainly not blank
        return False
    top = max(count for count, _ in colours)
    return top > 0.99 * image.width * image.height


def check_search(page: Page, base: str) -> list[str]:
    page.goto(base)
    page.fill("input.md-search__input", SEARCH_TERM)
    try:
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
    except Exception:
        meta = page.inner_text(".md-search-result__meta")
        return [f"search for {SEARCH_TERM!r} found nothing (the search box says {meta!r})"]
    return []


def check_page(page: Page, url: str, shots: Path | None, errors: list[str]) -> list[str]:
    """What is wrong with the page at ``url``; ``errors`` collects the page's JavaScript errors."""
    problems: list[str] = []
    errors.clear()
    page.goto(url, wait_until="load")
    png = page.screenshot()
    if shots is not None:
        name = urlparse(url).path.strip("/").replace("/", "_") or "index"
        (shots / f"{name}.png").write_bytes(png)
    if blank(png):
        problems.append("its screenshot is blank")
    problems += page.evaluate(LAYOUT_CHECK)
    problems += [f"JavaScript error: {e}" for e in errors]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", type=Path, default=ROOT / "site", help="the built site (default: site/)")
    parser.add_argument("--shots", type=Path, help="also write each page's screenshot into this directory")
    args = parser.parse_args(argv)
    site: Path = args.site
    if not (site / "index.html").exists():
        print(f"check_site: {site} has no index.html: build it first (./dev docs)", file=sys.stderr)
        return 2
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("check_site: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    report: dict[str, list[str]] = {}
    foreign: set[str] = set()
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        def only_loopback(route: object) -> None:
            request = route.request  # type: ignore[attr-defined]
            host = urlparse(request.url).hostname
            if request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
                route.continue_()  # type: ignore[attr-defined]
            else:
                foreign.add(request.url)
                route.abort()  # type: ignore[attr-defined]

        context.route("**/*", only_loopback)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        if problems := check_search(page, base):
            report["search"] = problems
        urls = pages(site, base)
        for url in urls:
            if problems := check_page(page, url, args.shots, errors):
                report[urlparse(url).path] = problems
        browser.close()
    if foreign:
        report["requests to other hosts"] = sorted(foreign)
    for where, problems in report.items():
        for problem in problems:
            print(f"check_site: {where}: {problem}", file=sys.stderr)
    if report:
        return 1
    print(f"check_site: {len(urls)} pages in Chromium: search finds {SEARCH_TERM!r}, no blank page, no "
          "request to another host, tables and code blocks read whole")
    return 0


if __name__ == "__main__":
    sys.exit(main())
