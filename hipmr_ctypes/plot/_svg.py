"""Draw a :class:`~hipmr_ctypes.plot._model.View` as SVG (no scripts, no external references;
hovering a band shows its tooltip through the SVG ``<title>`` element)."""
from __future__ import annotations

import math
import re
from typing import Dict, List, Sequence, Tuple
from xml.sax.saxutils import escape, quoteattr

from ._model import View

__all__ = ["Layout", "render_svg", "format_bytes", "stats_lines", "xml_text", "xml_attr"]

#: What XML 1.0 cannot hold at all: control characters other than tab, newline and carriage
#: return, lone surrogates (a file name that is not UTF-8, decoded by ``os.fsdecode``) and
#: the two non-characters U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` escaped for an element's content, each character XML cannot hold replaced by
    U+FFFD (so that a title or a file name with control characters still gives valid XML
    that can be written as UTF-8)."""
    return escape(_NOT_XML.sub("\ufffd", text))


def xml_attr(text: str) -> str:
    """``text`` as a quoted attribute value (see :func:`xml_text`)."""
    return quoteattr(_NOT_XML.sub("\ufffd", text))

TAB10 = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
         "#ff9da7", "#9c755f", "#bab0ac")
SIZES = ("#fde725", "#a0da39", "#4ac16d", "#1fa187", "#277f8e", "#365c8d", "#46327e",
         "#440154")
OTHER = "#cfcfcf"
POOL = "#d62728"

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


class Layout:
    """Where the plot area lies in a picture of ``width`` x ``height`` pixels."""

    left = 76.0
    right = 18.0
    top = 34.0
    bottom = 92.0

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.plot_width = float(width) - self.left - self.right
        self.plot_height = float(height) - self.top - self.bottom


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for scale, unit in _UNITS:
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.{0 if value >= 100 else 1 if value >= 10 else 2}f} {unit}"
    return f"{int(n)} B"


#: Most ticks on an axis.  Every tick loop counts whole steps (``k * step``), never adds a
#: step to a running value, so it ends for any span: a step below the running value's
#: precision cannot stall it.
MAX_TICKS = 24


def _nice(span: float, count: int) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about ``count`` steps over
    ``span``; 1.0 for a span that is zero, negative or not finite."""
    raw = span / max(count, 1)
    if not (raw > 0 and math.isfinite(raw)):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _steps(top: float, step: float) -> List[float]:
    """``0, step, 2 * step, ...`` up to ``top`` (a little past it for rounding), at most
    ``MAX_TICKS`` of them."""
    if not (top > 0 and math.isfinite(top)) or not (step > 0 and math.isfinite(step)):
        return [0.0]
    n = min(int(top * 1.0001 / step), MAX_TICKS - 1)
    return [k * step for k in range(n + 1)]


def _byte_ticks(y_max: int) -> List[Tuple[float, str]]:
    scale, unit = next(((s, u) for s, u in _UNITS if y_max >= s), (1, "B"))
    top = y_max / scale                 # y_max is below 2**64 * events: a finite float
    step = _nice(top, 5)
    return [(v * scale, f"{v:.6g} {unit}" if v else "0") for v in _steps(top, step)]


#: The x axis's units of time, largest first: (at least this span in seconds, unit, factor).
_TIME_UNITS = ((1.0, "s", 1.0), (1e-3, "ms", 1e3), (1e-6, "us", 1e6), (1e-9, "ns", 1e9))


def _x_ticks(view: View, plot_width: float) -> List[Tuple[float, str]]:
    src = view.source
    n = len(src.xs)
    if n == 0:
        return []
    if src.axis == "event":
        step = max(1.0, _nice(max(n - 1, 1), 8))
        what = "allocation #" if src.kind == "tracking" else "event #"
        out: List[Tuple[float, str]] = []
        for v in _steps(n - 1, step) if n > 1 else [0.0]:
            i = min(int(v), n - 1)
            out.append((src.xs[i], f"{what}{i + 1}" if not out else f"#{i + 1}"))
        return out
    first = src.seconds[0]
    span = max(src.seconds) - first
    if not (span > 0 and math.isfinite(span)):
        return [(0.0, "+0 s")]
    unit, factor = next(((u, f) for least, u, f in _TIME_UNITS if span >= least),
                        ("s", 1.0))
    top = span * factor
    out = []
    for v in _steps(top, _nice(top, 8)):
        out.append((min(v / top, 1.0) * plot_width, f"+{v:.6g} {unit}"))
    return out


def _f(v: float) -> str:
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return text if text not in ("-0", "") else "0"


class _Y:
    def __init__(self, layout: Layout, y_max: int) -> None:
        self.base = layout.top + layout.plot_height
        self.scale = layout.plot_height / y_max

    def __call__(self, b: float) -> str:
        return f"{self.base - b * self.scale:.1f}"


def _colors(view: View, color: str) -> Tuple[Dict[int, str], List[Tuple[str, str]]]:
    """Fill per band (by allocation number) and the legend entries."""
    src = view.source
    fills: Dict[int, str] = {}
    legend: List[Tuple[str, str]] = []
    if color == "stream":
        streams: Dict[int, str] = {}
        for a in view.allocations:
            s = src.a_stream[a]
            if s not in streams:
                streams[s] = TAB10[len(streams) % len(TAB10)]
        for b in view.bands:
            fills[b.allocation] = streams[src.a_stream[b.allocation]]
        legend = [(c, f"stream {s:#x}" if s else "stream 0") for s, c in
                  list(streams.items())[:10]]
        return fills, legend
    sizes = [src.a_size[b.allocation] for b in view.bands]
    if not sizes:
        return fills, legend
    lo = max(min(sizes), 1).bit_length() - 1
    hi = max(max(sizes), 1).bit_length() - 1
    span = max(hi - lo, 1)

    def bucket(size: int) -> int:
        return round((max(size, 1).bit_length() - 1 - lo) / span * (len(SIZES) - 1))

    for b in view.bands:
        fills[b.allocation] = SIZES[bucket(src.a_size[b.allocation])]
    seen: Dict[int, int] = {}
    for s in sorted(sizes):
        seen.setdefault(bucket(s), s)
    legend = [(SIZES[k], f"≥ {format_bytes(1 << (s.bit_length() - 1))}")
              for k, s in sorted(seen.items())]
    return fills, legend


def _band_title(view: View, a: int) -> str:
    src = view.source
    al = src.allocation(a)
    where = f"stream {al.stream:#x}" if al.stream else "stream 0"
    lines = [f"{al.size:,} bytes ({format_bytes(al.size)}) at {al.ptr:#x}, {where}"]
    if src.kind != "tracking":
        lines[0] += f", thread {al.thread}"
    start = f"allocated {src.labels[al.start]}"
    if src.lines[al.start]:
        start += f" (line {src.lines[al.start]})"
    lines.append(start)
    if al.end is not None:
        end = f"freed {src.labels[al.end]}"
        if src.lines[al.end]:
            end += f" (line {src.lines[al.end]})"
        lines.append(end)
    else:
        lines.append("still live at the end")
    if al.stack:
        lines.append(al.stack)
    return "\n".join(lines)


def _band_path(steps: Sequence[Tuple[float, int]], end_x: float, size: int, y: _Y) -> str:
    x0, o0 = steps[0]
    parts = [f"M{_f(x0)} {y(o0)}"]
    for x, o in steps[1:]:
        parts.append(f"H{_f(x)}V{y(o)}")
    parts.append(f"H{_f(end_x)}V{y(steps[-1][1] + size)}")
    for i in range(len(steps) - 1, 0, -1):
        parts.append(f"H{_f(steps[i][0])}V{y(steps[i - 1][1] + size)}")
    parts.append(f"H{_f(x0)}Z")
    return "".join(parts)


def _curve_path(columns: Sequence[Tuple[int, int, int]], left: float, right_x: float,
                y: _Y) -> List[str]:
    """The step curve through ``(column, max, end)`` from the left edge to ``right_x``: each
    column at its maximum, and the level at a column's end carried over the columns without
    events after it."""
    parts = [f"M{_f(left)} {y(0)}"]
    n = len(columns)
    for i, (c, hi, end) in enumerate(columns):
        x = left + c
        parts.append(f"H{_f(x)}V{y(hi)}H{_f(x + 1)}")
        if i + 1 == n or columns[i + 1][0] != c + 1:
            parts.append(f"V{y(end)}")
    parts.append(f"H{_f(right_x)}")
    return parts


def stats_lines(view: View) -> List[str]:
    """The statistics under the picture, in words."""
    s = view.stats
    src = view.source
    out = []
    if view.peak_event is not None:
        out.append(f"peak {format_bytes(s['peak_bytes'])} ({s['peak_bytes']:,} bytes) at "
                   f"{src.labels[view.peak_event]}"
                   + (f" (line {src.lines[view.peak_event]})" if src.lines[view.peak_event]
                      else "")
                   + f"; at most {s['peak_count']:,} allocations live")
    out.append(f"{s['total_count']:,} allocations, {format_bytes(s['total_bytes'])} in total; "
               f"{s['frees']:,} frees; {s['failures']:,} failed allocations; "
               f"{s['current_count']:,} live at the end ({format_bytes(s['current_bytes'])})"
               + (f"; {s['unmatched_frees']:,} frees without an allocation"
                  if s.get("unmatched_frees") else ""))
    if s.get("peak_pool_size") is not None:
        frag = s["fragmentation"]
        out.append(f"peak pool size {format_bytes(s['peak_pool_size'])}"
                   + (f" = {frag:.2f} x the peak of live bytes" if frag else ""))
    return out


def render_svg(view: View, layout: Layout, *, title: str, color: str,
               standalone: bool = True) -> str:
    """The SVG document (``standalone``) or element for ``view``."""
    L, T = layout.left, layout.top
    pw, ph = layout.plot_width, layout.plot_height
    y = _Y(layout, view.y_max)
    src = view.source
    s = view.stats
    peak_x = src.xs[view.peak_event] if view.peak_event is not None else 0.0
    out: List[str] = []
    attrs = {
        "width": str(layout.width), "height": str(layout.height),
        "viewBox": f"0 0 {layout.width} {layout.height}", "class": "hipmr-timeline",
        "font-family": "DejaVu Sans, Helvetica, Arial, sans-serif", "font-size": "11",
        "data-peak-bytes": str(s["peak_bytes"]), "data-peak-x": _f(L + peak_x),
        "data-y-max": str(view.y_max), "data-axis": src.axis, "data-view": view.name,
        "data-plot": f"{_f(L)} {_f(T)} {_f(pw)} {_f(ph)}",
        "data-bands": str(len(view.bands)), "data-other": str(view.other_count),
    }
    if standalone:
        attrs["xmlns"] = "http://www.w3.org/2000/svg"
    out.append("<svg " + " ".join(f"{k}={xml_attr(v)}" for k, v in attrs.items()) + ">")
    out.append(f"<title>{xml_text(title)}</title>")
    out.append("<style>.band{stroke:#fff;stroke-width:" + (".3" if len(view.bands) < 300
                                                             else "0") + "}.band:hover{stroke:#000;"
               "stroke-width:1}.axis{stroke:#888;stroke-width:1}.grid{stroke:#e4e4e4;"
               "stroke-width:1}text{fill:#222}</style>")
    out.append(f'<rect width="{layout.width}" height="{layout.height}" fill="#fff"/>')
    out.append(f'<text x="{_f(L)}" y="20" font-size="14" font-weight="bold">'
               f'{xml_text(title)}</text>')
    # axes and grid
    out.append('<g class="y-axis" text-anchor="end">')
    for b, label in _byte_ticks(view.y_max):
        yy = y(b)
        out.append(f'<line class="grid" x1="{_f(L)}" x2="{_f(L + pw)}" y1="{yy}" y2="{yy}"/>'
                   f'<text x="{_f(L - 6)}" y="{yy}" dy="4">{xml_text(label)}</text>')
    out.append("</g>")
    out.append('<g class="x-axis" text-anchor="middle">')
    for x, label in _x_ticks(view, pw):
        out.append(f'<line class="axis" x1="{_f(L + x)}" x2="{_f(L + x)}" y1="{y(0)}" '
                   f'y2="{float(y(0)) + 4:.1f}"/><text x="{_f(L + x)}" y="{float(y(0)) + 16:.1f}"'
                   f'>{xml_text(label)}</text>')
    out.append("</g>")
    # the other allocations: between the stacked bands' top and the live-bytes curve
    right = L + pw
    if view.columns:
        curve = _curve_path(view.columns, L, right, y)
        top = view.stack_top
        lower = [f"V{y(top[-1][1])}"]
        for k in range(len(top) - 1, 0, -1):
            lower.append(f"H{_f(L + top[k][0])}V{y(top[k - 1][1])}")
        other = "".join(curve) + "".join(lower) + f"H{_f(L)}Z"
        tip = (f"{view.other_count:,} other allocations drawn together (smaller than "
               f"{format_bytes(view.min_band_bytes)}, or covering less area than the "
               f"{len(view.bands):,} drawn)")
        out.append(f'<path class="other" d="{other}" fill="{OTHER}"><title>{xml_text(tip)}'
                   f'</title></path>')
    # bands
    fills, legend = _colors(view, color)
    out.append('<g class="bands">')
    for band in view.bands:
        a = band.allocation
        al = src.allocation(a)
        d = _band_path([(L + x, o) for x, o in band.steps], L + band.end_x, al.size, y)
        out.append(f'<path class="band" d="{d}" fill="{fills[a]}" data-allocation="{a}" '
                   f'data-size="{al.size}" data-ptr="{al.ptr:#x}" '
                   f'data-x0="{_f(L + band.steps[0][0])}" data-x1="{_f(L + band.end_x)}" '
                   f'data-start-line="{src.lines[al.start]}" '
                   f'data-end-line="{src.lines[al.end] if al.end is not None else ""}">'
                   f'<title>{xml_text(_band_title(view, a))}</title></path>')
    out.append("</g>")
    # the live-bytes curve, the pool, failures, the peak
    if view.columns:
        out.append(f'<path class="live" d="{"".join(_curve_path(view.columns, L, right, y))}" '
                   f'fill="none" stroke="#222" stroke-width=".8"><title>live bytes</title></path>')
    if view.pool:
        pool_d = "".join(_curve_path(view.pool, L, right, y))
        out.append(f'<path class="pool" d="{pool_d}" fill="none" stroke="{POOL}" '
                   f'stroke-width="1.5" stroke-dasharray="5 3"><title>pool size (peak '
                   f'{format_bytes(s["peak_pool_size"])})</title></path>')
    if view.failures:
        out.append(f'<g class="failures" fill="{POOL}">')
        base = float(y(0))
        for i in view.failures:
            event, size, stream, thread = src.failures[i]
            x = L + src.xs[event]
            tip = (f"allocation of {size:,} bytes ({format_bytes(size)}) failed at "
                   f"{src.labels[event]}" + (f" (line {src.lines[event]})" if src.lines[event]
                                             else "")
                   + f", stream {stream:#x}, thread {thread}")
            out.append(f'<path class="failure" d="M{_f(x)} {base - 9:.1f}l-5 9h10z">'
                       f'<title>{xml_text(tip)}</title></path>')
        out.append("</g>")
    if view.peak_event is not None and s["peak_bytes"]:
        px = L + peak_x
        py = y(s["peak_bytes"])
        anchor = "end" if peak_x > pw * 0.6 else "start"
        dx = -6 if anchor == "end" else 6
        label = f"peak {format_bytes(s['peak_bytes'])} at {src.labels[view.peak_event]}"
        out.append(f'<g class="peak"><line x1="{_f(px)}" x2="{_f(px)}" y1="{_f(T)}" '
                   f'y2="{y(0)}" stroke="#000" stroke-dasharray="2 2"/>'
                   f'<circle cx="{_f(px)}" cy="{py}" r="3.5" fill="#000"/>'
                   f'<text x="{_f(px + dx)}" y="{_f(T + 12)}" text-anchor="{anchor}" '
                   f'font-weight="bold" stroke="#fff" stroke-width="3" paint-order="stroke">'
                   f'{xml_text(label)}</text></g>')
    out.append(f'<rect x="{_f(L)}" y="{_f(T)}" width="{_f(pw)}" height="{_f(ph)}" '
               f'fill="none" stroke="#888"/>')
    # legend and statistics
    ly = float(y(0)) + 34
    x = L
    items = [(c, label) for c, label in legend] + [(OTHER, "other allocations")]
    out.append(f'<g class="legend"><text x="{_f(x)}" y="{ly + 9:.1f}">'
               f'{"stream:" if color == "stream" else "size:"}</text>')
    x += 46
    for c, label in items:
        out.append(f'<rect x="{_f(x)}" y="{ly:.1f}" width="11" height="11" fill="{c}"/>'
                   f'<text x="{_f(x + 15)}" y="{ly + 9:.1f}">{xml_text(label)}</text>')
        x += 22 + 6.5 * len(label)
    out.append(f'<line x1="{_f(x)}" x2="{_f(x + 18)}" y1="{ly + 5:.1f}" y2="{ly + 5:.1f}" '
               f'stroke="#222"/><text x="{_f(x + 22)}" y="{ly + 9:.1f}">live bytes</text>')
    x += 90
    if view.pool:
        out.append(f'<line x1="{_f(x)}" x2="{_f(x + 18)}" y1="{ly + 5:.1f}" y2="{ly + 5:.1f}" '
                   f'stroke="{POOL}" stroke-width="1.5" stroke-dasharray="5 3"/>'
                   f'<text x="{_f(x + 22)}" y="{ly + 9:.1f}">pool size</text>')
    out.append("</g>")
    out.append('<g class="stats">')
    for i, line in enumerate(stats_lines(view)):
        out.append(f'<text x="{_f(L)}" y="{ly + 28 + 14 * i:.1f}">{xml_text(line)}</text>')
    out.append("</g></svg>")
    return "\n".join(out)
