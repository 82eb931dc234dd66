"""Tiny SVG chart writer for the benchmark results (stdlib only).

    line_chart(path, title, panels, cols, pw, ph)
    bar_chart(path, title, ylabel, groups, names, values, errors=...)
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


def text_width(s, size):
    """An estimate of a label's width in px (DejaVu Sans: about 0.62 em a
    character, wider than most; the SVG check in make test measures the
    real boxes)."""
    return 0.62 * size * len(str(s))


def _legend_rows(names, width, size=11, sym=30, gap=14):
    """Lay out legend entries in rows no wider than WIDTH: [(x offset, row)]."""
    out, x, row = [], 0, 0
    for n in names:
        w = sym + text_width(n, size) + gap
        if x and x + w > width:
            x, row = 0, row + 1
        out.append((x, row))
        x += w
    return out


def _panel(ox, oy, pw, ph, title, xlabel, ylabel, series, xticks=None, ymin0=True,
           xlabels=None, y2label=None, y2max=None):
    """One line-chart panel at (ox, oy) of size pw x ph; returns SVG elements.

    series: list of {"name", "points": [(x, y), ...], "color"?, "dash"?,
    "axis"? (2: the right-hand axis, y2label), "err"? ([(lo, hi)] per
    point, drawn as bars)}; xlabels: {x: label} printed at those ticks
    instead of the numbers (e.g. I/O sizes on a log2 axis). The legend
    wraps inside the panel, under the x-axis label.
    """
    body = []
    ml, mr, mt = 70, (60 if y2label else 15), 30
    legend = _legend_rows([s["name"] for s in series], pw - ml - mr)
    rows = 1 + max((r for _, r in legend), default=0)
    mb = 62 + 18 * rows
    x0, y0, x1, y1 = ox + ml, oy + mt, ox + pw - mr, oy + ph - mb
    left = [s for s in series if s.get("axis", 1) != 2]
    right = [s for s in series if s.get("axis", 1) == 2]
    pts = [p for s in series for p in s["points"] if p[1] is not None]
    lpts = [p for s in left for p in s["points"] if p[1] is not None]
    lpts += [(p[0], e[1]) for s in left for p, e in zip(s["points"], s.get("err") or []) if e]
    if not pts:
        pts = [(0, 0), (1, 1)]
    if not lpts:
        lpts = [(0, 0), (1, 1)]
    xs = [p[0] for p in pts]
    ys = [p[1] for p in lpts]
    xlo, xhi = min(xs), max(xs)
    if xlo == xhi:
        xhi = xlo + 1
    ylo = 0 if ymin0 else min(ys)
    yhi = max(ys) * 1.08 if max(ys) > 0 else 1
    yt = _ticks(ylo, yhi)
    ylo, yhi = min(yt[0], ylo), max(yt[-1], yhi)
    xint = all(float(x).is_integer() for x in xs)
    xt = sorted(xlabels) if xlabels else (xticks or _ticks(xlo, xhi, 8, integer=xint))
    r2 = [p[1] for s in right for p in s["points"] if p[1] is not None]
    y2hi = y2max or (max(r2) * 1.08 if r2 and max(r2) > 0 else 1)

    def X(v):
        return x0 + (v - xlo) / (xhi - xlo) * (x1 - x0)

    def Y(v, axis=1):
        if axis == 2:
            return y1 - v / y2hi * (y1 - y0)
        return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

    size = max(9, min(14, int((pw - 20) / (0.62 * max(1, len(title))))))
    body.append(_text(ox + pw / 2, oy + 18, title, size, extra='font-weight="bold"'))
    for t in yt:
        body.append(f'<line x1="{x0}" y1="{Y(t):.1f}" x2="{x1}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        body.append(_text(x0 - 6, Y(t) + 4, _fmt(t), 11, "end"))
    if right:
        for t in _ticks(0, y2hi):
            if t <= y2hi:
                body.append(_text(x1 + 6, Y(t, 2) + 4, _fmt(t), 11, "start"))
        body.append(f'<line x1="{x1}" y1="{y0}" x2="{x1}" y2="{y1}" stroke="black"/>')
        body.append(_text(ox + pw - 12, (y0 + y1) / 2, y2label, 12,
                          extra=f'transform="rotate(90 {ox + pw - 12} {(y0 + y1) / 2:.1f})"'))
    shown = [t for t in xt if xlo <= t <= xhi]
    # Tick labels that would touch are thinned (every other, and so on).
    lab = [xlabels[t] if xlabels else _fmt(t) for t in shown]
    room = (x1 - x0) / max(1, len(shown) - 1) if len(shown) > 1 else x1 - x0
    step = 1
    while step < len(shown) and max((text_width(s, 11) for s in lab), default=0) + 4 > room * step:
        step += 1
    for i, t in enumerate(shown):
        body.append(f'<line x1="{X(t):.1f}" y1="{y1}" x2="{X(t):.1f}" y2="{y1 + 5}" stroke="black"/>')
        if i % step == 0:
            body.append(_text(X(t), y1 + 18, lab[i], 11))
    body.append(f'<line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="black"/>')
    body.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    body.append(_text((x0 + x1) / 2, y1 + 36, xlabel, 12))
    body.append(_text(ox + 16, (y0 + y1) / 2, ylabel, 12,
                      extra=f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2:.1f})"'))
    for i, s in enumerate(series):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        dash = s.get("dash", "")
        axis = s.get("axis", 1)
        p = [(X(x), Y(y, axis)) for x, y in s["points"] if y is not None]
        if not p:
            continue
        d = " ".join(f"{a:.1f},{b:.1f}" for a, b in p)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        body.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"{da}/>')
        for a, b in p:
            body.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
        for (x, _), e in zip(s["points"], s.get("err") or []):
            if e and e[1] > e[0]:
                body.append(f'<line x1="{X(x):.1f}" y1="{Y(e[0], axis):.1f}" x2="{X(x):.1f}" '
                            f'y2="{Y(e[1], axis):.1f}" stroke="{color}" stroke-width="1"/>')
    yy0 = y1 + 58
    for (dx, row), (i, s) in zip(legend, enumerate(series)):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        dash = s.get("dash", "")
        da = f' stroke-dasharray="{dash}"' if dash else ""
        lx, yy = x0 + dx, yy0 + 18 * row
        body.append(f'<line x1="{lx:.1f}" y1="{yy - 4}" x2="{lx + 24:.1f}" y2="{yy - 4}" '
                    f'stroke="{color}" stroke-width="2"{da}/>')
        body.append(f'<circle cx="{lx + 12:.1f}" cy="{yy - 4}" r="3" fill="{color}"/>')
        body.append(_text(lx + 30, yy, s["name"], 11, "start"))
    return body


def line_chart(path, title, panels, cols=2, pw=520, ph=340):
    """panels: list of dicts with keys title, xlabel, ylabel, series and
    optionally xticks, xlabels, y2label, y2max (see _panel)."""
    rows = (len(panels) + cols - 1) // cols
    cols = min(cols, len(panels))
    w, h = pw * cols, ph * rows + 36
    # A long title gets a smaller font rather than running off both edges.
    size = max(9, min(16, int((w - 20) / (0.62 * max(1, len(title))))))
    body = [_text(w / 2, 24, title, size, extra='font-weight="bold"')]
    for i, p in enumerate(panels):
        ox, oy = (i % cols) * pw, 36 + (i // cols) * ph
        body += _panel(ox, oy, pw, ph, p["title"], p["xlabel"], p["ylabel"], p["series"],
                       p.get("xticks"), xlabels=p.get("xlabels"), y2label=p.get("y2label"),
                       y2max=p.get("y2max"))
    with open(path, "w") as f:
        f.write(_svg(w, h, body))


def _group_label(x, y, s, width):
    """A category label centred at x that fits WIDTH: a smaller font, then
    two lines (split at a space or underscore), then a smaller font still."""
    size = 11
    if text_width(s, size) <= width:
        return [_text(x, y, s, size)]
    parts = str(s).replace("_", "_ ").split(" ")
    if len(parts) > 1:
        best = min(range(1, len(parts)), key=lambda k: abs(len(" ".join(parts[:k])) - len(" ".join(parts[k:]))))
        lines = [" ".join(parts[:best]).replace("_ ", "_"), " ".join(parts[best:]).replace("_ ", "_")]
    else:
        lines = [str(s)]
    size = max(6, min(11, int(width / (0.62 * max(len(t) for t in lines)))))
    return [_text(x, y + k * (size + 2), t, size) for k, t in enumerate(lines)]


def bar_chart(path, title, ylabel, groups, names, values, note="", w=None, h=380, xlabel="",
              errors=None):
    """Grouped bars: one group per label in `groups`, one bar per series
    in `names` (a colour each, legend below); values[i][j] is group i's
    bar j (None: no bar; below zero: drawn down from the zero line).
    errors[i][j], when given, is (lo, hi): a range bar over the bar. Each
    bar carries its value when it fits."""
    ml, mr, mt = 70, 15, 44
    per = max(1, len(names))
    gw = max(60, 18 * per + 24)
    w = w or max(420, ml + mr + gw * len(groups), int(text_width(title, 15)) + 40)
    legend = _legend_rows(names, w - ml - mr, sym=20, gap=10)
    lrows = 1 + max((r for _, r in legend), default=0)
    slot = (w - ml - mr) / max(1, len(groups))
    two_line = any(text_width(g, 11) > slot - 4 for g in groups)
    mb = 52 + (14 if two_line else 0) + (16 if xlabel else 0) + 18 * lrows + (18 if note else 0)
    h = max(h, mt + 200 + mb)
    x0, y0, x1, y1 = ml, mt, w - mr, h - mb
    vals = [v for row in values for v in row if v is not None]
    if errors:
        vals += [e for row in errors for pair in row if pair for e in pair]
    bw = min(18, (slot - 12) / per)
    vertical = any(text_width(_bar_label(v), 8) > bw for v in vals)
    head = 1.25 if vertical else 1.12
    yhi = max(vals) * head if vals and max(vals) > 0 else 1
    ylo = min(vals) * head if vals and min(vals) < 0 else 0
    yt = _ticks(ylo, yhi)
    ylo, yhi = min(yt[0], ylo), max(yt[-1], yhi)

    def Y(v):
        return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)
    body = [_text(w / 2, 24, title, 15, extra='font-weight="bold"')]
    for t in yt:
        body.append(f'<line x1="{x0}" y1="{Y(t):.1f}" x2="{x1}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        body.append(_text(x0 - 6, Y(t) + 4, _fmt(t), 11, "end"))
    body.append(f'<line x1="{x0}" y1="{Y(0):.1f}" x2="{x1}" y2="{Y(0):.1f}" stroke="black"/>')
    body.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
    body.append(_text(16, (y0 + y1) / 2, ylabel, 12, extra=f'transform="rotate(-90 16 {(y0 + y1) / 2:.1f})"'))
    for i, g in enumerate(groups):
        gx = x0 + slot * i + (slot - bw * per) / 2
        for j in range(per):
            v = values[i][j]
            if v is None:
                continue
            bx = gx + bw * j
            top, bot = (Y(v), Y(0)) if v >= 0 else (Y(0), Y(v))
            body.append(f'<rect x="{bx:.1f}" y="{top:.1f}" width="{bw - 1:.1f}" '
                        f'height="{max(0.5, bot - top):.1f}" fill="{PALETTE[j % len(PALETTE)]}"/>')
            e = errors[i][j] if errors and errors[i] and errors[i][j] else None
            if e and e[1] > e[0]:
                cx = bx + (bw - 1) / 2
                body.append(f'<line x1="{cx:.1f}" y1="{Y(e[0]):.1f}" x2="{cx:.1f}" y2="{Y(e[1]):.1f}" '
                            'stroke="black" stroke-width="1"/>')
                for ev in e:
                    body.append(f'<line x1="{cx - 3:.1f}" y1="{Y(ev):.1f}" x2="{cx + 3:.1f}" '
                                f'y2="{Y(ev):.1f}" stroke="black" stroke-width="1"/>')
            if bw >= 7:
                lab = _bar_label(v)
                end = max(v, e[1]) if e and v >= 0 else min(v, e[0]) if e else v
                ty = Y(end) - 3 if v >= 0 else Y(end) + 3
                cx = bx + bw / 2
                if vertical:
                    anchor = "start" if v >= 0 else "end"
                    body.append(_text(cx + 3, ty, lab, 8, anchor,
                                      extra=f'transform="rotate(-90 {cx + 3:.1f} {ty:.1f})"'))
                else:
                    body.append(_text(cx, ty if v >= 0 else ty + 8, lab, 8))
        body += _group_label(x0 + slot * i + slot / 2, y1 + 16, g, slot - 4)
    yy = y1 + 34 + (14 if two_line else 0)
    if xlabel:
        body.append(_text((x0 + x1) / 2, yy, xlabel, 12))
        yy += 16
    yy += 14
    for (dx, row), (j, n) in zip(legend, enumerate(names)):
        lx, ly = x0 + dx, yy + 18 * row
        body.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="14" height="12" fill="{PALETTE[j % len(PALETTE)]}"/>')
        body.append(_text(lx + 20, ly, n, 11, "start"))
    if note:
        body.append(_text(w / 2, h - 8, note, 11))
    with open(path, "w") as f:
        f.write(_svg(w, h, body))


def _bar_label(v):
    return _fmt(round(v, 2) if abs(v) < 100 else round(v))


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
