"""One self-contained HTML page: every view's SVG inline, its statistics beside it, and a
few lines of inline script that switch between views (the page loads nothing else: its
Content-Security-Policy forbids any network access)."""
from __future__ import annotations

from typing import List, Sequence, Tuple
from ._model import View
from ._svg import Layout, format_bytes, render_svg, xml_text as escape

__all__ = ["render_html"]

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

_STYLE = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
p.about{margin:2px 0 10px;color:#555;font-size:13px;max-width:1100px}
.view{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:flex-start}
.view[hidden]{display:none}
table.stats{border-collapse:collapse;font-size:13px}
table.stats td,table.stats th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
table.stats td.n{text-align:right;font-variant-numeric:tabular-nums}
label.choose{font-size:13px;display:block;margin:0 0 8px}
p.note{font-size:12px;color:#666;max-width:1100px}
"""

_SCRIPT = """
(function () {
  var views = document.querySelectorAll('div.view');
  var select = document.getElementById('choose-view');
  function show(id) {
    for (var i = 0; i < views.length; i++) { views[i].hidden = views[i].id !== id; }
  }
  if (select) {
    select.addEventListener('change', function () {
      show(select.value);
      history.replaceState(null, '', '#' + select.value);
    });
    var wanted = location.hash.slice(1);
    if (document.getElementById(wanted) && wanted.indexOf('view-') === 0) {
      select.value = wanted;
      show(wanted);
    }
  }
  var bands = document.querySelectorAll('div.view:not([hidden]) path.band').length;
  document.documentElement.setAttribute('data-ready', String(views.length));
  document.documentElement.setAttribute('data-visible-bands', String(bands));
})();
"""


def _rows(view: View) -> List[Tuple[str, str]]:
    s = view.stats
    src = view.source
    rows = [("events", f"{s['events']:,}"),
            ("allocations", f"{s['total_count']:,}"),
            ("bytes allocated in total",
             f"{s['total_bytes']:,} ({format_bytes(s['total_bytes'])})"),
            ("frees", f"{s['frees']:,}"),
            ("failed allocations", f"{s['failures']:,}")]
    if "unmatched_frees" in s:
        rows.append(("frees without an allocation", f"{s['unmatched_frees']:,}"))
    rows += [("peak live bytes", f"{s['peak_bytes']:,} ({format_bytes(s['peak_bytes'])})"),
             ("most allocations live", f"{s['peak_count']:,}")]
    if view.peak_event is not None:
        at = src.labels[view.peak_event]
        if src.lines[view.peak_event]:
            at += f" (line {src.lines[view.peak_event]})"
        rows.append(("peak at", at))
    rows.append(("live at the end", f"{s['current_count']:,} allocations, "
                                    f"{s['current_bytes']:,} bytes"))
    if s.get("peak_pool_size") is not None:
        rows.append(("peak pool size", f"{s['peak_pool_size']:,} "
                                       f"({format_bytes(s['peak_pool_size'])})"))
        if s.get("fragmentation"):
            rows.append(("peak pool size / peak live bytes", f"{s['fragmentation']:.3f}"))
    return rows


def _note(view: View) -> str:
    text = (f"{len(view.bands):,} allocations are drawn as bands of their own (at least "
            f"{format_bytes(view.min_band_bytes)}; at most {view.max_bands:,}, those covering "
            f"the most area: size x time live); "
            f"{view.other_count:,} others are drawn together in grey. Each pixel column shows "
            f"the most bytes live at any moment within it, so the peak is exact.")
    for n in view.notes:
        text += f" Also: {n}."
    return text


def render_html(views: Sequence[View], layout: Layout, *, title: str, about: str,
                color: str) -> str:
    """The page for ``views`` (the first is shown; the others through the selector)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
           f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
           f"<h1>{escape(title)}</h1>", f'<p class="about">{escape(about)}</p>']
    if len(views) > 1:
        out.append('<label class="choose">Show <select id="choose-view">')
        for i, v in enumerate(views):
            out.append(f'<option value="view-{i}">{escape(v.name)} '
                       f'({v.stats["total_count"]:,} allocations, peak '
                       f'{escape(format_bytes(v.stats["peak_bytes"]))})</option>')
        out.append("</select></label>")
    for i, v in enumerate(views):
        hidden = " hidden" if i else ""
        out.append(f'<div class="view" id="view-{i}"{hidden}>')
        out.append(render_svg(v, layout, title=f"{title}: {v.name}" if len(views) > 1
                              else title, color=color, standalone=False))
        out.append('<table class="stats"><tbody>')
        for name, value in _rows(v):
            out.append(f'<tr><th>{escape(name)}</th><td class="n">{escape(value)}</td></tr>')
        out.append(f'</tbody></table><p class="note">{escape(_note(v))}</p></div>')
    out.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(x for x in out if x)
