"""``--report FILE.html``: one self-contained HTML page of a training plan.

Plain SVG written here (no plotting library, nothing fetched when the page opens): the step
time by cause as stacked bars (the plan, its alternatives, the compared recipe) with the
plan's band when the machine gives one; the peak memory by kind against the device's
capacity, and each pipeline stage's; the pipeline schedule as a timeline (stages by time,
forward and backward of every micro-batch and chunk, the sends between stages); the
alternatives as a table; every configuration the search priced as step time against memory,
with the Pareto front, the plan, the alternatives and the compared recipe marked.
"""

from __future__ import annotations

import html
import math

import numpy as np

from pase.core.checks import a_network, a_training_plan, arguments, optional, text
from pase.core.units import format_bytes
from pase.costing.training import FORWARD_SHARE

from .training import CAUSE_NAMES, _MEMORY_NAMES, difference, explain_difference, is_tie, mfu_text, step_band

__all__ = ["html_report", "schedule_ops", "pareto_front", "CAUSE_COLOURS", "MEMORY_COLOURS"]

#: Colours of the causes and memory kinds (Tableau 10: distinct, readable in print).
CAUSE_COLOURS = {"compute": "#4e79a7", "recompute": "#a0cbe8", "activation_comm": "#f28e2b",
                 "redistribution": "#ffbe7d", "p2p": "#59a14f", "bubble": "#bab0ac", "host": "#ff9da7", "weight_sync": "#e15759",
                 "optimizer": "#b07aa1"}
MEMORY_COLOURS = {"model_state": "#4e79a7", "activations": "#f28e2b", "logits": "#e15759",
                  "gathered_weights": "#76b7b2", "recompute_working_set": "#59a14f",
                  "fragmentation": "#d4a6c8", "unsharded_gradients": "#edc948", "activation_gradients": "#ff9d9a",
                  "comm_buffers": "#b07aa1", "tp_overlap_buffers": "#d37295", "reserve": "#bab0ac", "largest_stage": "#9c755f"}
_FORWARD = ("#4e79a7", "#76b7b2", "#59a14f", "#edc948", "#9c755f", "#a0cbe8", "#8cd17d", "#b6992d")
_BACKWARD = ("#f28e2b", "#e15759", "#ff9d9a", "#b07aa1", "#d37295", "#ffbe7d", "#fabfd2", "#d4a6c8")
_WIDTH = 1040
_FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif"


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _svg(width: float, height: float, body: list, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{_e(label)}">' + "".join(body) + "</svg>")


def _text(x, y, text, size=12, anchor="start", colour="#333", weight="normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{colour}" '
            f'font-weight="{weight}">{_e(text)}</text>')


def _rect(x, y, w, h, fill, title=None, stroke=None) -> str:
    extra = f' stroke="{stroke}" stroke-width="0.5"' if stroke else ""
    inner = f"<title>{_e(title)}</title>" if title else ""
    return f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(w, 0):.2f}" height="{h:.2f}" fill="{fill}"{extra}>{inner}</rect>'


def _nice_ticks(low: float, high: float, count: int = 6) -> list:
    """Round tick values covering ``[low, high]`` (steps of 1, 2 or 5 times a power of ten)."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    return [start + i * step for i in range(int(math.ceil((high - start) / step)) + 1)]


def _log_ticks(low: float, high: float) -> list:
    ticks = []
    for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if low <= v <= high:
                ticks.append(v)
    return ticks


def _seconds(v: float, seconds: bool) -> str:
    return f"{v:.4g} s" if seconds else f"{v:.4g}"


# -- step time by cause ---------------------------------------------------------------------


def _cause_bars(rows: list, seconds: bool, band) -> str:
    """Stacked horizontal bars, one per ``(label, candidate)``; the plan's band as a whisker."""
    left, right, bar, gap = 250, 50, 26, 14
    top = 34
    height = top + len(rows) * (bar + gap) + 40
    longest = max(c.summary.step_seconds for _, c in rows)
    if band is not None:
        longest = max(longest, band[1])
    scale = (_WIDTH - left - right) / longest
    body = []
    used = set()
    for i, (label, c) in enumerate(rows):
        y = top + i * (bar + gap)
        label, _, detail = label.partition("\n")
        if detail:
            body.append(_text(left - 10, y + bar / 2 - 2, label, 12, "end", "#222", "bold" if i == 0 else "normal"))
            body.append(_text(left - 10, y + bar / 2 + 11, _clip(detail, 44), 10, "end", "#777"))
        else:
            body.append(_text(left - 10, y + bar / 2 + 4, label, 12, "end", "#222", "bold" if i == 0 else "normal"))
        x = left
        for key, value in c.causes().items():
            if value <= 0:
                continue
            used.add(key)
            w = value * scale
            body.append(_rect(x, y, w, bar, CAUSE_COLOURS[key],
                              f"{CAUSE_NAMES[key]}: {_seconds(value, seconds)} "
                              f"({100 * value / c.summary.step_seconds:.1f} %)"))
            x += w
        body.append(_text(x + 6, y + bar / 2 + 4, _seconds(c.summary.step_seconds, seconds), 11, "start", "#444"))
        if i == 0 and band is not None:
            lo, hi = left + band[0] * scale, left + band[1] * scale
            mid = y + bar / 2
            body.append(f'<g class="band" stroke="#222" stroke-width="1.5"><line x1="{lo:.1f}" y1="{mid:.1f}" '
                        f'x2="{hi:.1f}" y2="{mid:.1f}"/><line x1="{lo:.1f}" y1="{mid - 7:.1f}" x2="{lo:.1f}" '
                        f'y2="{mid + 7:.1f}"/><line x1="{hi:.1f}" y1="{mid - 7:.1f}" x2="{hi:.1f}" '
                        f'y2="{mid + 7:.1f}"/><title>band {_seconds(band[0], seconds)} to '
                        f'{_seconds(band[1], seconds)}</title></g>')
    axis_y = top + len(rows) * (bar + gap) - gap / 2
    grid = [f'<line x1="{left}" y1="{axis_y:.1f}" x2="{_WIDTH - right}" y2="{axis_y:.1f}" stroke="#999"/>']
    for t in _nice_ticks(0, longest):
        if t > longest * 1.0001:
            break
        x = left + t * scale
        grid.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y:.1f}" stroke="#e6e6e6"/>')
        grid.append(_text(x, axis_y + 16, f"{t:g}", 11, "middle", "#666"))
    body = grid + body
    body.append(_text(_WIDTH - right, axis_y + 32, "step time (s)" if seconds else "step (flop-equivalents)", 11,
                      "end", "#666"))
    body.insert(0, _legend([(CAUSE_NAMES[k], CAUSE_COLOURS[k]) for k in CAUSE_NAMES if k in used], 20, 14))
    return _svg(_WIDTH, height, body, "step time by cause")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def _legend(items: list, x: float, y: float) -> str:
    """Coloured squares and names in a row (about 6 px a character at 11 px)."""
    out = []
    for name, colour in items:
        out.append(_rect(x, y - 9, 11, 11, colour))
        out.append(_text(x + 15, y, name, 11, "start", "#444"))
        x += 30 + 5.9 * len(name)
    return "".join(out)


# -- memory ---------------------------------------------------------------------------------


def _memory_bars(plan) -> str:
    """The peak by kind against the device's memory (and the cap), then each stage's total."""
    best = plan.best
    kinds = best.memory_kinds()
    capacity = plan.device_memory_bytes
    cap = plan.memory_cap
    pipe = best.summary.extra.get("pipeline")
    rows = [("peak per device" + (" (largest stage)" if pipe else ""), kinds)]
    if pipe:
        rows += [(f"stage {st['stage']} ({st['blocks']} blocks)", {"largest_stage": st["memory_bytes"]})
                 for st in pipe["stages"]]
    left, right, bar, gap, top = 250, 40, 24, 10, 34
    limit = max([best.summary.peak_memory_bytes] + [v for v in (capacity, cap) if v is not None])
    scale = (_WIDTH - left - right) / (limit * 1.04)
    body = []
    used = set()
    for i, (label, parts) in enumerate(rows):
        y = top + i * (bar + gap)
        body.append(_text(left - 10, y + bar / 2 + 4, label, 12, "end", "#222", "bold" if i == 0 else "normal"))
        x = left
        for key, value in parts.items():
            if value <= 0:
                continue
            if i == 0:
                used.add(key)
            w = value * scale
            body.append(_rect(x, y, w, bar, MEMORY_COLOURS[key] if i == 0 else "#9cb3d0",
                              f"{_MEMORY_NAMES[key]}: {format_bytes(value)}"))
            x += w
        body.append(_text(x + 6, y + bar / 2 + 4, format_bytes(sum(parts.values())), 11, "start", "#444"))
    bottom = top + len(rows) * (bar + gap)
    for value, name, colour, dash in ((capacity, "device", "#c0392b", ""), (cap, "cap", "#555", ' stroke-dasharray="5,4"')):
        if value is None or (name == "cap" and value == capacity):
            continue
        x = left + value * scale
        body.append(f'<line x1="{x:.1f}" y1="{top - 8}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{colour}" '
                    f'stroke-width="2"{dash}><title>{name} {format_bytes(value)}</title></line>')
        body.append(_text(x, bottom + 16, f"{name} {format_bytes(value)}", 11, "middle", colour, "bold"))
    margin = plan.margin_bytes
    if margin is not None:
        body.append(_text(_WIDTH - right, bottom + 34,
                          f"margin {format_bytes(margin)}" if margin >= 0 else f"over by {format_bytes(-margin)}",
                          12, "end", "#2e7d32" if margin >= 0 else "#c0392b", "bold"))
    body.insert(0, _legend([(_MEMORY_NAMES[k], MEMORY_COLOURS[k]) for k in MEMORY_COLOURS if k in used], 20, 14))
    return _svg(_WIDTH, bottom + 44, body, "memory by kind")


# -- the pipeline schedule -------------------------------------------------------------------


def schedule_ops(pp: int, m: int, vpp: int, forward: list, backward: list, send: float) -> list:
    """Every forward and backward pass of a pipeline: ``(stage, kind, micro-batch, chunk,
    start, end)``, ``kind`` ``"F"`` or ``"B"``.

    Each stage runs its passes in Megatron-LM's order: 1F1B (``vpp`` 1) warms up with ``pp - 1
    - s`` forward passes, then alternates one forward and one backward, then drains; the
    interleaved schedule warms up with ``2 (pp - 1 - s) + (vpp - 1) pp`` chunk passes and takes
    micro-batches in groups of ``pp`` chunk by chunk (``m`` a multiple of ``pp``). A pass starts
    when its stage is free and its input has arrived (``send`` seconds after the pass that
    produced it on another stage); ``forward[s]`` and ``backward[s]`` are a chunk's times on
    stage ``s``.
    """
    total = m * vpp

    def order(s: int) -> list:
        warm = min(total, (pp - 1 - s) if vpp == 1 else 2 * (pp - 1 - s) + (vpp - 1) * pp)
        seq = [("F", k) for k in range(warm)]
        f, b = warm, 0
        while f < total or b < total:
            if f < total:
                seq.append(("F", f))
                f += 1
            if b < total and (f >= total or b < f - warm + 0):
                seq.append(("B", b))
                b += 1
        return seq

    def unit(kind: str, k: int) -> tuple:  # virtual micro-batch k -> (micro-batch, chunk)
        group = k // (pp * vpp)
        chunk = (k // pp) % vpp
        if kind == "B":
            chunk = vpp - 1 - chunk
        return group * pp + k % pp, chunk

    orders = [order(s) for s in range(pp)]
    done: dict = {}
    free = [0.0] * pp
    at = [0] * pp
    ops = []
    while any(at[s] < len(orders[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            while at[s] < len(orders[s]):
                kind, k = orders[s][at[s]]
                mb, chunk = unit(kind, k)
                if kind == "F":
                    dep = (s - 1, "F", mb, chunk) if s > 0 else ((pp - 1, "F", mb, chunk - 1) if chunk > 0 else None)
                else:
                    dep = (s + 1, "B", mb, chunk) if s < pp - 1 else (
                        (0, "B", mb, chunk + 1) if chunk < vpp - 1 else (pp - 1, "F", mb, vpp - 1))
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (send if dep[0] != s else 0.0)
                start = max(free[s], ready)
                end = start + (forward[s] if kind == "F" else backward[s])
                done[(s, kind, mb, chunk)] = end
                free[s] = end
                ops.append((s, kind, mb, chunk, start, end))
                at[s] += 1
                progressed = True
        if not progressed:
            raise ValueError("the pipeline schedule deadlocks")  # not for the orders above
    return ops


def _timelines(plan, seconds: bool) -> str:
    """The plan's schedule, and the compared recipe's when it is pipelined."""
    out = _timeline(plan.best, seconds, "the plan")
    if plan.compare is not None and plan.compare.summary.extra.get("pipeline"):
        out += f'<h3>--compare {_e(plan.compare_recipe)}: <code>{_e(plan.compare.recipe())}</code></h3>'
        out += _timeline(plan.compare, seconds, "the compared recipe")
    return out


def _timeline(candidate, seconds: bool, who: str) -> str:
    pipe = candidate.summary.extra.get("pipeline")
    if not pipe:
        return (f'<p class="note">No pipeline in {who}: every device runs the whole network (pp = 1), so there is no '
                'schedule to draw.</p>')
    pp, m, vpp = pipe["pp"], pipe["microbatches"], pipe["vpp"]
    t = [st["microbatch_seconds"] for st in pipe["stages"]]
    send = pipe["p2p_seconds_per_microbatch"] / max(vpp, 1) / 2.0
    work = [x - pipe["p2p_seconds_per_microbatch"] for x in t]
    forward = [FORWARD_SHARE * w / vpp for w in work]
    backward = [(1.0 - FORWARD_SHARE) * w / vpp for w in work]
    ops = schedule_ops(pp, m, vpp, forward, backward, send)
    end = max(op[5] for op in ops)
    charts = [_timeline_svg(ops, pp, vpp, 0.0, end, send, "the whole step", seconds, labels=m <= 16)]
    if m > 2 * pp:
        # Zoom on the warm-up: until the first stage has run 2 pp micro-batches forward and back.
        window = max(op[5] for op in ops if op[2] < 2 * pp and op[0] == 0)
        charts.append(_timeline_svg(ops, pp, vpp, 0.0, window, send,
                                    f"the first {2 * pp} micro-batches (warm-up)", seconds, labels=True))
    key = "".join(
        f'<span class="swatch" style="background:{_FORWARD[c % len(_FORWARD)]}"></span>forward chunk {c + 1} '
        f'<span class="swatch" style="background:{_BACKWARD[c % len(_BACKWARD)]}"></span>backward chunk {c + 1} &nbsp; '
        for c in range(vpp)) if vpp > 1 else (
        f'<span class="swatch" style="background:{_FORWARD[0]}"></span>forward &nbsp;'
        f'<span class="swatch" style="background:{_BACKWARD[0]}"></span>backward &nbsp;')
    note = (f'<p class="note">{pp} stages, {pipe["schedule"]}{f" with {vpp} chunks per device" if vpp > 1 else ""}, '
            f'{m} micro-batches; each stage at its own time per micro-batch (forward one third, backward two '
            f'thirds), sends {_seconds(send, seconds)} each way (grey lines). Drawn schedule: '
            f'{_seconds(end, seconds)}; the model\'s step adds the exposed weight synchronisation and optimizer. '
            f'Bubble {100 * pipe["bubble_fraction"]:.1f} %.</p>')
    return f'<div class="key">{key}</div>' + "".join(charts) + note


def _timeline_svg(ops, pp, vpp, t0, t1, send, title, seconds, labels) -> str:
    left, right, lane, top = 90, 20, 30, 26
    scale = (_WIDTH - left - right) / (t1 - t0)
    body = [_text(left, 16, title, 12, "start", "#222", "bold")]
    shown = [op for op in ops if op[4] < t1]
    where = {}
    for s, kind, mb, chunk, start, end in shown:
        y = top + s * lane
        x = left + (start - t0) * scale
        w = (min(end, t1) - start) * scale
        colour = (_FORWARD if kind == "F" else _BACKWARD)[chunk % len(_FORWARD)]
        body.append(_rect(x, y + 2, w, lane - 6, colour,
                          f"stage {s}: {'forward' if kind == 'F' else 'backward'} of micro-batch {mb + 1}"
                          + (f", chunk {chunk + 1}" if vpp > 1 else "")
                          + f", {_seconds(start, seconds)} to {_seconds(end, seconds)}", "#fff"))
        if labels and w > 14:
            body.append(_text(x + w / 2, y + lane / 2 + 3, mb + 1, 9, "middle", "#fff"))
        where[(s, kind, mb, chunk)] = (start, end)
    if labels:  # the sends between stages
        for s, kind, mb, chunk, start, end in shown:
            target = (s + 1, "F", mb, chunk) if kind == "F" else (s - 1, "B", mb, chunk)
            if target in where and 0 <= target[0] < pp:
                x1, x2 = left + (end - t0) * scale, left + (where[target][0] - t0) * scale
                y1 = top + s * lane + (lane - 4 if kind == "F" else 2)
                y2 = top + target[0] * lane + (2 if kind == "F" else lane - 4)
                body.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#888" '
                            'stroke-width="0.8"/>')
    for s in range(pp):
        body.append(_text(left - 8, top + s * lane + lane / 2 + 3, f"stage {s}", 11, "end", "#444"))
    axis = top + pp * lane + 2
    body.append(f'<line x1="{left}" y1="{axis}" x2="{_WIDTH - right}" y2="{axis}" stroke="#999"/>')
    for tick in _nice_ticks(t0, t1):
        if tick > t1:
            break
        x = left + (tick - t0) * scale
        body.append(_text(x, axis + 14, f"{tick:g}", 10, "middle", "#666"))
    body.append(_text(_WIDTH - right, axis + 28, "time (s)" if seconds else "time", 10, "end", "#666"))
    return _svg(_WIDTH, axis + 34, body, f"pipeline schedule: {title}")


# -- every configuration priced ----------------------------------------------------------------


def pareto_front(step: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both step and memory (ties kept once),
    by increasing memory.

    >>> pareto_front(np.array([3.0, 1.0, 2.0, 2.5]), np.array([1.0, 3.0, 2.0, 2.5])).tolist()
    [0, 2, 1]
    """
    order = np.lexsort((step, memory))
    best_so_far = np.minimum.accumulate(step[order])
    keep = np.concatenate([[True], step[order][1:] < best_so_far[:-1]])
    return order[keep]


def _scatter(plan, seconds: bool) -> str:
    """Every configuration priced (log axes), then the ones near the plan (linear axes)."""
    priced = plan.priced
    if not priced:
        return '<p class="note">No mesh configuration was priced.</p>'
    step = np.array([p.step_seconds for p in priced])
    memory = np.array([p.peak_memory_bytes for p in priced])
    ok = np.isfinite(step) & np.isfinite(memory) & (step > 0) & (memory > 0)
    step, memory = step[ok], memory[ok]
    marks = [(plan.best, "the plan", "#d62728", "star")]
    marks += [(c, f"alternative {i + 1}", "#1f77b4", "ring") for i, c in enumerate(plan.alternatives[1:], 1)]
    if plan.compare is not None:
        marks.append((plan.compare, f"--compare {plan.compare_recipe}", "#2ca02c", "diamond"))
    limit = plan.memory_cap if plan.memory_cap is not None else plan.device_memory_bytes
    xs = np.concatenate([memory, [c.summary.peak_memory_bytes for c, *_ in marks]])
    ys = np.concatenate([step, [c.summary.step_seconds for c, *_ in marks]])
    whole = _scatter_svg(step, memory, marks, limit, seconds, (xs.min() / 1.15, xs.max() * 1.15),
                         (ys.min() / 1.15, ys.max() * 1.15), True, "all configurations (log scales)")
    ref = plan.best.summary.step_seconds
    top = max([ref * 1.3] + [c.summary.step_seconds * 1.05 for c, *_ in marks if c is not plan.best])
    near = step <= top
    right = max([limit * 1.08 if limit is not None else 0.0]
                + [c.summary.peak_memory_bytes * 1.05 for c, *_ in marks])
    near &= memory <= right
    lowest = min(list(memory[near]) + [c.summary.peak_memory_bytes for c, *_ in marks])
    zoom = _scatter_svg(step[near], memory[near], marks, limit, seconds, (lowest * 0.95, right),
                        (ref * 0.97, top), False, f"near the plan: steps up to {top / ref:.2f}x the plan's")
    return whole + zoom


def _scatter_svg(step, memory, marks, limit, seconds, xr, yr, log: bool, title: str) -> str:
    left, right, top, bottom = 80, 24, 44, 50
    height = 440
    tr = np.log10 if log else (lambda v: np.asarray(v, dtype=float))
    x0, x1 = float(tr(xr[0])), float(tr(xr[1]))
    y0, y1 = float(tr(yr[0])), float(tr(yr[1]))
    w, h = _WIDTH - left - right, height - top - bottom

    def px(v):
        return left + (tr(v) - x0) / (x1 - x0) * w

    def py(v):
        return top + h - (tr(v) - y0) / (y1 - y0) * h

    body = [_text(left, 14, title, 12, "start", "#222", "bold"), _rect(left, top, w, h, "#fcfcfc", stroke="#ddd")]
    xticks = _log_ticks(*xr) if log else _nice_ticks(*xr)
    yticks = _log_ticks(*yr) if log else _nice_ticks(*yr)
    for tick in xticks:
        if xr[0] <= tick <= xr[1]:
            x = px(tick)
            body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="#eee"/>')
            body.append(_text(x, top + h + 15, format_bytes(tick), 10, "middle", "#666"))
    for tick in yticks:
        if yr[0] <= tick <= yr[1]:
            y = py(tick)
            body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#eee"/>')
            body.append(_text(left - 6, y + 3, f"{tick:g}", 10, "end", "#666"))
    scale = " (log)" if log else ""
    body.append(_text(left + w / 2, height - 12, f"peak memory per device{scale}", 11, "middle", "#444"))
    body.append(f'<text transform="translate(16 {top + h / 2:.0f}) rotate(-90)" font-size="11" text-anchor="middle" '
                f'fill="#444">{"step time, s" if seconds else "step"}{scale}</text>')
    fits = memory <= limit if limit is not None else np.ones(len(memory), dtype=bool)
    # One dot per pixel and class: thousands of configurations stay a light page.
    for cls, colour, name in ((~fits, "#e8a3a3", "does not fit"), (fits, "#9db4cf", "fits")):
        if not cls.any():
            continue
        pts = np.unique(np.round(np.stack([px(memory[cls]), py(step[cls])], axis=1)), axis=0)
        dots = "".join(f'<circle cx="{x:.0f}" cy="{y:.0f}" r="2.4"/>' for x, y in pts)
        body.append(f'<g class="priced" fill="{colour}" fill-opacity="0.75"><title>{name}</title>{dots}</g>')
    if len(step):
        front = pareto_front(step, memory)
        path = " ".join(f"{px(memory[i]):.1f},{py(step[i]):.1f}" for i in front)
        body.append(f'<polyline points="{path}" fill="none" stroke="#444" stroke-width="1.5" stroke-dasharray="4,3">'
                    '<title>Pareto front: no configuration is both faster and smaller</title></polyline>')
    if limit is not None and xr[0] <= limit <= xr[1]:
        x = px(limit)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="#c0392b" stroke-width="2">'
                    f'<title>memory limit {format_bytes(limit)}</title></line>')
        body.append(_text(x - 4, top + 12, f"limit {format_bytes(limit)}", 11, "end", "#c0392b", "bold"))
    for c, name, colour, shape in reversed(marks):
        x, y = float(px(c.summary.peak_memory_bytes)), float(py(c.summary.step_seconds))
        title = (f"<title>{_e(name)}: {_e(c.recipe())}, {_e(_seconds(c.summary.step_seconds, seconds))}, "
                 f"{_e(format_bytes(c.summary.peak_memory_bytes))}</title>")
        if shape == "star":
            pts = " ".join(f"{x + r * math.sin(a):.1f},{y - r * math.cos(a):.1f}"
                           for k in range(10) for a, r in [(k * math.pi / 5, 10 if k % 2 == 0 else 4.5)])
            body.append(f'<polygon class="mark" points="{pts}" fill="{colour}" stroke="#fff">{title}</polygon>')
        elif shape == "diamond":
            body.append(f'<polygon class="mark" points="{x:.1f},{y - 8:.1f} {x + 8:.1f},{y:.1f} {x:.1f},{y + 8:.1f} '
                        f'{x - 8:.1f},{y:.1f}" fill="{colour}" stroke="#fff">{title}</polygon>')
        else:
            body.append(f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="6" fill="none" stroke="{colour}" '
                        f'stroke-width="2">{title}</circle>')
    legend = [("fits", "#9db4cf"), ("does not fit", "#e8a3a3"), ("the plan", "#d62728"),
              ("alternatives (--top)", "#1f77b4"), ("Pareto front (dashed)", "#444")]
    if any(shape == "diamond" for *_, shape in marks):
        legend.append(("--compare", "#2ca02c"))
    body.append(_legend(legend, left, 32))
    return _svg(_WIDTH, height, body, f"step time against memory: {title}")


# -- the page -------------------------------------------------------------------------------


def _alternatives_table(plan, seconds: bool) -> str:
    best = plan.best
    rows = [("", c) for c in plan.alternatives]
    if plan.compare is not None:
        rows.append(("compare", plan.compare))
    if not rows:
        return ""
    head = ("<tr><th>#</th><th>recipe</th><th>step</th><th>vs plan</th><th>peak memory</th>"
            "<th>how it differs, and why slower</th></tr>")
    body = []
    for i, (tag, c) in enumerate(rows):
        s = c.summary
        rank = tag or str(i + 1)
        if c is best or (tag == "" and i == 0):
            why = "the plan"
        else:
            slower = [(k, v) for k, v in explain_difference(best, c) if v > 0][:2]
            why = difference(best, c) + (": " + ", ".join(f"{CAUSE_NAMES[k]} +{v:.3g}" for k, v in slower)
                                         if slower else "")
        tie = tag == "" and i > 0 and is_tie(best, c)
        ratio = s.step_seconds / best.summary.step_seconds
        body.append(f'<tr class="{"plan" if i == 0 and not tag else tag}"><td>{_e(rank)}{" =" if tie else ""}</td>'
                    f"<td><code>{_e(c.recipe()).replace(',', ',<wbr>')}</code></td><td>{_e(_seconds(s.step_seconds, seconds))}</td>"
                    f"<td>{ratio:.3f}x</td><td>{_e(format_bytes(s.peak_memory_bytes))}</td><td>{_e(why)}</td></tr>")
    return f'<table class="alts"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


_CSS = f"""
body{{{_FONT};margin:0;background:#f4f5f7;color:#222}}
main{{max-width:1100px;margin:0 auto;padding:24px}}
h1{{font-size:22px;margin:0 0 4px}} h2{{font-size:16px;margin:0 0 10px;color:#333}}
.sub{{color:#555;margin:0 0 18px}} code{{font-size:12px;background:#f0f2f5;padding:1px 4px;border-radius:3px}}
section{{background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:16px 20px;margin:0 0 18px}}
.cards{{display:flex;gap:12px;flex-wrap:wrap;margin:0 0 18px}}
.card{{flex:1;min-width:150px;background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:12px 14px}}
.card b{{display:block;font-size:20px;margin-top:4px}} .card span{{color:#666;font-size:12px}}
.note{{color:#555;font-size:12px;margin:6px 0 0}} .key{{font-size:12px;color:#444;margin:0 0 6px}}
.swatch{{display:inline-block;width:11px;height:11px;margin:0 4px -1px 0;border-radius:2px}}
table.alts{{border-collapse:collapse;width:100%;font-size:12.5px;table-layout:fixed}}
.alts th:nth-child(1){{width:64px}} .alts th:nth-child(2){{width:36%}} .alts th:nth-child(3),.alts th:nth-child(4){{width:62px}}
.alts th:nth-child(5){{width:86px}}
.alts th,.alts td{{text-align:left;padding:5px 8px;border-bottom:1px solid #eee;vertical-align:top}}
.alts th{{cursor:pointer;background:#fafbfc;user-select:none}} .alts tr.plan td{{background:#fff4f4;font-weight:600}}
.alts tr.compare td{{background:#f2faf2}} svg.chart{{display:block;max-width:100%;height:auto}}
.warn{{color:#c0392b;font-weight:600}} h3{{font-size:13px;margin:18px 0 6px;color:#333}} footer{{color:#777;font-size:12px}}
"""

# Sorting the alternatives table by a column (click its heading): the page's only script.
_JS = """
document.querySelectorAll('table.alts th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var num = function (r) { var v = parseFloat(r.cells[col].textContent); return isNaN(v) ? null : v; };
    var up = th.dataset.up !== '1'; th.dataset.up = up ? '1' : '0';
    rows.sort(function (a, b) {
      var x = num(a), y = num(b);
      var c = (x !== null && y !== null) ? x - y : a.cells[col].textContent.localeCompare(b.cells[col].textContent);
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""


@arguments(plan=a_training_plan, network=optional(a_network), model_name=text)
def html_report(plan, network=None, model=None, model_name: str = "sequence length") -> str:
    """The page of a training plan (``plan_training``'s result, with ``keep_priced`` for the
    scatter and ``alternatives`` for the table); one string, everything inline. ``model``
    and ``model_name`` only label the title (``sequence length 8192``); ``network`` is
    unused beside ``plan.network`` and kept for the signature of ``format_training``."""
    best = plan.best
    if best is None:
        raise ValueError("nothing fits: there is no plan to report")
    seconds = plan.machine.cost_unit == "seconds"
    s = best.summary
    size = f", {model_name} {model}" if model is not None else ""
    title = f"{plan.network_name} on {plan.procs} devices of {plan.machine.name}, batch {plan.batch}{size}"
    band = step_band(best)
    limit = plan.memory_cap if plan.memory_cap is not None else plan.device_memory_bytes
    cards = [("step time", _seconds(s.step_seconds, seconds)
              + (f" ({band[0]:.3g} to {band[1]:.3g})" if band is not None else ""))]
    if seconds and s.tokens_per_second_per_device is not None:
        cards += [("tokens/s per device", f"{s.tokens_per_second_per_device:,.0f}"),
                  ("MFU", mfu_text(best, plan.machine).removeprefix("MFU "))]
    cards.append(("peak memory per device", format_bytes(s.peak_memory_bytes)
                  + (f" of {format_bytes(limit)}" if limit is not None else "")))
    if plan.margin_bytes is not None:
        cards.append(("margin", format_bytes(plan.margin_bytes)))
    card_html = "".join(f'<div class="card"><span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cards)
    bar_rows = [("the plan", best)] + [(f"alternative {i + 1}\n{difference(best, c)}", c)
                                       for i, c in enumerate(plan.alternatives[1:6], 1)]
    if plan.compare is not None:
        bar_rows.append((f"--compare\n{plan.compare_recipe}", plan.compare))
    where = f"mesh {best.mesh.label()}" if best.mesh is not None else "per-layer splits (not a mesh)"
    warn = (f'<p class="warn">The plan needs more than the device\'s {_e(format_bytes(plan.device_memory_bytes))}.</p>'
            if plan.exceeds_device else "")
    sections = [
        ("Step time by cause", _cause_bars(bar_rows, seconds, band)
         + '<p class="note">A pipelined plan\'s bar is its slowest stage\'s work over all micro-batches, the bubble, '
           'then the exposed weight synchronisation and optimizer step. Hover a segment for its value.</p>'),
        ("Memory per device", _memory_bars(plan)),
        ("Pipeline schedule", _timelines(plan, seconds)),
        (f"Alternatives: the {len(plan.alternatives)} fastest distinct configurations that fit",
         _alternatives_table(plan, seconds)
         + f'<p class="note">Click a heading to sort. "=" marks a tie with the plan '
         f'{"within its band" if band is not None else "to the four figures shown"}.</p>'),
        (f"Every configuration priced ({len(plan.priced):,}): step time against memory", _scatter(plan, seconds)
         + '<p class="note">Dashed line: the Pareto front (nothing both faster and smaller). Configurations right of '
           'the limit do not fit.</p>'),
    ]
    parts = "".join(f"<section><h2>{_e(h)}</h2>{body}</section>" for h, body in sections)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>PaSE plan: {_e(title)}</title>"
        f"<style>{_CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1><p class=\"sub\">plan <code>{_e(best.recipe())}</code> [{_e(where)}]</p>{warn}"
        f"<div class=\"cards\">{card_html}</div>{parts}"
        f"<footer>PaSE training plan. Search: {plan.mesh_search.evaluated:,} configurations in "
        f"{plan.seconds:.2f} s; {_e(plan.optimal_over)}. Cost model: docs/training.md.</footer>"
        f"</main><script>{_JS}</script></body></html>\n"
    )
