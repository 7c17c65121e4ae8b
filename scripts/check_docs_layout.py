"""Checks that every page of the built docs reads whole, as a reader sees it.

Usage:  python scripts/check_docs_layout.py docs/_build/html [--screenshots DIR]

Opens each HTML page of the build in headless Chromium, at a desktop's width
(1280 px) and a phone's (390 px), and reports:

* a block that hides part of its content sideways: a table wider than the
  column (its last columns), a code or text block whose lines run out of its
  box, or anything past the edge of the column. A block that scrolls counts:
  a phone, a print and a screenshot show no scroll bar, so its hidden columns
  are cut for the reader. The finding names the widest inline code in it;
* a page that scrolls sideways as a whole;
* a word broken across two lines (``build_dataset_accumulati`` / ``on``):
  lines wrap at spaces and punctuation only;
* a wrapped code line that goes on at column 0, where it reads as a line of
  its own instead of the end of the line above;
* a table cell that closes a bracket it does not open, or opens one it does
  not close: one row of the source table rendered as two (a simple table's
  cell that goes on to the next line must leave the first column blank);
* an image shown at less than 60 % of its size (from its resolution, as
  matplotlib writes it), where its text reads at under 8 px;
* a block highlighted as Python that is not Python (program output, a shell
  command): give it its language (``.. code-block:: text``, ``bash``).

Prints one line per finding (``page @ width: what``) and exits 1 if there is
any, 0 if none. Without Chromium it prints why it skipped and exits 0, except
in CI (``CI=true``), where it exits 2: CI installs Chromium (``.ci/run``). It
drives Chromium through chromedriver's WebDriver HTTP interface, with the
standard library only. ``--screenshots DIR`` writes a full-page PNG of each
page at each width.
"""

import argparse
import ast
import base64
import contextlib
import json
import os
import pathlib
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request

WIDTHS = (1280, 390)
HEIGHT = 900
# An image shown smaller than this, against its size in inches, has text
# (matplotlib's 10 pt) under 8 px.
SMALLEST_SCALE = 0.6
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

# Runs in the page; returns {findings: [text], images: [...], python: [...]}.
# A finding names the outermost block that shows the problem, not each of
# its children.
MEASURE = r"""
const root = document.querySelector("article") || document.body;
const findings = [];
const reported = new Set();
const slack = 1;  // sub-pixel rounding
function clean(text, most = 60) {
  text = (text || "").trim().replace(/\s+/g, " ");
  return text.length > most ? text.slice(0, most - 3) + "..." : text;
}
function name(el) {
  const cls = el.className && typeof el.className === "string"
    ? "." + el.className.trim().split(/\s+/).join(".") : "";
  return `<${el.tagName.toLowerCase()}${cls}> "${clean(el.innerText)}"`;
}
function underReported(el) {
  for (let up = el.parentElement; up; up = up.parentElement)
    if (reported.has(up)) return true;
  return false;
}
function report(el, what) {
  if (reported.has(el) || underReported(el)) return;
  reported.add(el);
  findings.push(`${name(el)} ${what}`);
}
function clips(el) { return getComputedStyle(el).overflowX !== "visible"; }
function lineTops(range) {
  return new Set([...range.getClientRects()].filter(r => r.width > 0)
    .map(r => Math.round(r.top)));
}
// The widest inline code in a block: what may keep it from fitting.
function widest(el) {
  const words = [];
  for (const code of el.querySelectorAll("code, span.pre"))
    if (!code.querySelector("code, span.pre"))
      words.push([code.getBoundingClientRect().width, code.textContent.trim()]);
  words.sort((a, b) => b[0] - a[0]);
  const seen = [...new Set(words.slice(0, 8).map(w => w[1]))].slice(0, 3);
  const list = seen.map(w => "``" + w + "``").join(", ");
  return seen.length ? `; its widest code: ${list}` : "";
}

const page = document.scrollingElement;
if (page.scrollWidth > window.innerWidth + slack)
  findings.push(`the page scrolls sideways: ${page.scrollWidth - window.innerWidth} px`);
// Furo's content column: the article and its padding, left of the page's table of contents.
const column = (document.querySelector("div.content") || root).getBoundingClientRect();
const [left, right] = [Math.max(column.left, 0), Math.min(column.right, window.innerWidth)];

// 1. Content hidden sideways: in a block that clips or scrolls, or past the column.
for (const el of root.querySelectorAll("*")) {
  if (reported.has(el) || underReported(el)) continue;
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) continue;
  if (getComputedStyle(el).visibility === "hidden") continue;
  if (!el.textContent.trim() && !el.querySelector("img, svg") && !/^(IMG|SVG)$/i.test(el.tagName))
    continue;
  if (clips(el) && el.scrollWidth > el.clientWidth + slack) {
    const table = el.querySelector("table");
    const what = table || el.tagName === "TABLE" ? "columns" : "lines";
    report(el, `hides ${el.scrollWidth - el.clientWidth} px of its ${what} sideways` + widest(el));
    continue;
  }
  let inside = false;
  for (let up = el.parentElement; up && up !== root; up = up.parentElement)
    if (clips(up)) { inside = true; break; }
  if (inside) continue;  // its clipping ancestor reports it
  const past = Math.max(box.right - right, left - box.left);
  if (past > slack)
    report(el, `runs ${Math.round(past)} px past the edge of the column` + widest(el));
}

// 2. A word broken across lines (a break at "_" or "." is at punctuation).
const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!node.data.trim() || node.parentElement.closest("script, style, mjx-container")) continue;
  const whole = document.createRange();
  whole.selectNodeContents(node);
  if (lineTops(whole).size < 2) continue;
  for (const match of node.data.matchAll(/[A-Za-z0-9]{2,}/g)) {
    const range = document.createRange();
    range.setStart(node, match.index);
    range.setEnd(node, match.index + match[0].length);
    if (lineTops(range).size > 1) {
      const block = node.parentElement.closest("pre, p, td, th, li, dt, dd, h1, h2, h3, h4, h5, h6")
        || node.parentElement;
      report(block, `breaks the word "${match[0]}" across lines`);
    }
  }
}

// 3. A wrapped code line that goes on at column 0.
for (const pre of root.querySelectorAll("pre")) {
  if (reported.has(pre) || underReported(pre)) continue;
  const nodes = [];
  const texts = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  for (let node = texts.nextNode(); node; node = texts.nextNode()) nodes.push(node);
  const at = (offset) => {  // (node, offset in node) of an offset in the block's text
    for (const node of nodes) {
      if (offset <= node.data.length) return [node, offset];
      offset -= node.data.length;
    }
    return [nodes[nodes.length - 1], nodes[nodes.length - 1].data.length];
  };
  const text = nodes.map(n => n.data).join("");
  let start = 0;
  for (const line of text.split("\n")) {
    const range = document.createRange();
    range.setStart(...at(start));
    range.setEnd(...at(start + line.length));
    start += line.length + 1;
    const rects = [...range.getClientRects()].filter(r => r.width > 0);
    const tops = [...new Set(rects.map(r => Math.round(r.top)))].sort((a, b) => a - b);
    if (tops.length < 2) continue;
    const leftAt = (top) =>
      Math.min(...rects.filter(r => Math.round(r.top) === top).map(r => r.left));
    const column0 = leftAt(tops[0]);
    if (tops.slice(1).some(top => leftAt(top) <= column0 + slack)) {
      report(pre, "wraps a line onto column 0, where its end reads as a line of its own: " +
        `"${clean(line)}"`);
      break;
    }
  }
}

// 4. A table cell with a bracket that does not close (or open) in it.
const pairs = ["()", "[]", "{}"];
for (const table of root.querySelectorAll("table")) {
  for (const cell of table.querySelectorAll("td, th")) {
    const text = cell.innerText;
    for (const [open, close] of pairs) {
      const balance = text.split(open).length - text.split(close).length;
      if (balance) {
        findings.push(`${name(table)} has a cell that ${balance > 0 ? "opens" : "closes"} a ` +
          `bracket it does not ${balance > 0 ? "close" : "open"}, "${clean(text)}": ` +
          "one row of the source broken in two (in a simple table, a cell's next line " +
          "leaves the first column blank)");
        break;
      }
    }
  }
}

const images = [...root.querySelectorAll("img")].map(img => ({
  src: img.currentSrc || img.src, shown: img.getBoundingClientRect().width,
  natural: img.naturalWidth, alt: clean(img.alt, 40)}));
// Blocks Pygments coloured as Python, for the caller to parse.
const python = [...root.querySelectorAll(
  "div.highlight-default, div.highlight-python, div.highlight-python3, div.highlight-py")]
  .filter(div => div.querySelector("pre span[class]:not(.w):not(.line)"))
  .map(div => div.querySelector("pre").textContent);
return {findings, images, python};
"""


def _dpi(path):
    """The horizontal resolution of a PNG (its pHYs chunk), or None."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind == b"pHYs":
            per_unit, _, unit = struct.unpack(">IIB", data[at + 8 : at + 17])
            return per_unit * 0.0254 if unit == 1 else None
        if kind == b"IDAT":
            return None
        at += 12 + length
    return None


def _small_images(images):
    for image in images:
        url = urllib.parse.urlparse(image["src"])
        path = pathlib.Path(urllib.request.url2pathname(url.path))
        dpi = url.scheme == "file" and path.is_file() and _dpi(path)
        if not dpi or not image["natural"]:
            continue
        scale = image["shown"] / (image["natural"] / dpi * 96)
        if scale < SMALLEST_SCALE:
            yield (
                f'<img> "{image["alt"]}" is shown at {scale:.0%} of its size '
                f"({image['shown']:.0f} px for {image['natural']} px at {dpi:.0f} dpi): "
                "its text is too small to read; make the figure narrower"
            )


def _not_python(blocks):
    for text in blocks:
        source = textwrap.dedent(text)
        if source.lstrip().startswith(">>>"):
            continue
        try:
            ast.parse(source)
        except SyntaxError:
            first = " ".join(source.split())[:57]
            yield (
                f'a block highlighted as Python is not Python: "{first}...": give it '
                "its language (``.. code-block:: text`` for output, ``bash`` for a command)"
            )


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
                    seen = chromium.run(MEASURE)
                    found = seen["findings"] + list(_small_images(seen["images"]))
                    if width == widths[0]:  # the same at every width
                        found += _not_python(seen["python"])
                    findings += [f"{name} @ {width} px: {what}" for what in found]
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
        print(f"docs layout: {len(findings)} findings ({pages} pages at {widths})")
        return 1
    print(f"docs layout: every page reads whole ({pages} pages at {widths})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
