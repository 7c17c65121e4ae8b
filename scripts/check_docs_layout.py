"""Checks that every page of the built docs shows all of its content.

Usage:  python scripts/check_docs_layout.py docs/_build/html [--screenshots DIR]

Opens each HTML page of the build in headless Chromium, at a desktop's width
(1280 px) and a phone's (390 px), and reports every block whose content a
reader cannot see:

* a block that runs past the edge of the page's content column, or past a
  parent that hides its overflow (a table's last columns, a code line's end);
* a code block that scrolls sideways: its lines must wrap, so that no line
  ends out of sight (a table, or a "text" block that prints one, may scroll,
  if its scroll bar shows);
* a page that scrolls sideways as a whole;
* a word of a heading, a table header or an API signature broken across two lines
  (``build_dataset_accumulati`` / ``on``).

Prints one line per finding (``page @ width: what``) and exits 1 if there is
any, 0 if none. Without Chromium it prints why it skipped and exits 0, except
in CI (``CI=true``), where it exits 2: CI installs Chromium (``.ci/run``). It
drives Chromium through chromedriver's WebDriver HTTP interface, with the
standard library only. ``--screenshots DIR`` writes a full-page PNG of each
page at each width.
"""

import argparse
import base64
import contextlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

WIDTHS = (1280, 390)
HEIGHT = 900
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# Runs in the page; returns a list of findings, one string each. A finding
# names the outermost block that shows the problem, not each of its children.
MEASURE = r"""
const root = document.querySelector("article") || document.body;
const findings = [];
const reported = new Set();
const slack = 1;  // sub-pixel rounding
function name(el) {
  let text = (el.innerText || "").trim().replace(/\s+/g, " ");
  if (text.length > 60) text = text.slice(0, 57) + "...";
  const cls = el.className && typeof el.className === "string"
    ? "." + el.className.trim().split(/\s+/).join(".") : "";
  return `<${el.tagName.toLowerCase()}${cls}> "${text}"`;
}
function underReported(el) {
  for (let up = el.parentElement; up; up = up.parentElement)
    if (reported.has(up)) return true;
  return false;
}
function report(el, what) {
  if (underReported(el)) return;
  reported.add(el);
  findings.push(`${name(el)} ${what}`);
}
function overflowX(el) { return getComputedStyle(el).overflowX; }
function scrollBarShows(el) {
  const style = getComputedStyle(el);
  const borders = parseFloat(style.borderTopWidth) + parseFloat(style.borderBottomWidth);
  return el.offsetHeight - el.clientHeight - borders >= 4;
}
const page = document.scrollingElement;
if (page.scrollWidth > window.innerWidth + slack)
  findings.push(`the page scrolls sideways: ${page.scrollWidth - window.innerWidth} px`);
// Furo's content column: the article and its padding, left of the page's table of contents.
const column = (document.querySelector("div.content") || root).getBoundingClientRect();
for (const el of root.querySelectorAll("*")) {
  if (reported.has(el) || underReported(el)) continue;
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) continue;
  if (getComputedStyle(el).visibility === "hidden") continue;
  // Spaces alone (a code block's padding between tokens) hide nothing.
  if (!el.textContent.trim() && !el.querySelector("img, svg") && !/^(IMG|SVG)$/i.test(el.tagName))
    continue;
  // A block that scrolls sideways.
  const mode = overflowX(el);
  if ((mode === "auto" || mode === "scroll") && el.scrollWidth > el.clientWidth + slack) {
    const hidden = el.scrollWidth - el.clientWidth;
    // Printed tables ("text" blocks) keep their columns; code must wrap.
    const table = el.tagName !== "PRE" || el.classList.contains("literal-block") ||
      el.closest("div.highlight-text:not(.wrap), div.highlight-none:not(.wrap)");
    if (!table)
      report(el, `scrolls: ${hidden} px of its lines hidden (code must wrap)`);
    else if (!scrollBarShows(el))
      report(el, `scrolls without a visible scroll bar: ${hidden} px hidden`);
    continue;
  }
  // A box past the edge of the first ancestor that clips it (or the column).
  for (let up = el.parentElement; up; up = up.parentElement) {
    const clips = up === root || overflowX(up) !== "visible";
    if (!clips) continue;
    const edge = up.getBoundingClientRect();
    const [left, right] = up === root
      ? [Math.max(column.left, 0), Math.min(column.right, window.innerWidth)]
      : [edge.left, edge.right];
    const past = Math.max(box.right - right, left - box.left);
    const scrolls = overflowX(up) === "auto" || overflowX(up) === "scroll";
    const where = up === root ? "the column" : name(up);
    if (past > slack && !(scrolls && scrollBarShows(up)))
      report(el, `runs ${Math.round(past)} px past the edge of ${where}`);
    break;
  }
}
// A word broken across lines in a heading or a signature.
for (const el of root.querySelectorAll("h1, h2, h3, h4, h5, h6, th, dt.sig")) {
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const match of node.data.matchAll(/[A-Za-z0-9_]+/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (tops.size > 1) report(el, `breaks the word "${match[0]}" across lines`);
    }
  }
}
return findings;
"""


class Skip(Exception):
    """Chromium or chromedriver is missing."""


def _find_tools():
    browser = os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser or not driver:
        missing = " and ".join(
            name for name, path in (("chromium", browser), ("chromedriver", driver)) if not path
        )
        raise Skip(
            f"{missing} not found (Debian: apt-get install chromium chromium-driver; "
            "or set CHROMIUM and CHROMEDRIVER)"
        )
    return browser, driver


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Browser:
    """One headless Chromium, driven over chromedriver's WebDriver HTTP API."""

    def __init__(self, browser, driver, profile):
        port = _free_port()
        self._url = f"http://127.0.0.1:{port}"
        self._driver = subprocess.Popen(
            [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or self._driver.poll() is not None:
                self._driver.kill()
                raise RuntimeError(f"chromedriver ({driver}) did not start")
            time.sleep(0.1)
        options = {"binary": browser, "args": [*FLAGS, f"--user-data-dir={profile}"]}
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options}
        try:
            session = self._call(
                "POST", "/session", {"capabilities": {"alwaysMatch": capabilities}}
            )
        except BaseException:
            self._driver.kill()
            raise
        self._session = f"/session/{session['sessionId']}"

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self._url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.load(response)["value"]
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"WebDriver {method} {path}: {error.read().decode()}") from None

    def cdp(self, command, **params):
        body = {"cmd": command, "params": params}
        return self._call("POST", f"{self._session}/goog/cdp/execute", body)

    def open(self, path, width):
        # A phone's viewport (mobile=True honours the page's meta viewport).
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=HEIGHT,
            deviceScaleFactor=1,
            mobile=width < 600,
        )
        self._call("POST", f"{self._session}/url", {"url": path.resolve().as_uri()})
        # Web fonts and images settle the layout.
        self.run("return document.fonts.ready.then(() => true);")

    def run(self, script):
        return self._call("POST", f"{self._session}/execute/sync", {"script": script, "args": []})

    def screenshot(self, target):
        shot = self.cdp("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        target.write_bytes(base64.b64decode(shot["data"]))

    def close(self):
        with contextlib.suppress(Exception):
            self._call("DELETE", self._session)
        self._driver.terminate()
        try:
            self._driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._driver.kill()


def check(html_dir, screenshots=None, widths=WIDTHS):
    """Returns the findings on every page of ``html_dir``, as strings.

    Raises:
        Skip: if Chromium or chromedriver is not installed.
    """
    html_dir = pathlib.Path(html_dir)
    pages = sorted(html_dir.rglob("*.html"))
    if not pages:
        raise ValueError(f"no HTML pages in {html_dir}: build the docs first")
    browser, driver = _find_tools()
    findings = []
    with tempfile.TemporaryDirectory(prefix="docs-layout-") as profile:
        chromium = Browser(browser, driver, profile)
        try:
            for page in pages:
                name = page.relative_to(html_dir).as_posix()
                for width in widths:
                    chromium.open(page, width)
                    findings += [f"{name} @ {width} px: {what}" for what in chromium.run(MEASURE)]
                    if screenshots:
                        shot = pathlib.Path(screenshots) / f"{page.stem}_{width}.png"
                        shot.parent.mkdir(parents=True, exist_ok=True)
                        chromium.screenshot(shot)
        finally:
            chromium.close()
    return findings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", type=pathlib.Path, help="the built HTML docs")
    parser.add_argument("--screenshots", type=pathlib.Path, help="write full-page PNGs here")
    args = parser.parse_args(argv)
    try:
        findings = check(args.html_dir, args.screenshots)
    except Skip as reason:
        if os.environ.get("CI") == "true":
            print(f"docs layout check FAILED to run in CI: {reason}", file=sys.stderr)
            return 2
        print(f"docs layout check SKIPPED: {reason}", file=sys.stderr)
        return 0
    for finding in findings:
        print(finding)
    pages = len(list(args.html_dir.rglob("*.html")))
    widths = " and ".join(f"{width} px" for width in WIDTHS)
    if findings:
        print(f"docs layout: {len(findings)} blocks cut off ({pages} pages at {widths})")
        return 1
    print(f"docs layout: every block shows whole ({pages} pages at {widths})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
