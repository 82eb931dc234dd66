"""Tiny SVG chart writer for the benchmark results (stdlib only).

    line_chart(path, title, xlabel, ylabel, series, panels=None)
    bar_chart(path, title, ylabel, groups, names, values)
    heat_table(path, title, rows, cols, cells, fmt, center=1.0)

Every function writes one self-contained SVG file with axes, ticks, labels
and a legend; nothing is interactive and no fonts are embedded.
"""
import math
from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
DASHES = ["", "6,3", "2,3", "8,3,2,3"]
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


def _nice_step(span, n=5):
    if span <= 0:
        return 1.0
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(lo, hi, n=5, integer=False):
    """Round tick values covering [lo, hi] (the last tick is >= hi)."""
    step = _nice_step(hi - lo, n)
    if integer:
        step = max(1, round(step))
    start = math.floor(lo / step) * step
    end = math.ceil(hi / step - 1e-9) * step
    out, v = [], start
    while v <= end + step * 1e-9:
        out.append(round(v, 10))
        v += step
    return out


def _fmt(v):
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a == int(a):
        return str(int(v))
    return f"{v:g}"


def _text(x, y, s, size=12, anchor="middle", extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'{FONT} {extra}>{escape(str(s))}</text>')


def _svg(w, h, body):
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def _panel(ox, oy, pw, ph, title, xlabel, ylabel, series, xticks=None, ymin0=True,
           xlabels=None):
    """One line-chart panel at (ox, oy) of size pw x ph; returns SVG elements.

    series: list of {"name", "points": [(x, y), ...], "color"?, "dash"?};
    xlabels: {x: label} printed at those ticks instead of the numbers
    (e.g. I/O sizes on a log2 axis).
    """
    body = []
    ml, mr, mt, mb = 70, 15, 30, 70
    x0, y0, x1, y1 = ox + ml, oy + mt, ox + pw - mr, oy + ph - mb
    pts = [p for s in series for p in s["points"] if p[1] is not None]
    if not pts:
        pts = [(0, 0), (1, 1)]
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xlo, xhi = min(xs), max(xs)
    if xlo == xhi:
        xhi = xlo + 1
    ylo = 0 if ymin0 else min(ys)
    yhi = max(ys) * 1.08 if max(ys) > 0 else 1
    yt = _ticks(ylo, yhi)
    ylo, yhi = min(yt[0], ylo), max(yt[-1], yhi)
    xint = all(float(x).is_integer() for x in xs)
    xt = sorted(xlabels) if xlabels else (xticks or _ticks(xlo, xhi, 8, integer=xint))

    def X(v):
        return x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)

    def Y(v):
        return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

    body.append(_text((x0 + x1) / 2, oy + 18, title, 14, extra='font-weight="bold"'))
    for t in yt:
        body.append(f'<line x1="{x0}" y1="{Y(t):.1f}" x2="{x1}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        body.append(_text(x0 - 6, Y(t) + 4, _fmt(t), 11, "end"))
    for t in xt:
        if xlo <= t <= xhi:
            body.append(f'<line x1="{X(t):.1f}" y1="{y1}" x2="{X(t):.1f}" y2="{y1 + 5}" stroke="black"/>')
            body.append(_text(X(t), y1 + 18, xlabels[t] if xlabels else _fmt(t), 11))
    body.append(f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>')
    body.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    body.append(_text((x0 + x1) / 2, y1 + 36, xlabel, 12))
    body.append(_text(ox + 16, (y0 + y1) / 2, ylabel, 12,
                      extra=f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2:.1f})"'))
    for i, s in enumerate(series):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        dash = s.get("dash", "")
        p = [(X(x), Y(y)) for x, y in s["points"] if y is not None]
        if not p:
            continue
        d = " ".join(f"{a:.1f},{b:.1f}" for a, b in p)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        body.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{da}/>')
        for a, b in p:
            body.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
    # Legend: one row under the x-axis label, outside the plot area.
    lx, yy = x0, y1 + 58
    for i, s in enumerate(series):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        dash = s.get("dash", "")
        da = f' stroke-dasharray="{dash}"' if dash else ""
        body.append(f'<line x1="{lx}" y1="{yy - 4}" x2="{lx + 24}" y2="{yy - 4}" '
                    f'stroke="{color}" stroke-width="2"{da}/>')
        body.append(f'<circle cx="{lx + 12}" cy="{yy - 4}" r="3" fill="{color}"/>')
        body.append(_text(lx + 30, yy, s["name"], 11, "start"))
        lx += 30 + 7 * len(s["name"]) + 20
    return body


def line_chart(path, title, panels, cols=2, pw=520, ph=340):
    """panels: list of dicts with keys title, xlabel, ylabel, series (see _panel)."""
    rows = (len(panels) + cols - 1) // cols
    cols = min(cols, len(panels))
    w, h = pw * cols, ph * rows + 36
    # A long title gets a smaller font rather than running off both edges
    # (bold sans: about 0.62 em a character).
    size = max(9, min(16, int((w - 20) / (0.62 * max(1, len(title))))))
    body = [_text(w / 2, 24, title, size, extra='font-weight="bold"')]
    for i, p in enumerate(panels):
        ox, oy = (i % cols) * pw, 36 + (i // cols) * ph
        body += _panel(ox, oy, pw, ph, p["title"], p["xlabel"], p["ylabel"], p["series"],
                       p.get("xticks"), xlabels=p.get("xlabels"))
    with open(path, "w") as f:
        f.write(_svg(w, h, body))


def bar_chart(path, title, ylabel, groups, names, values, note="", w=None, h=380, xlabel=""):
    """Grouped bars: one group per label in `groups`, one bar per series
    in `names` (a colour each, legend below); values[i][j] is group i's
    bar j (None: no bar). Each bar carries its value on top."""
    ml, mr, mt, mb = 70, 15, 44, 96
    per = max(1, len(names))
    gw = max(60, 18 * per + 24)
    w = w or max(420, ml + mr + gw * len(groups), 9 * len(title) + 40)
    x0, y0, x1, y1 = ml, mt, w - mr, h - mb
    vals = [v for row in values for v in row if v is not None]
    yhi = max(vals) * 1.12 if vals and max(vals) > 0 else 1
    yt = _ticks(0, yhi)
    yhi = max(yt[-1], yhi)

    def Y(v):
        return y1 - v / yhi * (y1 - y0)
    body = [_text(w / 2, 24, title, 15, extra='font-weight="bold"')]
    for t in yt:
        body.append(f'<line x1="{x0}" y1="{Y(t):.1f}" x2="{x1}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        body.append(_text(x0 - 6, Y(t) + 4, _fmt(t), 11, "end"))
    body.append(f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>')
    body.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    body.append(_text(16, (y0 + y1) / 2, ylabel, 12, extra=f'transform="rotate(-90 16 {(y0 + y1) / 2:.1f})"'))
    slot = (x1 - x0) / max(1, len(groups))
    bw = min(18, (slot - 12) / per)
    for i, g in enumerate(groups):
        gx = x0 + slot * i + (slot - bw * per) / 2
        for j in range(per):
            v = values[i][j]
            if v is None:
                continue
            bx = gx + bw * j
            body.append(f'<rect x="{bx:.1f}" y="{Y(v):.1f}" width="{bw - 1:.1f}" '
                        f'height="{max(0.5, y1 - Y(v)):.1f}" fill="{PALETTE[j % len(PALETTE)]}"/>')
            if per <= 8:
                body.append(_text(bx + bw / 2, Y(v) - 3, _fmt(round(v, 2) if v < 100 else round(v)),
                                  8))
        body.append(_text(x0 + slot * i + slot / 2, y1 + 16, g, 11))
    if xlabel:
        body.append(_text((x0 + x1) / 2, y1 + 32, xlabel, 12))
    lx, yy = x0, y1 + 50
    for j, n in enumerate(names):
        if lx + 30 + 7 * len(n) > w:
            lx, yy = x0, yy + 18
        body.append(f'<rect x="{lx}" y="{yy - 10}" width="14" height="12" fill="{PALETTE[j % len(PALETTE)]}"/>')
        body.append(_text(lx + 20, yy, n, 11, "start"))
        lx += 30 + 7 * len(n)
    if note:
        body.append(_text(w / 2, h - 8, note, 11))
    with open(path, "w") as f:
        f.write(_svg(w, h, body))


def _heat_color(v, center):
    """White at center, green above (better), red below; saturates at 2x / 0.5x."""
    if v is None:
        return "#dddddd"
    t = max(-1.0, min(1.0, math.log2(v / center)))
    if t >= 0:
        r, g, b = int(255 - 150 * t), int(255 - 40 * t), int(255 - 150 * t)
    else:
        t = -t
        r, g, b = 255, int(255 - 150 * t), int(255 - 150 * t)
    return f"rgb({r},{g},{b})"


def heat_table(path, title, rows, cols, cells, fmt=lambda v: f"{v:.2f}", center=1.0,
               note=""):
    """rows, cols: labels; cells[r][c]: value or None. Colour by ratio to center."""
    cw, rh, lw, th = 74, 26, 190, 70
    w = lw + cw * len(cols) + 20
    h = th + rh * len(rows) + 70
    body = [_text(w / 2, 24, title, 15, extra='font-weight="bold"')]
    for j, c in enumerate(cols):
        x = lw + cw * j + cw / 2
        for k, part in enumerate(str(c).split("\n")):
            body.append(_text(x, th - 30 + 14 * k, part, 11))
    for i, r in enumerate(rows):
        y = th + rh * i
        body.append(_text(lw - 8, y + rh / 2 + 4, r, 12, "end"))
        for j in range(len(cols)):
            v = cells[i][j]
            x = lw + cw * j
            body.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{rh}" '
                        f'fill="{_heat_color(v, center)}" stroke="white"/>')
            body.append(_text(x + cw / 2, y + rh / 2 + 4, "—" if v is None else fmt(v), 11))
    y = th + rh * len(rows) + 24
    legend = [(0.5, "≤0.5×"), (0.75, "0.75×"), (1.0, "1×"), (1.5, "1.5×"), (2.0, "≥2×")]
    for k, (v, lab) in enumerate(legend):
        x = lw + 70 * k
        body.append(f'<rect x="{x}" y="{y}" width="20" height="14" fill="{_heat_color(v * center, center)}" stroke="#999"/>')
        body.append(_text(x + 24, y + 11, lab, 11, "start"))
    if note:
        body.append(_text(w / 2, y + 36, note, 11))
    with open(path, "w") as f:
        f.write(_svg(w, h, body))
