"""Checks that the page's plots can be read: every SVG is rendered by
headless Chromium, and the boxes its layout engine gives each element are
compared: no text may overlap another text, and nothing (text, bar, line,
point) may lie outside the canvas.

    python3 -m strata_bench.svgcheck docs/seeds/*.svg

prints one line per problem and exits 1 if there is any. `make test` runs
it on the plots of the paper smoke run (crates/cli/tests/bench_quick.rs)."""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# How far a box may cross another, or the canvas edge, in px, before it
# counts (anti-aliasing and font hinting move edges by a pixel).
SLACK = 1.0

_JS = """
const out = [];
for (const holder of document.querySelectorAll('div[data-name]')) {
  const svg = holder.querySelector('svg');
  const c = svg.getBoundingClientRect();
  const items = [];
  for (const el of svg.querySelectorAll('text, rect, line, polyline, circle')) {
    if (el.parentNode === svg && el.tagName === 'rect' && el.getAttribute('width') === '100%') continue;
    const b = el.getBoundingClientRect();
    items.push({tag: el.tagName, text: el.tagName === 'text' ? el.textContent : '',
                x0: b.left - c.left, y0: b.top - c.top, x1: b.right - c.left, y1: b.bottom - c.top});
  }
  out.push({name: holder.dataset.name, w: c.width, h: c.height, items: items});
}
document.getElementById('out').textContent = JSON.stringify(out);
"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def boxes(paths):
    """Render every SVG in PATHS in one headless Chromium page; returns
    [{name, w, h, items: [{tag, text, x0, y0, x1, y1}]}]."""
    exe = chromium()
    if not exe:
        raise FileNotFoundError("svgcheck: no chromium (scripts/install-deps.sh installs it)")
    parts = []
    for p in paths:
        with open(p) as f:
            svg = f.read()
        svg = re.sub(r"^<\?xml[^>]*>", "", svg)
        parts.append(f'<div data-name="{html.escape(os.path.basename(p))}">{svg}</div>')
    page = ("<!doctype html><html><body style='margin:0'>" + "".join(parts)
            + "<pre id='out'></pre><script>" + _JS + "</script></body></html>")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "plots.html")
        with open(src, "w") as f:
            f.write(page)
        r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                            f"--user-data-dir={os.path.join(d, 'profile')}", "--dump-dom",
                            "file://" + src], capture_output=True, text=True, timeout=120)
    m = re.search(r"<pre id=\"out\">(.*?)</pre>", r.stdout, re.S)
    if r.returncode != 0 or not m or not m.group(1).strip():
        raise RuntimeError(f"svgcheck: chromium gave no layout (exit {r.returncode}): {r.stderr[-500:]}")
    return json.loads(html.unescape(m.group(1)))


def problems(rendered):
    """What cannot be read, one sentence each."""
    out = []
    for svg in rendered:
        name, w, h = svg["name"], svg["w"], svg["h"]
        for it in svg["items"]:
            if (it["x0"] < -SLACK or it["y0"] < -SLACK or it["x1"] > w + SLACK
                    or it["y1"] > h + SLACK):
                what = f"text {it['text']!r}" if it["tag"] == "text" else it["tag"]
                out.append(f"{name}: {what} lies outside the {w:.0f}×{h:.0f} canvas "
                           f"({it['x0']:.0f},{it['y0']:.0f})-({it['x1']:.0f},{it['y1']:.0f})")
        texts = [it for it in svg["items"] if it["tag"] == "text" and it["text"].strip()]
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                dx = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
                dy = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
                if dx > SLACK and dy > SLACK:
                    out.append(f"{name}: text {a['text']!r} overlaps {b['text']!r} "
                               f"by {dx:.0f}×{dy:.0f} px")
    return out


def main(argv):
    paths = argv[1:]
    if not paths:
        print("usage: python3 -m strata_bench.svgcheck FILE.svg...", file=sys.stderr)
        return 2
    found = problems(boxes(paths))
    for p in found:
        print(p)
    print(f"svgcheck: {len(paths)} plots, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
