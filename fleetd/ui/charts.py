"""Line charts as inline SVG, drawn on the server: no chart library, nothing to download."""

import datetime as dt

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 10, 26


def _parse(at):
    return dt.datetime.fromisoformat(at.rstrip("Z"))


def _nice_max(value):
    """The smallest of 1, 2, 5 x 10^n that is at least `value` (and at least 1)."""
    value = max(1.0, float(value))
    scale = 1.0
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10


def _bucketed(points, start, span, columns):
    """At most one point per column of the plot: the mean of each line's values in it."""
    buckets: dict[int, list] = {}  # column -> [(at, row)]
    for at, row in points:
        column = int(columns * max(0.0, min(1.0, (at - start).total_seconds() / span)))
        buckets.setdefault(column, []).append((at, row))
    out = []
    for column in sorted(buckets):
        group = buckets[column]
        merged = {}
        for label in group[0][1]:
            values = [row[label] for _, row in group if row[label] is not None]
            merged[label] = sum(values) / len(values) if values else None
        out.append((group[-1][0], merged))
    return out


def line_chart(samples, lines, start, end, y_max=None, unit="", title=""):
    """An SVG chart of `lines` [(key or function, css class, label)] over samples [{at, ...}].

    Samples with a missing value break the line instead of drawing it through zero. `start`
    and `end` (naive UTC datetimes) fix the x axis, so an empty chart still shows the window.
    More samples than the plot has pixel columns are averaged per column.
    """
    span = max(1.0, (end - start).total_seconds())
    points = []
    for sample in samples:
        at = _parse(sample["at"])
        row = {}
        for key, _cls, _label in lines:
            value = key(sample) if callable(key) else sample.get(key)
            row[_label] = value
        points.append((at, row))
    columns = WIDTH - LEFT - RIGHT
    if len(points) > columns:
        points = _bucketed(points, start, span, columns)
    values = [v for _, row in points for v in row.values() if v is not None]
    top = y_max if y_max is not None else _nice_max(max(values) if values else 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(at):
        return LEFT + plot_w * min(1.0, max(0.0, (at - start).total_seconds() / span))

    def y(value):
        return TOP + plot_h * (1 - min(1.0, max(0.0, value / top)))

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="none" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0, 0.5, 1):
        gy = TOP + plot_h * (1 - fraction)
        label = f"{top * fraction:g}{unit}"
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{gy:.1f}" x2="{WIDTH - RIGHT}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{LEFT - 4}" y="{gy + 4:.1f}" '
            f'text-anchor="end">{escape(label)}</text>'
        )
    for hours_back in range(0, int(span // 3600) + 1, max(1, int(span // 3600) // 6 or 1)):
        at = end - dt.timedelta(hours=hours_back)
        label = "now" if hours_back == 0 else f"-{hours_back}h"
        parts.append(
            f'<text class="axis" x="{x(at):.1f}" y="{HEIGHT - 8}" '
            f'text-anchor="middle">{label}</text>'
        )
    for key, cls, label in lines:
        segments: list[list[str]] = []
        current: list[str] = []  # "x,y" of the points since the last gap
        for at, row in points:
            value = row[label]
            if value is None:
                if current:
                    segments.append(current)
                current = []
                continue
            current.append(f"{x(at):.1f},{y(value):.1f}")
        if current:
            segments.append(current)
        for segment in segments:
            if len(segment) == 1:
                cx, cy = segment[0].split(",")
                parts.append(
                    f'<circle class="{cls}" cx="{cx}" cy="{cy}" '
                    f'r="2"><title>{escape(label)}</title></circle>'
                )
            else:
                parts.append(
                    f'<polyline class="{cls}" '
                    f'points="{" ".join(segment)}"><title>{escape(label)}</title>'
                    f"</polyline>"
                )
    parts.append("</svg>")
    return Markup("".join(parts))  # nosec B704  # numbers, the callers' constant classes and escaped text


SERIES_CLASSES = 8  # .s-k0 ... .s-k7 in the stylesheet, reused in turn


def stacked_bars(columns, stacks, unit="", title=""):
    """An SVG chart of one bar per column (a day), stacked from `stacks` {name: [value per column]}
    in the order given; each piece has a tooltip. Series take the classes s-k0, s-k1, ... in
    turn."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum((values[i] or 0) for values in stacks.values()) for i in range(len(columns))]
    top = _nice_max(max(totals) if totals else 1)
    slot = plot_w / max(1, len(columns))
    bar = max(1.0, slot * 0.7)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="none" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0, 0.5, 1):
        gy = TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{gy:.1f}" x2="{WIDTH - RIGHT}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{LEFT - 4}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{escape(f'{top * fraction:g}{unit}')}</text>"
        )
    every = max(1, len(columns) // 7)
    for i, column in enumerate(columns):
        x = LEFT + slot * i + (slot - bar) / 2
        base = TOP + plot_h
        for n, (name, values) in enumerate(stacks.items()):
            value = values[i] or 0
            if value <= 0:
                continue
            height = plot_h * value / top
            base -= height
            tip = escape(f"{column} {name}: {value:g}{unit}")
            parts.append(
                f'<rect class="s-k{n % SERIES_CLASSES}" x="{x:.1f}" y="{base:.1f}" '
                f'width="{bar:.1f}" height="{height:.1f}"><title>{tip}</title></rect>'
            )
        if i % every == 0 or i == len(columns) - 1:
            parts.append(
                f'<text class="axis" x="{x + bar / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                f"{escape(str(column)[5:])}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))  # nosec B704  # numbers, constant classes and escaped text
