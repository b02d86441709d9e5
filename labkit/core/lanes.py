"""Lane charts (a Gantt chart per panel) as one static SVG, with a caption that carries the numbers.

A :class:`Panel` is a title, named lanes (rows) and :class:`Bar` s on them (an interval, a style,
a label drawn inside when it fits, a tooltip); :class:`Bracket` s are thin lines over a lane
(a loop, an async collective's window from start to done). :func:`render` draws panels one above
the other on *one* time axis, so two programs (or a model and a measurement) compare by eye.
The SVG is plain text with no script and no external reference: it shows in JupyterLab,
nbconvert's HTML, the slides and GitHub, and tooltips (SVG ``<title>``) show where the SVG is
inline (nbconvert's HTML, the slides). A notebook displays the SVG as a
:class:`labkit.core.figures.Picture`: the drawing with its title and a caption that carries the
numbers (what a terminal and nbval read).

Nothing here knows about XLA: :mod:`labkit.xla.timeline` turns a compiled program into panels.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Mapping, Sequence

__all__ = [
    "Bar",
    "Bracket",
    "Panel",
    "Style",
    "nice_ticks",
    "render",
]

_FONT = "font-family:DejaVu Sans,Arial,sans-serif"
_CHAR_PX = 6.2  # mean width of one character at 11 px, for "does the label fit"


@dataclasses.dataclass(frozen=True)
class Style:
    """How bars of one kind look: fill colour, optional hatching, and the legend's words."""

    fill: str
    legend: str
    hatch: bool = False
    height: float = 1.0  # fraction of the lane's height (thinner bars sit on the lane's bottom)
    text: str = "#fff"  # colour of a label drawn inside the bar


@dataclasses.dataclass(frozen=True)
class Bar:
    """An interval ``[start, end)`` on ``lane``, drawn in ``style`` (a key of the styles)."""

    lane: str
    start: float
    end: float
    style: str
    label: str = ""
    tooltip: str = ""


@dataclasses.dataclass(frozen=True)
class Bracket:
    """A thin line over ``lane`` from ``start`` to ``end`` with end ticks and a label above it
    (``level`` stacks brackets: 0 right over the bars, 1 above that...). A ``strong`` one is
    drawn thick, its label bold: what a caption points the reader to."""

    lane: str
    start: float
    end: float
    label: str = ""
    tooltip: str = ""
    level: int = 0
    strong: bool = False


@dataclasses.dataclass(frozen=True)
class Panel:
    """One chart: a title, its lanes top to bottom, its bars and brackets."""

    title: str
    lanes: tuple[str, ...]
    bars: tuple[Bar, ...]
    brackets: tuple[Bracket, ...] = ()

    @property
    def end(self) -> float:
        """The latest end of anything drawn (0 for an empty panel)."""
        ends = [b.end for b in self.bars] + [b.end for b in self.brackets]
        return max(ends, default=0.0)


def nice_ticks(end: float, most: int = 8) -> list[float]:
    """Round tick values from 0 to at least ``end``, at most ``most`` of them (1, 2, 5 steps)."""
    if end <= 0 or not math.isfinite(end):
        return [0.0, 1.0]
    raw = end / max(1, most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = math.ceil(end / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.3g}"


def _merge(bars: Sequence[Bar], min_width: float, scale: float, unit: str) -> list[Bar]:
    """Runs of touching bars of one style on one lane, each narrower than ``min_width`` px,
    merged into one bar whose tooltip counts them (what a pixel can show)."""
    out: list[Bar] = []
    run: list[Bar] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            total = sum(b.end - b.start for b in run)
            tip = f"{len(run)} bars, {total:.3g} {unit} in all (too narrow to draw one by one)"
            out.append(Bar(run[0].lane, run[0].start, run[-1].end, run[0].style, "", tip))
        run.clear()

    for bar in bars:
        narrow = (bar.end - bar.start) * scale < min_width
        joins = run and bar.style == run[-1].style and bar.start - run[-1].end <= 1e-12
        if narrow and joins:
            run.append(bar)
            continue
        flush()
        if narrow:
            run.append(bar)
        else:
            out.append(bar)
    flush()
    return out


def _patterns(styles: Mapping[str, Style]) -> str:
    defs = []
    for key, style in styles.items():
        if style.hatch:
            defs.append(
                f'<pattern id="h-{key}" width="6" height="6" patternUnits="userSpaceOnUse" '
                f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{style.fill}" '
                f'opacity="0.45"/><line x1="0" y1="0" x2="0" y2="6" stroke="{style.fill}" '
                'stroke-width="3"/></pattern>'
            )
    return f"<defs>{''.join(defs)}</defs>" if defs else ""


def _fill(key: str, style: Style) -> str:
    return f"url(#h-{key})" if style.hatch else style.fill


def render(
    panels: Sequence[Panel],
    styles: Mapping[str, Style],
    unit: str = "us",
    axis_label: str = "time",
    width: int = 960,
    lane_height: int = 22,
    min_bar_px: float = 0.6,
) -> str:
    """The panels as one SVG, top to bottom on one time axis (0 to the latest end of any).

    ``styles`` maps each bar's ``style`` to how it looks; the legend lists the styles used.
    Bars narrower than ``min_bar_px`` that touch are merged (their tooltip counts them).
    """
    unknown = {b.style for p in panels for b in p.bars} - set(styles)
    if unknown:
        raise ValueError(f"bars use styles {sorted(unknown)} that are not in styles: add them")
    left, right = 150, 16
    plot = width - left - right
    end = max((p.end for p in panels), default=0.0)
    ticks = nice_ticks(end)
    scale = plot / ticks[-1]

    def x(t: float) -> str:
        return _num(left + t * scale)

    parts: list[str] = []
    y = 8.0
    for panel in panels:
        levels: dict[str, int] = {}
        for br in panel.brackets:
            levels[br.lane] = max(levels.get(br.lane, 0), br.level + 1)
        parts.append(
            f'<text x="{left}" y="{_num(y + 13)}" style="{_FONT};font-size:13px;'
            f'font-weight:bold">{html.escape(panel.title)}</text>'
        )
        y += 22
        for lane in panel.lanes:
            room = 12 * levels.get(lane, 0)
            top = y + room
            parts.append(
                f'<text x="{left - 6}" y="{_num(top + lane_height * 0.7)}" text-anchor="end" '
                f'style="{_FONT};font-size:11px">{html.escape(lane)}</text>'
                f'<rect x="{left}" y="{_num(top)}" width="{plot}" height="{lane_height}" '
                'fill="#f4f4f4"/>'
            )
            bars = sorted((b for b in panel.bars if b.lane == lane), key=lambda b: b.start)
            for bar in _merge(bars, min_bar_px, scale, unit):
                style = styles[bar.style]
                w = max((bar.end - bar.start) * scale, min_bar_px)
                h = lane_height * style.height
                by = top + lane_height - h
                tip = html.escape(bar.tooltip or bar.label)
                label = ""
                if bar.label and len(bar.label) * _CHAR_PX + 4 <= w and h >= 12:
                    label = (
                        f'<text x="{_num(left + bar.start * scale + 2)}" '
                        f'y="{_num(by + h / 2 + 4)}" style="{_FONT};font-size:11px" '
                        f'fill="{style.text}">{html.escape(bar.label)}</text>'
                    )
                edge = ' stroke="#fff" stroke-width="0.4"' if w >= 2 else ""
                parts.append(
                    f'<g><title>{tip}</title><rect x="{x(bar.start)}" y="{_num(by)}" '
                    f'width="{_num(w)}" height="{_num(h)}" fill="{_fill(bar.style, style)}"'
                    f"{edge}/>{label}</g>"
                )
            for br in (b for b in panel.brackets if b.lane == lane):
                by = top - 4 - 12 * br.level
                x0, x1 = x(br.start), x(max(br.end, br.start))
                text = ""
                span = (br.end - br.start) * scale
                weight = ";font-weight:bold" if br.strong else ""
                if br.label and (len(br.label) * 5.6 <= span or br.strong):
                    text = (
                        f'<text x="{x0}" y="{_num(by - 2)}" style="{_FONT};font-size:10px'
                        f'{weight}" fill="#000">{html.escape(br.label)}</text>'
                    )
                stroke = "2" if br.strong else "1"
                parts.append(
                    f"<g><title>{html.escape(br.tooltip or br.label)}</title>"
                    f'<path d="M{x0} {_num(by + 3)}V{_num(by)}H{x1}V{_num(by + 3)}" '
                    f'fill="none" stroke="#333" stroke-width="{stroke}"/>{text}</g>'
                )
            y = top + lane_height + 4
        y += 10
    # the time axis, under the last panel
    axis = [f'<line x1="{left}" y1="{_num(y)}" x2="{left + plot}" y2="{_num(y)}" stroke="#333"/>']
    for t in ticks:
        axis.append(
            f'<line x1="{x(t)}" y1="{_num(y)}" x2="{x(t)}" y2="{_num(y + 4)}" stroke="#333"/>'
            f'<text x="{x(t)}" y="{_num(y + 16)}" text-anchor="middle" '
            f'style="{_FONT};font-size:10px">{_tick_label(t)}</text>'
        )
    axis.append(
        f'<text x="{left + plot / 2}" y="{_num(y + 30)}" text-anchor="middle" '
        f'style="{_FONT};font-size:11px">{html.escape(axis_label)} ({html.escape(unit)})</text>'
    )
    y += 40
    used = [k for k in styles if any(b.style == k for p in panels for b in p.bars)]
    legend, lx = [], float(left)
    for key in used:
        style = styles[key]
        step = 28 + len(style.legend) * 5.6
        if lx + step > width and lx > left:
            lx, y = float(left), y + 16
        legend.append(
            f'<rect x="{_num(lx)}" y="{_num(y)}" width="14" height="10" '
            f'fill="{_fill(key, style)}"/><text x="{_num(lx + 18)}" y="{_num(y + 9)}" '
            f'style="{_FONT};font-size:10px">{html.escape(style.legend)}</text>'
        )
        lx += step
    height = y + 20
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_num(height)}" '
        f'viewBox="0 0 {width} {_num(height)}">'
        f'<rect width="{width}" height="{_num(height)}" fill="#fff"/>'
        f"{_patterns({k: styles[k] for k in used})}{''.join(parts)}{''.join(axis)}"
        f"{''.join(legend)}</svg>"
    )
