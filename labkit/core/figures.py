"""The kit's pictures: plots (matplotlib) and device grids (SVG), each with its caption.

Every picture is a :class:`Picture`: a title, axes labelled with their units, and a caption
that carries the numbers it shows, so a reader without the picture (a terminal, nbval, a
screen reader) loses nothing. In Jupyter a Picture displays as one HTML ``<figure>`` (the
drawing and its caption) with its text form (title, caption) beside it for terminals, as
:func:`labkit.core.report.show_table` does for tables. A cell shows one by ending with it or
by calling :meth:`Picture.show`.

**Why matplotlib.** It is already the kit's plotting dependency; it draws headless (the Agg
renderer: no display, no JavaScript), and its PNG shows the same in JupyterLab, nbconvert's
HTML, the slides and GitHub. An interactive library (Bokeh, Plotly, Altair) would need
JavaScript that nbconvert's HTML, GitHub and an offline lab room do not all run, for
pictures that do not need interaction. Device grids are a few rectangles and labels: plain
SVG written here (no library), kept as text in the page so a test can count their blocks.

The API, small on purpose:

- :func:`new_figure` and :func:`picture`: draw anything with matplotlib's object API (never
  ``pyplot``, so nothing is shown twice) and make it a Picture; the title and every axis
  label are checked.
- :func:`sweep`: numbers against a parameter, one or more panels of :class:`Series`
  (a threshold sweep, an error against a scale, a loss against the step).
- :func:`curves`: curves against their index (a loss against the step).
- :func:`bars`: one bar (or range, ``(low, high)``) per named thing.
- :func:`stacked_bars`: parts of a whole per thing (memory per device) against capacities.
- :func:`roofline`: compute and memory roofs, measured roofs and points.
- :func:`layout_grids`: which devices hold which block of an array, one colour per device.
- :func:`device_color`: the colour of a device, the same in every picture; :func:`log_ticks`:
  decade ticks for a log axis drawn by hand.

Captions write numbers with :func:`number` (whole from 100 to a million, else 3 significant
digits), bytes with :func:`size_text` (``80 GB``) and shares with :func:`percent`.

A new kind of drawing (a schedule on a timeline, say) is a function beside these: it draws
on :func:`new_figure`'s axes with matplotlib's object API, colours devices or streams with
:func:`device_color`, writes its caption from the same data, and returns :func:`picture`;
its test checks the figure's content and :func:`overlapping_labels`.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.core.report import display_rich

if TYPE_CHECKING:  # matplotlib is imported by the functions that draw
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

__all__ = [
    "Picture",
    "Series",
    "bars",
    "curves",
    "device_color",
    "device_label",
    "layout_grids",
    "log_ticks",
    "new_figure",
    "number",
    "overlapping_labels",
    "percent",
    "picture",
    "ridge",
    "roofline",
    "series_caption",
    "size_text",
    "stacked_bars",
    "sweep",
]

# Tableau's 10 colours, then their light variants: device i is COLORS[i % 20] everywhere.
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
SIZE = (6.4, 3.6)  # inches: one panel
DPI = 100  # 640 x 360 pixels for one panel
LIST_AT_MOST = 8  # a caption lists a series' points up to this many, else summarises them


def number(x: float) -> str:
    """``x`` as a caption writes it: whole from 100 to a million (``989``, ``3350``), else 3
    significant digits (``0.0123``, ``2.4e-07``, ``8e+10``); ``inf`` and ``nan`` as such."""
    if not math.isfinite(x):
        return str(x)
    if 100 <= abs(x) < 1e6:
        return f"{x:.0f}"
    return f"{x:.3g}"


def percent(fraction: float) -> str:
    """A fraction as a caption writes it: ``96%``, ``110%``, ``0.0081%``."""
    value = 100 * fraction
    return f"{value:.0f}%" if abs(value) >= 10 else f"{value:.2g}%"


def size_text(nbytes: float) -> str:
    """Bytes in decimal units, as an axis or a caption writes them: ``80 GB``, ``6.7 MB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.3g} B"


def device_color(device: int) -> str:
    """The colour of device ``device`` (an id), the same in every picture of the kit."""
    return COLORS[device % len(COLORS)]


def device_label(devices: Sequence[int]) -> str:
    """Device ids as a short label: ``0``, ``0,4``, ``0-3`` (runs of 3 or more joined)."""
    ids = sorted(devices)
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ids[i]}-{ids[j]}")
        else:
            parts.extend(str(d) for d in ids[i : j + 1])
        i = j + 1
    return ",".join(parts)


@dataclasses.dataclass(frozen=True)
class Picture:
    """A drawing with its title and caption: a matplotlib ``figure`` or an ``svg`` string.

    ``text`` is a text form of the drawing itself where one exists (a grid of device ids);
    ``str(picture)`` is the title, that text and the caption: all a terminal shows.
    """

    title: str
    caption: str
    figure: Figure | None = None
    svg: str = ""
    text: str = ""

    def __str__(self) -> str:
        return "\n".join(p for p in (self.title, self.text, self.caption) if p)

    def png(self, dpi: int = DPI) -> bytes:
        """The figure as PNG bytes (a plot; an SVG picture has none)."""
        if self.figure is None:
            raise ValueError(f"{self.title!r} is an SVG picture: use .svg, or save('x.svg')")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=dpi)
        return buffer.getvalue()

    def _repr_html_(self) -> str:
        alt = html.escape(str(self), quote=True)
        if self.figure is not None:
            data = base64.b64encode(self.png()).decode()
            body = f'<img src="data:image/png;base64,{data}" alt="{alt}">'
        else:
            body = self.svg
        return (
            f'<figure class="labkit-figure" style="margin: 0.5em 0">{body}'
            f'<figcaption style="max-width: 60em; font-size: 90%">'
            f"<b>{html.escape(self.title)}.</b> {html.escape(self.caption)}</figcaption></figure>"
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {"text/html": self._repr_html_(), "text/plain": str(self)}

    def show(self) -> None:
        """Display it: rendered in Jupyter, as its text form in plain Python."""
        display_rich(self._repr_mimebundle_())

    def save(self, path: str | Path) -> Path:
        """Write it to ``path``: ``.png`` or ``.svg`` (a plot can be either, a grid SVG)."""
        path = Path(path)
        if path.suffix == ".svg":
            if self.figure is not None:
                self.figure.savefig(path, format="svg")
            else:
                path.write_text(self.svg)
        elif path.suffix == ".png":
            path.write_bytes(self.png())
        else:
            raise ValueError(f"save a picture as .png or .svg, got {path.name!r}")
        return path


# ---------------------------------------------------------------------------------------
# Plots: any matplotlib figure, checked


def new_figure(
    ncols: int = 1, size: tuple[float, float] | None = None, nrows: int = 1
) -> tuple[Figure, list[Axes]]:
    """A matplotlib figure (no pyplot: shown only as a Picture) and its axes, row by row."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = size or (SIZE[0] * (1 + 0.6 * (ncols - 1)), SIZE[1] * nrows)
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # draws headless, whatever pyplot's backend
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def picture(fig: Figure, title: str, caption: str, text: str = "") -> Picture:
    """A :class:`Picture` of ``fig`` with ``title`` on top; raises if an axis is unlabelled.

    Every axes that shows data needs an x and a y label (with units: ``"bytes"``,
    ``"TFLOP/s"``); an axis whose ticks are hidden needs none.
    """
    if not title or not caption:
        raise ValueError("a picture needs a title and a caption with the numbers it shows")
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison:
            continue
        for name, label, ticks in (
            ("x", ax.get_xlabel(), ax.get_xticks()),
            ("y", ax.get_ylabel(), ax.get_yticks()),
        ):
            if len(ticks) and not label:
                raise ValueError(
                    f"axes {i} of {title!r} has no {name} label: set one with its unit "
                    f"(ax.set_{name}label('bytes')), or hide its ticks"
                )
    fig.suptitle(title)
    return Picture(title, caption, figure=fig, text=text)


def overlapping_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of tick labels that overlap on the drawn figure (a test: there should be none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            for i in range(len(labels)):
                for j in range(i + 1, len(labels)):
                    if boxes[i].overlaps(boxes[j]):
                        found.append((labels[i].get_text(), labels[j].get_text()))
    return found


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a plot: ``y`` against ``x``, optionally a name per point (annotated).

    ``style`` is a matplotlib format string (``"o-"``, ``"--"``, ``"s"``).
    """

    label: str
    x: Sequence[float]
    y: Sequence[float]
    names: Sequence[str] = ()
    style: str = "o-"

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or (self.names and len(self.names) != len(self.x)):
            raise ValueError(
                f"series {self.label!r}: {len(self.x)} x, {len(self.y)} y and "
                f"{len(self.names)} names; give one y (and one name, if any) per x"
            )


def series_caption(series: Series, x_unit: str = "", y_unit: str = "") -> str:
    """What a caption says of one series: every point up to :data:`LIST_AT_MOST`, else its
    count, first and last point and its range."""
    if len(series.x) == 0:
        return f"{series.label}: no points"

    def xs(v: float) -> str:
        return _with_unit(v, x_unit)

    def ys(v: float) -> str:
        return _with_unit(v, y_unit)

    if len(series.x) <= LIST_AT_MOST:
        points = []
        for i, (x, y) in enumerate(zip(series.x, series.y, strict=True)):
            where = series.names[i] if series.names else xs(x)
            points.append(f"{ys(y)} at {where}")
        return f"{series.label}: " + ", ".join(points)
    finite = [y for y in series.y if math.isfinite(y)]
    low, high = (min(finite), max(finite)) if finite else (math.nan, math.nan)
    return (
        f"{series.label}: {len(series.x)} points, {ys(series.y[0])} at {xs(series.x[0])} to "
        f"{ys(series.y[-1])} at {xs(series.x[-1])} (from {number(low)} to {number(high)})"
    )


def _with_unit(value: float, unit: str) -> str:
    """``value`` and its unit; a million bytes or more in decimal units (``31.5 MB``)."""
    if unit == "B" and abs(value) >= 1e6:
        return size_text(value)
    return f"{number(value)} {unit}" if unit else number(value)


def _draw_series(ax: Axes, series: Series, color: str | None = None) -> None:
    (line,) = ax.plot(series.x, series.y, series.style, label=series.label, color=color)
    at: dict[tuple[float, float], list[str]] = {}  # points drawn on one spot share a label
    for name, x, y in zip(series.names, series.x, series.y, strict=False):
        at.setdefault((x, y), []).append(name)
    for (x, y), names in at.items():
        ax.annotate(
            ", ".join(names),
            (x, y),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=7,
            color=line.get_color(),
        )


def sweep(
    title: str,
    xlabel: str,
    panels: Mapping[str, Sequence[Series]],
    *,
    xscale: str = "linear",
    yscale: str = "linear",
    x_unit: str = "",
    y_units: Mapping[str, str] | None = None,
    note: str = "",
) -> Picture:
    """Numbers against a parameter: one panel per y label (``{ylabel: [Series, ...]}``).

    ``xscale`` and ``yscale`` are matplotlib's (``"log"``, ``"symlog"``); ``x_unit`` and
    ``y_units`` (per panel) are written after the numbers in the caption; ``note`` opens it.
    """
    if not panels:
        raise ValueError("sweep needs at least one panel: {ylabel: [Series, ...]}")
    fig, axes = new_figure(ncols=len(panels))
    parts = [note] if note else []
    for ax, (ylabel, lines) in zip(axes, panels.items(), strict=True):
        for s in lines:
            _draw_series(ax, s)
        ax.set(xscale=xscale, yscale=yscale, xlabel=xlabel, ylabel=ylabel)
        unit = (y_units or {}).get(ylabel, "")
        xs = [v for line in lines for v in line.x]
        ys = [v for line in lines for v in line.y]
        for scale, axis, u, values in (
            (xscale, ax.xaxis, x_unit, xs),
            (yscale, ax.yaxis, unit, ys),
        ):
            if u == "B":
                _byte_ticks(axis, scale, values)
            elif scale == "log":
                log_ticks(axis)
        ax.grid(True, which="major", alpha=0.3)
        if len(lines) > 1 or lines[0].label:
            ax.legend(fontsize="small")
        caption = "; ".join(series_caption(s, x_unit, unit) for s in lines)
        parts.append(f"{ylabel}: {caption}." if len(panels) > 1 else f"{caption}.")
    return picture(fig, title, " ".join(parts))


def curves(
    title: str,
    xlabel: str,
    ylabel: str,
    ys: Mapping[str, Sequence[float]],
    *,
    start: int = 0,
    note: str = "",
) -> Picture:
    """Curves against their index (a loss against the step): ``{label: values}``, the first
    value at ``start``; styles ``-``, ``--``, ``:`` in turn, so they read without colour."""
    styles = ("-", "--", ":", "-.")
    lines = [
        Series(
            label,
            [float(start + i) for i in range(len(v))],
            [float(y) for y in v],
            style=styles[k % len(styles)],
        )
        for k, (label, v) in enumerate(ys.items())
    ]
    return sweep(title, xlabel, {ylabel: lines}, note=note)


def bars(
    title: str,
    values: Mapping[str, float | tuple[float, float]],
    xlabel: str,
    ylabel: str,
    *,
    unit: str = "",
    xscale: str = "linear",
    lines: Mapping[str, float] | None = None,
    note: str = "",
) -> Picture:
    """One horizontal bar per name, top to bottom in order; a ``(low, high)`` value is drawn
    as a range. ``lines`` are labelled vertical reference lines (a limit, a capacity)."""
    if not values:
        raise ValueError("bars needs at least one value")
    names = list(values)
    height = max(SIZE[1], 0.9 + 0.32 * len(names))
    fig, (ax,) = new_figure(size=(SIZE[0] + 1.5, height))
    u = f" {unit}" if unit else ""
    said = []
    for i, name in enumerate(names):
        value = values[name]
        low, high = value if isinstance(value, tuple) else (0.0, value)
        left = low if isinstance(value, tuple) else None
        ax.barh(i, high - low, left=left, color=COLORS[0])
        if isinstance(value, tuple):  # the ends marked: a range of zero width still shows
            ax.plot([low, high], [i, i], "|", color="black", markersize=14)
        said.append(
            f"{name} {number(low)}-{number(high)}{u}"
            if isinstance(value, tuple)
            else f"{name} {number(high)}{u}"
        )
    for k, (label, x) in enumerate((lines or {}).items()):
        ax.axvline(x, color=COLORS[3 + k], ls="--", label=f"{label} ({number(x)}{u})")
        said.append(f"{label} at {number(x)}{u}")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xscale=xscale, xlabel=xlabel, ylabel=ylabel)
    if xscale == "linear":  # plain bars from zero, so lengths compare; ranges where they lie
        ends = [
            v
            for value in values.values()
            for v in (value if isinstance(value, tuple) else (0.0, value))
        ]
        ends += list((lines or {}).values())
        low, high = min(ends), max(ends)
        pad = 0.05 * (high - low or abs(high) or 1.0)
        ax.set_xlim(
            low - pad if any(isinstance(v, tuple) for v in values.values()) else 0, high + pad
        )
    if xscale == "log":
        log_ticks(ax.xaxis)
    ax.grid(True, axis="x", alpha=0.3)
    if lines:
        ax.legend(fontsize="small")
    caption = (f"{note} " if note else "") + "; ".join(said) + "."
    return picture(fig, title, caption)


def stacked_bars(
    title: str,
    parts: Mapping[str, Mapping[str, float]],
    ylabel: str,
    *,
    capacities: Mapping[str, float],
    scale: float = 1e6,
    unit: str = "MB",
    note: str = "",
) -> Picture:
    """Parts of a whole per thing (``{thing: {part: bytes}}``), in two panels.

    Left, the parts stacked, in ``unit`` (bytes / ``scale``); right, each whole on a log
    axis against ``capacities`` (``{"H100 80 GB": 80e9}``), where a whole thousands of
    times smaller than the capacity is still seen. The caption gives every part and each
    whole's share of each capacity.
    """
    if not parts or not capacities:
        raise ValueError("stacked_bars needs parts per thing and at least one capacity")
    names = list(parts)
    kinds = list(dict.fromkeys(k for p in parts.values() for k in p))
    height = max(SIZE[1], 1.2 + 0.4 * len(names))
    fig, (left, right) = new_figure(ncols=2, size=(SIZE[0] * 1.8, height))
    start = [0.0] * len(names)
    for k, kind in enumerate(kinds):
        widths = [parts[n].get(kind, 0.0) / scale for n in names]
        left.barh(range(len(names)), widths, left=start, color=COLORS[k], label=kind)
        start = [s + w for s, w in zip(start, widths, strict=True)]
    totals = [sum(parts[n].values()) for n in names]
    for k, capacity in enumerate(capacities.values()):
        if capacity <= 1.5 * max(totals):  # a limit near the bars shows on the linear axis
            left.axvline(capacity / scale, color=_ROOF_COLORS[k % 3], ls="--")
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set(xlabel=f"{unit} per device", ylabel=ylabel, title="what each device holds")
    right.barh(range(len(names)), totals, color=COLORS[7], label="total")
    for k, (label, capacity) in enumerate(capacities.items()):
        right.axvline(capacity, color=_ROOF_COLORS[k % 3], ls="--", label=label)
    first = next(iter(capacities.items()))
    for i, total in enumerate(totals):
        share = f" {percent(total / first[1])} of {first[0]}"
        right.annotate(share, (total, i), va="center", fontsize=8)
    low, high = _decades(min(totals) / 2, max([*totals, *capacities.values()]) * 1.5)
    right.set_yticks(range(len(names)), names)
    right.invert_yaxis()
    right.set(xscale="log", xlim=(low, high), xlabel="bytes per device (log scale)", ylabel=ylabel)
    log_ticks(right.xaxis, lambda v, _: size_text(v))
    right.set_title("against the capacity")
    fig.legend(loc="outside lower center", ncols=len(kinds) + len(capacities) + 1, fontsize="small")
    said = []
    for name, total in zip(names, totals, strict=True):
        terms = " + ".join(f"{k} {number(v / scale)}" for k, v in parts[name].items())
        shares = ", ".join(f"{percent(total / c)} of {label}" for label, c in capacities.items())
        said.append(f"{name}: {terms} = {number(total / scale)} {unit} ({shares})")
    caption = (f"{note} " if note else "") + "; ".join(said) + "."
    return picture(fig, title, caption)


# ---------------------------------------------------------------------------------------
# Rooflines


def ridge(peak_tflops: float, gbps: float) -> float:
    """The intensity (FLOPs per byte) where a compute roof meets a memory roof."""
    if peak_tflops <= 0 or gbps <= 0:
        raise ValueError(f"roofs must be positive, got {peak_tflops} TFLOP/s and {gbps} GB/s")
    return peak_tflops * 1e12 / (gbps * 1e9)


_ROOF_COLORS = ("#d62728", "#9467bd", "#8c564b")  # compute roofs: reds and browns
_MEASURED_COLORS = ("#2ca02c", "#bcbd22")  # measured roofs: greens
_POINT_COLORS = ("#1f77b4", "#ff7f0e", "#17becf", "#e377c2", "#7f7f7f")  # points


def log_ticks(axis: Axis, formatter: Callable[[float, object], str] | None = None) -> None:
    """Whole decades only on a log axis, labelled as plain text (``0.01``, ``1000``; ``1e-40``
    on an axis reaching below 1e-4 or above 1e6; no TeX): no two labels collide, and few
    tick objects are drawn (fast)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    def decade(value: float, _: object = None) -> str:
        low, high = sorted(abs(v) for v in axis.get_view_interval())
        if 1e-4 <= low and high <= 1e6:
            return f"{value:g}"
        return f"1e{round(math.log10(value))}"

    axis.set_major_locator(LogLocator(base=10, numticks=10))
    axis.set_major_formatter(FuncFormatter(formatter or decade))
    axis.set_minor_locator(NullLocator())


def _byte_ticks(axis: Axis, scale: str, values: Sequence[float]) -> None:
    """Bytes on an axis written as ``64 kB``; a symlog axis ticked at 0 and every other
    decade from 100 B, so labels stay apart."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis.set_major_formatter(FuncFormatter(lambda v, _: size_text(v) if v else "0"))
    if scale in ("log", "symlog"):
        top = max([v for v in values if v > 0], default=1.0)
        first = 2 if scale == "symlog" else 0
        decades = range(first, math.floor(math.log10(top)) + 1, 2)
        axis.set_major_locator(
            FixedLocator([0.0] * (scale == "symlog") + [10.0**d for d in decades])
        )
        axis.set_minor_locator(NullLocator())


def _decades(low: float, high: float) -> tuple[float, float]:
    return 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))


def roofline(
    title: str,
    compute_roofs: Mapping[str, float],
    memory_roof: tuple[str, float],
    points: Sequence[Series],
    *,
    measured_roofs: Mapping[str, float] | None = None,
    note: str = "",
) -> Picture:
    """A log-log roofline: ``compute_roofs`` (``{name: TFLOP/s}``) meet ``memory_roof``
    (``(name, GB/s)``) at their ridges; ``measured_roofs`` (``{name: TFLOP/s}``) are flat
    lines (a peak measured without a bandwidth); ``points`` are Series of (FLOPs per byte,
    TFLOP/s). Ticks are whole decades, so no two tick labels collide."""
    if not compute_roofs:
        raise ValueError("roofline needs at least one compute roof: {'bf16': 989.0}")
    measured = dict(measured_roofs or {})
    mem_name, gbps = memory_roof
    ridges = {name: ridge(peak, gbps) for name, peak in compute_roofs.items()}
    top = max(compute_roofs.values())
    xs = [x for s in points for x in s.x if x > 0] + list(ridges.values())
    ys = [y for s in points for y in s.y if y > 0] + list(measured.values())
    xmin, xmax = _decades(min(xs) / 2, max(xs) * 2)
    ymin = _decades(min([*ys, top]) / 2, top)[0]
    fig, (ax,) = new_figure(size=(SIZE[0] + 2.4, SIZE[1] + 0.6))
    hbm = f"{mem_name} {number(gbps)} GB/s"
    ax.plot([xmin, ridge(top, gbps)], [gbps * xmin / 1e3, top], color="black", lw=1.5, label=hbm)
    for k, (name, peak) in enumerate(compute_roofs.items()):
        color = _ROOF_COLORS[k % len(_ROOF_COLORS)]
        ax.plot([ridges[name], xmax], [peak, peak], color=color, lw=1.5, label=name)
        ax.axvline(ridges[name], color=color, lw=0.6, ls=":")
    for k, (name, peak) in enumerate(measured.items()):
        ax.axhline(peak, color=_MEASURED_COLORS[k % 2], ls="--", lw=1.2, label=name)
    for k, s in enumerate(points):
        _draw_series(ax, s, _POINT_COLORS[k % len(_POINT_COLORS)])
    ax.set(xscale="log", yscale="log", xlim=(xmin, xmax), ylim=(ymin, top * 3))
    ax.set(xlabel="arithmetic intensity (FLOPs per byte)", ylabel="TFLOP/s")
    log_ticks(ax.xaxis)
    log_ticks(ax.yaxis)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    roofs = ", ".join(
        f"{name} {number(peak)} TFLOP/s (ridge at {number(ridges[name])} FLOPs/byte)"
        for name, peak in compute_roofs.items()
    )
    said = [f"Roofs: {roofs}; {mem_name} {number(gbps)} GB/s."]
    if measured:
        said.append(
            "Measured roofs: "
            + ", ".join(f"{n} {number(v)} TFLOP/s" for n, v in measured.items())
            + "."
        )
    said += [series_caption(s, "FLOPs/byte", "TFLOP/s") + "." for s in points]
    return picture(fig, title, " ".join([note, *said] if note else said))


# ---------------------------------------------------------------------------------------
# Device grids (SVG)

type Grid = Sequence[Sequence[Sequence[int]]]
"""``grid[i][j]``: the device ids holding block (i, j) of a 2-D array."""

_CELL_MAX = (64, 40)  # pixels: the largest block drawn
_PANEL_MAX = (256, 192)  # pixels: the largest panel


def _grid_text(grid: Grid) -> str:
    return "\n".join(" ".join(f"[{device_label(cell)}]" for cell in row) for row in grid)


def _panel_svg(name: str, grid: Grid, x0: float, processes: Mapping[int, int] | None) -> str:
    rows, cols = len(grid), len(grid[0])
    w = min(_CELL_MAX[0], _PANEL_MAX[0] / cols)
    h = min(_CELL_MAX[1], _PANEL_MAX[1] / rows)
    out = [f'<text x="{x0}" y="14" font-size="13" font-weight="bold">{html.escape(name)}</text>']
    for i, row in enumerate(grid):
        for j, cell in enumerate(row):
            x, y = x0 + j * w, 22 + i * h
            devices = sorted(cell)
            label = device_label(devices)
            stripe = w / max(1, len(devices))
            out.append(
                f'<g class="labkit-block" data-block="{i},{j}" data-devices="{label}">'
                f"<title>block ({i}, {j}): devices {label}</title>"
            )
            for k, d in enumerate(devices):
                out.append(
                    f'<rect x="{x + k * stripe:.1f}" y="{y:.1f}" width="{stripe:.1f}" '
                    f'height="{h:.1f}" fill="{device_color(d)}"/>'
                )
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                'fill="none" stroke="white" stroke-width="2"/>'
            )
            if processes:
                owners = sorted({processes[d] for d in devices})
                label += " p" + ",".join(map(str, owners))
            size = min(12.0, 1.6 * w / max(3, len(label)))
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + size / 3:.1f}" font-size="{size:.1f}" '
                'text-anchor="middle" fill="#111" stroke="white" stroke-width="2.5" '
                f'paint-order="stroke">{label}</text></g>'
            )
    return "".join(out)


def layout_grids(
    panels: Mapping[str, Grid],
    title: str,
    *,
    processes: Mapping[int, int] | None = None,
    note: str = "",
) -> Picture:
    """Device grids side by side, one per array (``{"x (256, 512) P('x', None)": grid}``).

    Each block is drawn in the colours of the devices that hold it (one stripe each, when
    it is replicated) and labelled with their ids; with ``processes`` (device id -> process
    index) each label also names the processes. The caption lists every block's devices.
    """
    if not panels:
        raise ValueError("layout_grids needs at least one grid")
    x0, parts, said, devices = 0.0, [], [], set()
    for name, grid in panels.items():
        if not grid or not grid[0]:
            raise ValueError(f"grid {name!r} is empty: give grid[i][j] = device ids of block i, j")
        rows, cols = len(grid), len(grid[0])
        parts.append(_panel_svg(name, grid, x0, processes))
        x0 += max(cols * min(_CELL_MAX[0], _PANEL_MAX[0] / cols), 7.5 * len(name)) + 24
        devices |= {d for row in grid for cell in row for d in cell}
        copies = {len(cell) for row in grid for cell in row}
        held = "; ".join(
            f"row {i}: " + " | ".join(device_label(c) for c in row) for i, row in enumerate(grid)
        )
        each = f"each on {copies.pop()} device(s)" if len(copies) == 1 else "unevenly held"
        said.append(f"{name}: {rows} x {cols} blocks, {each} ({held})")
    height = 22 + max(len(g) * min(_CELL_MAX[1], _PANEL_MAX[1] / len(g)) for g in panels.values())
    legend_y = height + 18
    key = "device" + (" (p: process)" if processes else "")
    x = 8.0 * len(key) + 8
    legend = [f'<text x="0" y="{legend_y}" font-size="11">{key}</text>']
    for d in sorted(devices):
        legend.append(
            f'<rect x="{x:.0f}" y="{legend_y - 10}" width="12" height="12" '
            f'fill="{device_color(d)}"/><text x="{x + 15:.0f}" y="{legend_y}" '
            f'font-size="11">{d}</text>'
        )
        x += 22 + 7 * len(str(d))
    width = max(x0, x)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="labkit-grid" width="{width:.0f}" '
        f'height="{legend_y + 8:.0f}" font-family="sans-serif">{"".join(parts)}'
        f'<g class="labkit-legend">{"".join(legend)}</g></svg>'
    )
    text = "\n\n".join(f"{name}:\n{_grid_text(grid)}" for name, grid in panels.items())
    caption = (f"{note} " if note else "") + "; ".join(said) + "."
    return Picture(title, caption, svg=svg, text=text)
