"""``--sweep ... --report FILE.html``: one self-contained HTML page of a training sweep.

Plain SVG, as the single plan's report (``pase.outputs.report``, whose page style it shares):
tokens/s per device, step time and memory per device against the device count (a log scale),
each count's plan with its band where the machine gives one, ideal scaling drawn for
comparison and the counts that train within ``--days`` marked; then every count's plan in a
table. Nothing is fetched when the page opens.
"""

from __future__ import annotations

import math

from pase.core.units import format_bytes
from pase.planning.training_sweep import TrainingSweep, scaling_efficiency

from .report import _CSS, _WIDTH, _e, _legend, _log_ticks, _nice_ticks, _svg, _text
from .training import bands
from .training_sweep import (
    SECONDS_PER_DAY, TrainingBudget, _amount, refusal_text, time_to_train, within_days,
)

__all__ = ["sweep_html", "count_points"]

_PLAN, _IDEAL, _CHOSEN, _LIMIT = "#4e79a7", "#9c9c9c", "#d62728", "#c0392b"


def count_points(sweep: TrainingSweep, budget: TrainingBudget | None = None) -> list:
    """Per planned count, what the charts draw: ``(devices, step, step band, tokens/s per
    device, peak memory, memory band, within the budget's days, recipe)`` (bands ``None``
    without an engine's spread)."""
    points = []
    for entry in sweep.planned:
        best = entry.best
        s = best.summary
        step_band, memory_band = bands(best, sweep.machine.cost_unit == "seconds")
        tps = s.tokens_per_second_per_device
        fields = time_to_train(tps, entry.devices, budget) if budget is not None and tps else None
        points.append((entry.devices, s.step_seconds, step_band, tps, s.peak_memory_bytes, memory_band,
                       bool(within_days(fields, budget)), best.recipe()))
    return points


def _chart(points: list, value, band, title: str, y_label: str, shown, log_y: bool, ideal=None, limit=None) -> str:
    """One quantity against the device count (log scale, a tick at each count): the plans'
    line, their bands as whiskers, ``ideal`` (a value per count) dashed, ``limit`` a red line;
    a star on the counts within the deadline, a dot on the others."""
    left, right, top, bottom, height = 90, 30, 50, 54, 384
    w, h = _WIDTH - left - right, height - top - bottom
    counts = [p[0] for p in points]
    ys = [value(p) for p in points] + [b for p in points if band(p) is not None for b in band(p)]
    ys += [] if ideal is None else [ideal(p) for p in points]
    ys += [] if limit is None else [limit]
    low, high = min(ys), max(ys)
    if log_y:
        low, high = low / 1.25, high * 1.25
    else:
        low, high = 0.0, high * 1.12
    x0, x1 = math.log2(min(counts)) - 0.4, math.log2(max(counts)) + 0.4
    tr = math.log10 if log_y else float
    y0, y1 = tr(low), tr(high) if high > low else tr(low) + 1.0

    def px(n):
        return left + (math.log2(n) - x0) / (x1 - x0) * w

    def py(v):
        return top + h - (tr(v) - y0) / (y1 - y0) * h

    body = [_text(left, 16, title, 13, "start", "#222", "bold"),
            f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fcfcfc" stroke="#ddd"/>']
    for tick in (_log_ticks(low, high) if log_y else _nice_ticks(low, high)):
        if low <= tick <= high:
            y = py(tick)
            body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#eee"/>')
            body.append(_text(left - 6, y + 3, shown(tick), 10, "end", "#666"))
    for n in counts:
        body.append(f'<line x1="{px(n):.1f}" y1="{top}" x2="{px(n):.1f}" y2="{top + h}" stroke="#eee"/>')
        body.append(_text(px(n), top + h + 16, f"{n:,}", 11, "middle", "#444"))
    body.append(_text(left + w / 2, height - 10, "devices (log scale)", 11, "middle", "#444"))
    body.append(f'<text transform="translate(18 {top + h / 2:.0f}) rotate(-90)" font-size="11" text-anchor="middle" '
                f'fill="#444">{_e(y_label)}</text>')
    if limit is not None:
        y = py(limit)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="{_LIMIT}" stroke-width="2">'
                    f'<title>device memory {_e(format_bytes(limit))}</title></line>')
        body.append(_text(left + w - 4, y - 5, f"limit {format_bytes(limit)}", 11, "end", _LIMIT, "bold"))
    if ideal is not None and len(points) > 1:
        path = " ".join(f"{px(p[0]):.1f},{py(ideal(p)):.1f}" for p in points)
        body.append(f'<polyline class="ideal" points="{path}" fill="none" stroke="{_IDEAL}" stroke-width="1.5" '
                    'stroke-dasharray="5,4"><title>ideal scaling from the first count</title></polyline>')
    path = " ".join(f"{px(p[0]):.1f},{py(value(p)):.1f}" for p in points)
    body.append(f'<polyline points="{path}" fill="none" stroke="{_PLAN}" stroke-width="2"/>')
    for p in points:
        x, y = px(p[0]), py(value(p))
        if band(p) is not None:
            lo, hi = py(band(p)[0]), py(band(p)[1])
            body.append(f'<g class="band" stroke="{_PLAN}" stroke-width="1.5"><line x1="{x:.1f}" y1="{lo:.1f}" '
                        f'x2="{x:.1f}" y2="{hi:.1f}"/><line x1="{x - 6:.1f}" y1="{lo:.1f}" x2="{x + 6:.1f}" '
                        f'y2="{lo:.1f}"/><line x1="{x - 6:.1f}" y1="{hi:.1f}" x2="{x + 6:.1f}" y2="{hi:.1f}"/>'
                        f'<title>band {_e(shown(band(p)[0]))} to {_e(shown(band(p)[1]))}</title></g>')
        tip = f"<title>{p[0]:,} devices: {_e(shown(value(p)))}; plan {_e(p[7])}</title>"
        if p[6]:
            pts = " ".join(f"{x + r * math.sin(a):.1f},{y - r * math.cos(a):.1f}"
                           for k in range(10) for a, r in [(k * math.pi / 5, 10 if k % 2 == 0 else 4.5)])
            body.append(f'<polygon class="mark chosen" points="{pts}" fill="{_CHOSEN}" stroke="#fff">{tip}</polygon>')
        else:
            body.append(f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{_PLAN}" stroke="#fff">'
                        f'{tip}</circle>')
    legend = [("the plan at each count (band: whisker)", _PLAN)]
    if ideal is not None:
        legend.append(("ideal scaling (dashed)", _IDEAL))
    if any(p[6] for p in points):
        legend.append(("within the deadline (star)", _CHOSEN))
    body.append(_legend(legend, left, 36))
    return _svg(_WIDTH, height, body, title)


def _table(sweep: TrainingSweep, budget: TrainingBudget | None) -> str:
    seconds = sweep.machine.cost_unit == "seconds"
    head = ["devices", "plan", "step (band)", "tokens/s per device", "MFU", "memory per device (band)", "scaling"]
    if budget is not None:
        head += ["time to train", "device-hours"] + (["cost"] if budget.price is not None else [])
    rows = []
    for entry, efficiency in zip(sweep.entries, scaling_efficiency(sweep.entries)):
        best = entry.best
        if best is None:
            rows.append(f'<tr class="none"><td>{entry.devices:,}</td><td colspan="{len(head) - 1}">'
                        f"{_e(refusal_text(entry))}</td></tr>")
            continue
        s = best.summary
        step_band, memory_band = bands(best, seconds)
        tps = s.tokens_per_second_per_device
        unit = " s" if seconds else ""
        cells = [f"{entry.devices:,}", f"<code>{_e(best.recipe()).replace(',', ',<wbr>')}</code>",
                 _two(f"{s.step_seconds:.4g}{unit}", step_band and f"{step_band[0]:.3g} to {step_band[1]:.3g}"),
                 "-" if tps is None else f"{tps:,.0f}", "-" if s.mfu is None else _two(f"{100 * s.mfu:.1f} %", None),
                 _two(format_bytes(s.peak_memory_bytes),
                      memory_band and f"{format_bytes(memory_band[0])} to {format_bytes(memory_band[1])}"),
                 "-" if efficiency is None else _two(f"{100 * efficiency:.1f} %", None)]
        chosen = False
        if budget is not None:
            fields = time_to_train(tps, entry.devices, budget) if tps else None
            chosen = bool(within_days(fields, budget))
            days = None if fields is None else fields["time_to_train_seconds"] / SECONDS_PER_DAY
            cells += ["-", "-"] if fields is None else [_two(f"{_amount(days)} days", f"{_amount(24 * days)} hours"),
                                                        _amount(fields["device_hours"])]
            if budget.price is not None:
                cells.append("-" if fields is None else _amount(fields["cost"]))
        rows.append(f'<tr class="{"chosen" if chosen else "count"}">' + "".join(f"<td>{c}</td>" for c in cells)
                    + "</tr>")
    return (f'<table class="sweep"><thead><tr>{"".join(f"<th>{_e(h)}</th>" for h in head)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _two(figure: str, below: str | None) -> str:
    """A cell's figure, and a smaller line under it (a band) where there is one."""
    return f"<span>{_e(figure)}</span>" + (f"<br><small>{_e(below)}</small>" if below else "")


_SWEEP_CSS = """
table.sweep{border-collapse:collapse;width:100%;font-size:12.5px}
.sweep th,.sweep td{text-align:left;padding:5px 8px;border-bottom:1px solid #eee;vertical-align:top}
.sweep th{background:#fafbfc} .sweep td small{color:#666;font-weight:normal} .sweep td span{white-space:nowrap}
.sweep tr.chosen td{background:#fff4f4;font-weight:600} .sweep tr.none td{color:#888}
"""


def _cards(sweep: TrainingSweep, points: list, budget: TrainingBudget | None) -> str:
    counts = [e.devices for e in sweep.entries]
    cards = [("device counts", ", ".join(f"{n:,}" for n in counts))]
    if points and points[0][3]:
        top = max(points, key=lambda p: p[3])
        cards.append(("most tokens/s per device", f"{top[3]:,.0f} on {top[0]:,}"))
    fastest = min(points, key=lambda p: p[1]) if points else None
    if fastest is not None:
        cards.append(("fastest step", f"{fastest[1]:.4g} s on {fastest[0]:,}"))
    if budget is not None and budget.days is not None:
        within = [p[0] for p in points if p[6]]
        cards.append((f"smallest count within {budget.days:g} days", f"{min(within):,}" if within else "none"))
    return "".join(f'<div class="card"><span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cards)


def sweep_html(sweep: TrainingSweep, model=None, model_name: str = "sequence length",
               budget: TrainingBudget | None = None, engine: str | None = None) -> str:
    """The page of a training sweep (``sweep_training``'s result with at least one plan); one
    string, everything inline. ``model`` and ``model_name`` only label the title."""
    points = count_points(sweep, budget)
    if not points:
        raise ValueError("no count of the sweep has a plan: there is nothing to draw")
    seconds = sweep.machine.cost_unit == "seconds"
    size = f", {model_name} {model}" if model is not None else ""
    title = f"{sweep.network_name} on {sweep.machine.name}, batch {sweep.batch}{size}: training plans by device count"
    first = points[0]
    unit = " s" if seconds else ""
    charts = []
    if seconds and all(p[3] for p in points):
        charts.append(("Throughput", _chart(points, lambda p: p[3], lambda p: None if p[2] is None else
                                            (p[3] * p[1] / p[2][1], p[3] * p[1] / p[2][0]),
                                            "tokens/s per device against the device count", "tokens/s per device",
                                            lambda v: f"{v:,.0f}", False, ideal=lambda p: first[3])))
    charts.append(("Step time", _chart(points, lambda p: p[1], lambda p: p[2], "step time against the device count",
                                       "step time" + (" (s, log)" if seconds else " (log)"),
                                       lambda v: f"{v:.3g}{unit}", True, ideal=lambda p: first[1] * first[0] / p[0])))
    limit = sweep.machine.memory_bytes
    charts.append(("Memory per device", _chart(points, lambda p: p[4], lambda p: p[5],
                                               "peak memory per device against the device count",
                                               "peak memory per device", format_bytes, False, limit=limit)))
    notes = ('<p class="note">Each point is the plan <code>-p N</code> gives alone; whiskers: its band (the spread of '
             "the engine's published runs against the model, docs/calibration.md); dashed: ideal scaling from the "
             "first count. Hover a point for its plan.</p>")
    sections = "".join(f"<section><h2>{_e(h)}</h2>{body}{notes if i == 0 else ''}</section>"
                       for i, (h, body) in enumerate(charts))
    budget_note = "" if budget is None else (
        f'<p class="note">Time to train {budget.tokens:.3g} tokens at the plan\'s tokens/s on all its devices'
        + (f"; cost at {budget.price:g} per device-hour" if budget.price is not None else "")
        + (f"; highlighted: within {budget.days:g} days ({_amount(budget.days * SECONDS_PER_DAY / 3600)} hours)"
           if budget.days is not None else "") + ".</p>")
    table = f"<section><h2>The plan at each count</h2>{_table(sweep, budget)}{budget_note}</section>"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>PaSE sweep: {_e(title)}</title>"
        f"<style>{_CSS}{_SWEEP_CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1><p class=\"sub\">{_e(sweep.machine.header_line())}"
        + (f"; engine {_e(engine)}" if engine else "") + "</p>"
        f"<div class=\"cards\">{_cards(sweep, points, budget)}</div>{sections}{table}"
        f"<footer>PaSE training sweep: {len(sweep.entries)} counts, "
        f"{sum(e.plan.mesh_search.evaluated for e in sweep.entries if e.plan is not None)} configurations in "
        f"{sweep.seconds:.2f} s, each plan exact as "
        "<code>pase -p N</code> gives it (its search in the JSON of <code>--json</code>). Cost model: "
        "docs/training.md.</footer></main></body></html>\n"
    )
