"""Checks that every page of the built docs reads whole, as a reader sees it.

Usage:  python scripts/check_docs_layout.py docs/_build/html [--screenshots DIR]

Opens each HTML page of the build in headless Chromium, with no network, at
a desktop's width (1280 px) and a phone's (390 px), and reports:

* a block that cuts part of its content sideways: a table wider than the
  column (its last columns), a code or text block whose lines run out of its
  box, when it clips them or scrolls with no scroll bar to show that more is
  there; or anything past the edge of the column. A block that scrolls
  sideways inside its own box, with a scroll bar, is right: that is how a
  long code line or a wide table reads on a phone. The finding names the
  widest inline code in it;
* a page that scrolls sideways as a whole;
* a word of prose broken across two lines (``build_dataset_accumulati`` /
  ``on``): prose wraps at spaces and punctuation only;
* a code line broken inside a token (``global_`` / ``variables``, ``1e-`` /
  ``3``), in any code or text block;
* a code block re-flowed: it shows more lines than its source has (a line
  wrapped onto the next, a blank line at its end). Code keeps its lines; a
  text block of prose (class ``wrap``) may wrap at spaces;
* a table cell that closes a bracket it does not open, or opens one it does
  not close: one row of the source table rendered as two (a simple table's
  cell that goes on to the next line must leave the first column blank);
* a field list of the API reference with an empty field, or a ``Type``
  that is cut (a bracket it does not close) or is prose, not a type: a
  description parsed as a type;
* an API entry that shows the docstring of one of Python's built-in types
  (``str(object='') -> str``) instead of its own;
* math left as raw TeX (``\\frac``): not typeset with the network off;
* a figure whose smallest text shows under 12 px, the smallest size a
  phone's reader reads without zooming: from its size on the page, its
  resolution and the size of its smallest text, as the plotting scripts
  write them into the PNG (``Smallest text``; matplotlib's 10 pt if it does
  not say);
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
# The smallest text a phone's reader reads without zooming, in CSS px.
LEGIBLE_PX = 12
# What a matplotlib figure's text is, when its PNG does not say.
MATPLOTLIB_POINTS = 10
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
    # No network: every page must show whole from the build alone (math too).
    "--host-resolver-rules=MAP * ~NOTFOUND",
)
# The first line of the docstring of each of Python's built-in types: an
# API entry that shows one documents the type of its value, not itself.
BUILTIN_DOCSTRINGS = sorted(
    {
        kind.__doc__.strip().splitlines()[0]
        for kind in (str, bytes, int, float, complex, bool, list, tuple, dict, set, frozenset)
        + (object, type, range, slice)
    }
)

# Runs in the page, given BUILTIN_DOCSTRINGS; returns {findings: [text],
# images: [...], python: [...]}. A finding names the outermost block that
# shows the problem, not each of its children.
MEASURE = r"""
const builtinDocstrings = arguments[0];
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
function px(el, property) { return parseFloat(getComputedStyle(el)[property]) || 0; }
function clips(el) { return getComputedStyle(el).overflowX !== "visible"; }
// The height of the scroll bar drawn under a box that scrolls sideways: 0 if
// none shows (overflow: hidden, scrollbar-width: none, or a phone's bars
// that show only while the reader scrolls).
function scrollBar(el) {
  if (!/^(auto|scroll)$/.test(getComputedStyle(el).overflowX)) return 0;
  return el.offsetHeight - el.clientHeight - px(el, "borderTopWidth") - px(el, "borderBottomWidth");
}
function lineTops(range) {
  return new Set([...range.getClientRects()].filter(r => r.width > 0)
    .map(r => Math.round(r.top)));
}
// Brackets a text opens and does not close (> 0), or closes unopened (< 0).
function unbalanced(text) {
  for (const [open, close] of ["()", "[]", "{}"]) {
    const balance = text.split(open).length - text.split(close).length;
    if (balance) return balance;
  }
  return 0;
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

// 1. Content cut sideways: by a block that clips it, or scrolls it with no
// scroll bar, or past the column. A block that scrolls with a bar is right.
for (const el of root.querySelectorAll("*")) {
  if (reported.has(el) || underReported(el)) continue;
  const box = el.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) continue;
  const style = getComputedStyle(el);
  // Hidden, or for screen readers only (clip: rect(...), as MathJax's MathML).
  if (style.visibility === "hidden" || style.clip !== "auto") continue;
  if (!el.textContent.trim() && !el.querySelector("img, svg") && !/^(IMG|SVG)$/i.test(el.tagName))
    continue;
  if (clips(el) && el.scrollWidth > el.clientWidth + slack) {
    if (scrollBar(el) > 0) continue;
    const table = el.querySelector("table");
    const what = table || el.tagName === "TABLE" ? "columns" : "lines";
    report(el, `cuts ${el.scrollWidth - el.clientWidth} px of its ${what} sideways, with no ` +
      "scroll bar" + widest(el));
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

// 2. A word of prose broken across lines (a break at "_" or "." is at punctuation).
const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!node.data.trim() || node.parentElement.closest("script, style, mjx-container, pre"))
    continue;
  const whole = document.createRange();
  whole.selectNodeContents(node);
  if (lineTops(whole).size < 2) continue;
  for (const match of node.data.matchAll(/[A-Za-z0-9]{2,}/g)) {
    const range = document.createRange();
    range.setStart(node, match.index);
    range.setEnd(node, match.index + match[0].length);
    if (lineTops(range).size > 1) {
      const block = node.parentElement.closest("p, td, th, li, dt, dd, h1, h2, h3, h4, h5, h6")
        || node.parentElement;
      report(block, `breaks the word "${match[0]}" across lines`);
    }
  }
}

// 3. Code and text blocks: a line broken inside a token, and (code) more
// lines shown than the source has.
for (const pre of root.querySelectorAll("pre")) {
  if (reported.has(pre) || underReported(pre) || !pre.getClientRects().length) continue;
  const nodes = [];
  const texts = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  for (let node = texts.nextNode(); node; node = texts.nextNode()) nodes.push(node);
  const text = nodes.map(n => n.data).join("");
  const at = (offset) => {  // (node, offset in node) of an offset in the block's text
    for (const node of nodes) {
      if (offset <= node.data.length) return [node, offset];
      offset -= node.data.length;
    }
    return [nodes[nodes.length - 1], nodes[nodes.length - 1].data.length];
  };
  const topOf = (offset) => {  // where the character at offset shows, or null
    const range = document.createRange();
    range.setStart(...at(offset));
    range.setEnd(...at(offset + 1));
    const rect = [...range.getClientRects()].find(r => r.width > 0);
    return rect ? Math.round(rect.top) : null;
  };
  const prose = pre.closest(".wrap");
  const lines = text.replace(/\n\s*$/, "").split("\n");  // blank lines at the end: none
  let start = 0;
  let reflowed = null;
  for (const line of lines) {
    const range = document.createRange();
    range.setStart(...at(start));
    range.setEnd(...at(start + line.length));
    if (line.trim() && lineTops(range).size > 1) {
      reflowed = reflowed || line;
      // Where the line breaks: between two characters that are not spaces?
      let last = null;  // [offset, top] of the last character that is not a space
      for (let i = 0; i < line.length; i++) {
        if (/\s/.test(line[i])) continue;
        const top = topOf(start + i);
        if (top === null) continue;
        // In prose (class "wrap"), a break after punctuation (micro-|batch) is right.
        const inWord = !prose || /^[A-Za-z0-9]{2}$/.test(line[i - 1] + line[i]);
        if (last && top !== last[1] && last[0] === i - 1 && inWord) {
          const token = (s) => s.match(/\S*$/)[0];
          const broken = token(line.slice(0, i)) + "|" + line.slice(i).match(/^\S*/)[0];
          report(pre, `breaks a line of code inside "${clean(broken, 50)}": a code ` +
            "line keeps its names, numbers and strings whole");
          break;
        }
        last = [i, top];
      }
    }
    start += line.length + 1;
  }
  if (prose) continue;  // may wrap at spaces
  // The height of one line in this block, from an empty copy of it.
  const probe = pre.cloneNode(false);
  probe.textContent = "x";
  pre.parentNode.insertBefore(probe, pre);
  const padding = (el) => px(el, "paddingTop") + px(el, "paddingBottom");
  const lineHeight = probe.clientHeight - padding(probe);
  probe.remove();
  const shown = Math.round((pre.clientHeight - padding(pre)) / lineHeight);
  if (shown > lines.length)
    report(pre, `shows ${shown} lines for its ${lines.length}: ` + (reflowed
      ? `it re-flows "${clean(reflowed)}"; a code block keeps its lines and scrolls sideways`
      : `${shown - lines.length === 1 ? "a blank line" : "blank lines"} at its end`));
}

// 4. A table cell with a bracket that does not close (or open) in it.
for (const table of root.querySelectorAll("table")) {
  for (const cell of table.querySelectorAll("td, th")) {
    const balance = unbalanced(cell.innerText);
    if (balance) {
      findings.push(`${name(table)} has a cell that ${balance > 0 ? "opens" : "closes"} a ` +
        `bracket it does not ${balance > 0 ? "close" : "open"}, "${clean(cell.innerText)}": ` +
        "one row of the source broken in two (in a simple table, a cell's next line " +
        "leaves the first column blank)");
      break;
    }
  }
}

// 5. A field list (Parameters, Type, ...) with an empty field, or a type
// that is cut or is prose: names joined by | , [ ] ( ) "or" "of", nothing else.
const typeName = /^(?:[A-Za-z_][\w.]*|\.\.\.|'[^']*'|"[^"]*"|-?\d+(?:\.\d+)?)$/;
for (const field of root.querySelectorAll("dl.field-list > dt")) {
  const value = field.nextElementSibling;
  const label = clean(field.textContent).replace(/:$/, "");
  const text = clean(value ? value.innerText : "", 80);
  const entry = field.closest("dl.py > dd") || field.parentElement;
  const where = entry.previousElementSibling || entry;
  if (!text) {
    report(where, `has an empty "${label}" field`);
  } else if (/type$/i.test(label)) {
    const parts = text.split(/\s*(?:[|,\[\]()]|\bor\b|\bof\b)\s*/).filter(Boolean);
    if (unbalanced(text) || parts.some(part => !typeName.test(part)))
      report(where, `has a cut "${label}", "${text}": a description read as a type`);
  }
}

// 6. An API entry that shows a built-in type's docstring (its own text, not
// its members').
const plain = (text) => text.replace(/[\u2018\u2019]/g, "'").replace(/[\u201c\u201d]/g, '"')
  .replace(/\s+/g, " ");
for (const entry of root.querySelectorAll("dl.py > dd")) {
  const own = [...entry.children].filter(child => !child.matches("dl.py"))
    .map(child => child.innerText).join(" ");
  const shown = builtinDocstrings.find(doc => plain(own).includes(plain(doc)));
  if (shown)
    report(entry.previousElementSibling || entry,
      `shows the docstring of a Python built-in type, "${clean(shown)}", not its own`);
}

// 7. Math left as TeX: MathJax did not typeset it (one finding a page).
const tex = [...root.querySelectorAll(".math")]
  .filter(math => !math.querySelector("mjx-container, svg, math, img"))
  .filter(math => /\\/.test(math.textContent));
if (tex.length)
  findings.push(`shows raw TeX, not typeset with no network: ${tex.length} ` +
    `${tex.length === 1 ? "formula" : "formulas"}, the first "${clean(tex[0].textContent)}"`);

const images = [...root.querySelectorAll("img")].map(img => ({
  src: img.currentSrc || img.src, shown: img.getBoundingClientRect().width,
  natural: img.naturalWidth, alt: clean(img.alt, 40)}));
// Blocks Pygments coloured as Python, for the caller to parse.
const python = [...root.querySelectorAll(
  "div.highlight-default, div.highlight-python, div.highlight-python3, div.highlight-py")]
  .filter(div => div.querySelector("pre span[class]:not(.w)"))
  .map(div => div.querySelector("pre").textContent);
return {findings, images, python};
"""


# Waits for MathJax's first typesetting, when the page loaded it.
TYPESET = """
const startup = window.MathJax && window.MathJax.startup;
return startup && startup.promise ? startup.promise.then(() => true) : true;
"""


def _png_facts(path):
    """The resolution of a PNG (dpi, from its pHYs chunk) and its text chunks."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None, {}
    dpi, texts = None, {}
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        if kind == b"pHYs":
            per_unit, _, unit = struct.unpack(">IIB", body[:9])
            dpi = per_unit * 0.0254 if unit == 1 else None
        elif kind == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            texts[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"IEND":
            break
        at += 12 + length
    return dpi, texts


def _small_text(images):
    for image in images:
        url = urllib.parse.urlparse(image["src"])
        path = pathlib.Path(urllib.request.url2pathname(url.path))
        if url.scheme != "file" or not path.is_file() or not image["shown"]:
            continue
        dpi, texts = _png_facts(path)
        said = texts.get("Smallest text", "")
        if not dpi or not (said or texts.get("Software", "").startswith("Matplotlib")):
            continue  # not a plot: no size known for its text
        points = float(said.split()[0]) if said else MATPLOTLIB_POINTS
        shown = points / 72 * dpi * image["shown"] / image["natural"]
        if shown < LEGIBLE_PX:
            size = f"{points:g} pt" if said else f"{points:g} pt, matplotlib's default,"
            yield (
                f'<img> "{image["alt"]}" shows its smallest text at {shown:.1f} px '
                f"({size} at {dpi:.0f} dpi, {image['natural']} px shown "
                f"{image['shown']:.0f} px wide), under {LEGIBLE_PX} px: draw it for this width "
                "too, as NAME_narrow.png beside it (docs/conf.py shows it on a phone)"
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
        # Typeset math (if MathJax loaded), web fonts and images settle the layout.
        self.run(TYPESET)
        self.run("return document.fonts.ready.then(() => true);")

    def run(self, script, *args):
        body = {"script": script, "args": list(args)}
        return self._call("POST", f"{self._session}/execute/sync", body)

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
                    seen = chromium.run(MEASURE, BUILTIN_DOCSTRINGS)
                    found = seen["findings"] + list(_small_text(seen["images"]))
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
