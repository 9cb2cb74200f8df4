"""What a timeline shows, computed from events: live bytes per pixel column, the bands of the
allocations drawn one by one, the statistics and the peak.  Rendering is ``_svg`` / ``_html``.

Everything is laid out on the plot's pixel grid so that what cannot be seen is merged:

* the live-bytes curve keeps, for every pixel column, the most bytes live at any moment in it
  (so the peak is never lost), and the level at its end;
* an allocation gets a band of its own when it is at least ``min_band_px`` pixels tall and among
  the ``max_bands`` that cover the most area (size x time live, at least one pixel wide); the
  rest are drawn together as one "other allocations" area (the live-bytes curve above the
  stacked bands);
* a band's lower edge moves down when a band below it is freed; several moves in one pixel
  column are drawn as one, and if the bands need more than ``max_points`` corners together,
  the number of bands is halved until they fit.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["Source", "Band", "View", "build_view", "Allocation"]


@dataclass
class Allocation:
    """One allocation of the source: where it starts and ends (event numbers; ``end`` is None
    while it is live at the end)."""

    ptr: int
    size: int
    stream: int
    thread: int
    start: int
    end: Optional[int] = None
    stack: Optional[str] = None


@dataclass
class Source:
    """Events laid out on the time axis, allocations paired with their frees.

    ``xs[i]`` is event ``i``'s position in pixels from the plot's left edge; ``labels[i]`` its
    time as the log wrote it; ``lines[i]`` its line in the log (0 where there is none);
    ``deltas`` the allocations and frees in order, as ``(event, allocation number, +1/-1)``;
    ``failures`` the failed allocations as ``(event, size, stream, thread)``.
    """

    kind: str                                   # "log", "recording" or "tracking"
    axis: str                                   # "time" or "event"
    width: float
    xs: List[float]
    seconds: List[float]
    labels: List[str]
    lines: List[int]
    a_ptr: List[int]                            # the allocations, one list per field
    a_size: List[int]
    a_stream: List[int]
    a_thread: List[int]
    a_start: List[int]
    a_end: List[int]                            # -1: still live at the end
    a_stack: Optional[List[Optional[str]]]
    deltas: List[Tuple[int, int, int]]
    failures: List[Tuple[int, int, int, int]]
    unmatched_frees: int = 0
    pool_sizes: Optional[List[int]] = None      # the pool's size after each event
    description: str = ""

    def allocation(self, a: int) -> Allocation:
        """Allocation number ``a``."""
        end = self.a_end[a]
        return Allocation(self.a_ptr[a], self.a_size[a], self.a_stream[a], self.a_thread[a],
                          self.a_start[a], None if end < 0 else end,
                          self.a_stack[a] if self.a_stack is not None else None)


@dataclass
class Band:
    """One allocation drawn on its own: ``steps`` are ``(x, bytes below it)`` from its start;
    ``end_x`` is where it ends (the right edge while it is still live)."""

    allocation: int
    steps: List[Tuple[float, int]]
    end_x: float


@dataclass
class View:
    """One picture: everything the renderers draw."""

    name: str
    source: Source
    allocations: List[int]                      # the allocation numbers in this view
    columns: List[Tuple[int, int, int]]         # (column, most bytes live in it, bytes at its end)
    stack_top: List[Tuple[float, int]]          # top of the stacked bands: (x, bytes)
    bands: List[Band]
    pool: List[Tuple[int, int, int]]            # (column, largest pool size in it, at its end)
    failures: List[int]                         # indexes into source.failures
    stats: Dict[str, Any]
    peak_event: Optional[int]
    min_band_bytes: int
    max_bands: int
    points: int
    other_count: int
    y_max: int
    notes: List[str] = field(default_factory=list)


def _columns(width: float, xs: Sequence[float], events: Sequence[int],
             levels: Sequence[int]) -> List[Tuple[int, int, int]]:
    """``(column, max, end)`` for each pixel column an event falls in; the level carried into
    a column counts towards its maximum.  ``events`` are in order, so their x grow."""
    last = int(width) - 1
    ex = [xs[e] for e in events]
    out: List[Tuple[int, int, int]] = []
    carried = 0
    lo, n = 0, len(ex)
    while lo < n:
        c = min(int(ex[lo]), last)
        hi = n if c == last else bisect.bisect_left(ex, c + 1, lo)
        chunk = levels[lo:hi]
        top = max(chunk)
        out.append((c, carried if carried > top else top, chunk[-1]))
        carried = chunk[-1]
        lo = hi
    return out


def _stack(source: Source, chosen: Sequence[int],
           max_points: int) -> Optional[Tuple[List[Band], List[Tuple[float, int]], int]]:
    """Stack the chosen allocations in allocation order.  None when the bands would need
    more than ``max_points`` corners.  Only the chosen allocations' own events are visited."""
    sizes, starts, ends = source.a_size, source.a_start, source.a_end
    xs = source.xs
    right = source.width
    order = [(starts[a], a, 1) for a in chosen]
    order += [(ends[a], a, -1) for a in chosen if ends[a] >= 0]
    order.sort()
    bands: List[Band] = []
    slot_of: Dict[int, int] = {}
    live: List[int] = []                        # band slots, bottom to top
    below: List[int] = []                       # bytes below each live band
    top = 0
    top_steps: List[Tuple[float, int]] = [(0.0, 0)]
    points = 0
    for event, a, sign in order:
        x = xs[event]
        size = sizes[a]
        if sign > 0:
            slot = len(bands)
            slot_of[a] = slot
            bands.append(Band(a, [(x, top)], right))
            live.append(slot)
            below.append(top)
            top += size
            points += 2
        else:
            slot = slot_of.pop(a)
            i = live.index(slot)
            bands[slot].end_x = x
            column = int(x)
            for j in range(i + 1, len(live)):
                below[j] -= size
                steps = bands[live[j]].steps
                if int(steps[-1][0]) == column:
                    steps[-1] = (steps[-1][0], below[j])
                else:
                    steps.append((x, below[j]))
                    points += 2
            del live[i]
            del below[i]
            top -= size
            if points > max_points:
                return None
        if int(top_steps[-1][0]) == int(x):
            top_steps[-1] = (top_steps[-1][0], top)
        else:
            top_steps.append((x, top))
    return bands, top_steps, points


def build_view(source: Source, name: str, selected: Optional[List[bool]] = None,
               keep_failure: Optional[Callable[[int, int], bool]] = None, *,
               height: float, max_bands: int, max_points: int, min_band_px: float,
               with_pool: bool) -> View:
    """The picture of the allocations ``selected`` marks (all by default)."""
    sizes = source.a_size
    if selected is None:
        members = list(range(len(sizes)))
        order = source.deltas
    else:
        members = [i for i, s in enumerate(selected) if s]
        order = [d for d in source.deltas if selected[d[1]]]
    # live bytes after each of the view's events, and the statistics as StatisticsResource
    # and scripts/replay_log.py count them
    events = [d[0] for d in order]
    signs = [d[2] for d in order]
    levels = list(itertools.accumulate([sizes[d[1]] * d[2] for d in order]))
    counts = list(itertools.accumulate(signs))
    peak = max(levels, default=0)
    peak_event = events[levels.index(peak)] if levels else None
    cur = levels[-1] if levels else 0
    ncur = counts[-1] if counts else 0
    npeak = max(counts, default=0)
    frees = signs.count(-1)
    ntotal = len(signs) - frees
    total = sum(sizes[a] for a in members)
    columns = _columns(source.width, source.xs, events, levels)
    pool: List[Tuple[int, int, int]] = []
    peak_pool = None
    if with_pool and source.pool_sizes:
        pool_sizes = source.pool_sizes
        pool = _columns(source.width, source.xs, range(len(pool_sizes)), pool_sizes)
        peak_pool = max(pool_sizes)
    y_max = max(peak, peak_pool or 0, 1) * 108 // 100 + 1    # room for the peak's label
    min_band_bytes = max(1, int(y_max * min_band_px / max(height, 1.0)) + 1)
    # the allocations that cover the most of the picture: size x width (at least a pixel)
    xs, ends, starts, right = source.xs, source.a_end, source.a_start, source.width
    area = {a: sizes[a] * max(1.0, (xs[ends[a]] if ends[a] >= 0 else right) - xs[starts[a]])
            for a in members if sizes[a] >= min_band_bytes}
    candidates = sorted(area, key=area.__getitem__, reverse=True)   # stable: earlier first
    limit = min(max_bands, len(candidates))
    notes: List[str] = []
    while True:
        stacked = _stack(source, candidates[:limit], max_points)
        if stacked is not None:
            break
        limit //= 2
        notes.append(f"{2 * limit} bands need more than {max_points} corners; drawing "
                     f"{limit}")
    bands, top_steps, points = stacked
    failures = [i for i, (_event, _size, stream, thread) in enumerate(source.failures)
                if keep_failure is None or keep_failure(stream, thread)]
    stats: Dict[str, Any] = {
        "events": len(order) + len(failures), "allocations": ntotal, "frees": frees,
        "failures": len(failures), "current_bytes": cur, "current_count": ncur,
        "peak_bytes": peak, "peak_count": npeak, "total_bytes": total, "total_count": ntotal,
        "live_at_end": ncur, "peak_pool_size": peak_pool,
        "fragmentation": (peak_pool / peak) if peak_pool is not None and peak else None,
    }
    if selected is None:
        stats["events"] = len(source.xs)
        stats["unmatched_frees"] = source.unmatched_frees
    return View(name, source, members, columns, top_steps, bands, pool, failures, stats,
                peak_event, min_band_bytes, max_bands, points, len(members) - len(bands),
                y_max, notes)
