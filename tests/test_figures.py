"""labkit.core.figures: each drawing's title, axis labels, elements and caption numbers."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from labkit.core import figures
from labkit.core.figures import Series


def test_numbers_as_captions_write_them() -> None:
    assert [figures.percent(f) for f in (0.957, 1.1, 8.1e-5)] == ["96%", "110%", "0.0081%"]
    assert [figures.number(x) for x in (989.0, 1979.0, 3350.0, 0.012345, 2.4e-7)] == [
        "989",
        "1979",
        "3350",
        "0.0123",
        "2.4e-07",
    ]
    assert figures.number(float("inf")) == "inf" and figures.number(8e10) == "8e+10"
    assert figures.size_text(80e9) == "80 GB" and figures.size_text(6.7e6) == "6.7 MB"
    assert figures.size_text(512) == "512 B"


def test_device_labels_join_runs() -> None:
    assert figures.device_label([0]) == "0"
    assert figures.device_label([4, 0]) == "0,4"
    assert figures.device_label([0, 1, 2, 3]) == "0-3"
    assert figures.device_label([0, 1, 5, 6, 7]) == "0,1,5-7"
    assert figures.device_color(3) == figures.device_color(3 + len(figures.COLORS))


def test_series_checks_lengths_and_captions_its_points() -> None:
    with pytest.raises(ValueError, match="one y"):
        Series("s", [1, 2], [1])
    with pytest.raises(ValueError, match="one name"):
        Series("s", [1, 2], [1, 2], names=["a"])
    short = Series("loss", [0, 1], [2.5, 1.25], names=["first", "second"])
    assert figures.series_caption(short) == "loss: 2.5 at first, 1.25 at second"
    unnamed = Series("count", [0, 65536], [26, 1])
    assert figures.series_caption(unnamed, "B") == "count: 26 at 0 B, 1 at 65536 B"
    long = Series("loss", list(range(30)), [5.0 - 0.1 * i for i in range(30)])
    said = figures.series_caption(long, "", "nats")
    assert said.startswith("loss: 30 points, 5 nats at 0 to 2.1 nats at 29")
    assert "(from 2.1 to 5)" in said


def test_picture_needs_a_title_a_caption_and_labelled_axes() -> None:
    fig, (ax,) = figures.new_figure()
    ax.plot([1, 2], [3, 4])
    with pytest.raises(ValueError, match="no x label"):
        figures.picture(fig, "t", "c")
    ax.set(xlabel="step", ylabel="loss")
    with pytest.raises(ValueError, match="title and a caption"):
        figures.picture(fig, "t", "")
    shown = figures.picture(fig, "A title", "Two points: 3 and 4.")
    assert shown.figure is not None and shown.figure.get_suptitle() == "A title"
    assert str(shown) == "A title\nTwo points: 3 and 4."


def test_a_picture_shows_as_one_html_figure_with_its_text(tmp_path: Path) -> None:
    fig, (ax,) = figures.new_figure()
    ax.plot([1, 2], [3, 4])
    ax.set(xlabel="x (s)", ylabel="y (B)")
    shown = figures.picture(fig, "Title", "Caption with 3 and 4.")
    bundle = shown._repr_mimebundle_()
    assert bundle["text/plain"] == "Title\nCaption with 3 and 4."
    page = bundle["text/html"]
    assert page.startswith('<figure class="labkit-figure"') and "<figcaption" in page
    data = re.search(r'src="data:image/png;base64,([^"]+)"', page)
    assert data is not None and base64.b64decode(data.group(1)).startswith(b"\x89PNG")
    assert "Caption with 3 and 4." in page
    assert shown.save(tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    assert "<svg" in shown.save(tmp_path / "p.svg").read_text()
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        shown.save(tmp_path / "p.jpg")


def test_show_outside_ipython_prints_the_text_form(capsys: pytest.CaptureFixture[str]) -> None:
    grid = figures.layout_grids({"x": [[(0,), (1,)]]}, "Two blocks")
    grid.show()
    out = capsys.readouterr().out
    assert out.startswith("Two blocks\nx:\n[0] [1]\n") and "1 x 2 blocks" in out
    with pytest.raises(ValueError, match="SVG picture"):
        grid.png()


def test_sweep_draws_one_panel_per_label_and_captions_every_point() -> None:
    counts = [Series("all-reduce", [0, 64, 1024], [26, 4, 1])]
    sizes = [Series("all-reduce", [0, 64, 1024], [100.0, 650.0, 2600.0])]
    shown = figures.sweep(
        "Thresholds",
        "threshold (bytes)",
        {"collectives": counts, "mean bytes": sizes},
        xscale="symlog",
        x_unit="B",
        y_units={"mean bytes": "B"},
        note="A note.",
    )
    assert shown.figure is not None
    left, right = shown.figure.axes
    assert shown.figure.get_suptitle() == "Thresholds"
    assert (left.get_xlabel(), left.get_ylabel(), right.get_ylabel()) == (
        "threshold (bytes)",
        "collectives",
        "mean bytes",
    )
    assert len(left.lines) == 1 and list(left.lines[0].get_ydata()) == [26, 4, 1]
    assert shown.caption == (
        "A note. collectives: all-reduce: 26 at 0 B, 4 at 64 B, 1 at 1024 B. "
        "mean bytes: all-reduce: 100 B at 0 B, 650 B at 64 B, 2600 B at 1024 B."
    )
    assert figures.overlapping_labels(shown.figure) == []  # draws the figure
    assert [t.get_text() for t in left.get_xticklabels()] == ["0", "100 B"]  # bytes, no TeX
    assert all(t.get_text().endswith((" B", "kB", "0")) for t in right.get_yticklabels())


def test_sweep_names_points_and_joins_names_on_one_spot() -> None:
    bits = Series("error", [10, 10, 7], [3e-4, 3e-4, 2e-3], names=["TF32", "float16", "bf16"])
    shown = figures.sweep("Errors", "mantissa bits", {"error": [bits]}, yscale="log")
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert sorted(t.get_text() for t in ax.texts) == ["TF32, float16", "bf16"]
    assert ax.get_yscale() == "log"
    assert "0.0003 at TF32, 0.0003 at float16, 0.002 at bf16" in shown.caption
    with pytest.raises(ValueError, match="at least one panel"):
        figures.sweep("t", "x", {})


def test_bars_draw_values_and_ranges_with_reference_lines() -> None:
    shown = figures.bars(
        "Step time",
        {"dp/f32": (100.0, 250.0), "fsdp/f32": (120.0, 300.0)},
        "predicted step (us)",
        "configuration",
        unit="us",
        lines={"limit": 280.0},
    )
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert len(ax.patches) == 2 and [p.get_x() for p in ax.patches] == [100.0, 120.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dp/f32", "fsdp/f32"]
    assert shown.caption == "dp/f32 100-250 us; fsdp/f32 120-300 us; limit at 280 us."
    assert ax.get_xlim() == pytest.approx((90.0, 310.0))  # ranges where they lie, padded
    ends = [ln for ln in ax.lines if ln.get_marker() == "|"]
    assert [list(ln.get_xdata()) for ln in ends] == [[100.0, 250.0], [120.0, 300.0]]
    flat = figures.bars("Time", {"a": (188.0, 188.0)}, "us", "config", unit="us")
    assert flat.figure is not None and flat.caption == "a 188-188 us."
    assert len(flat.figure.axes[0].lines) == 1  # a zero-width range still shows its ends
    plain = figures.bars("Time", {"a": 2.0, "b": 4.0}, "ms", "op", unit="ms")
    assert plain.caption == "a 2 ms; b 4 ms." and plain.figure is not None
    assert plain.figure.axes[0].get_xlim() == pytest.approx((0.0, 4.2))  # bars from zero
    with pytest.raises(ValueError, match="at least one"):
        figures.bars("t", {}, "x", "y")


def test_stacked_bars_stack_the_parts_and_share_each_capacity() -> None:
    parts = {
        "dp": {"arguments": 1.6e6, "outputs not in place": 0.1e6, "temporaries": 5e6},
        "fsdp": {"arguments": 0.3e6, "outputs not in place": 0.1e6, "temporaries": 6e6},
    }
    shown = figures.stacked_bars(
        "Memory", parts, "strategy", capacities={"H100 80 GB": 80e9, "limit": 7e6}
    )
    assert shown.figure is not None
    left, right = shown.figure.axes
    assert len(left.patches) == 6 and len(right.patches) == 2  # 3 parts x 2; one whole each
    assert right.get_xscale() == "log" and left.get_xlabel() == "MB per device"
    widths = [p.get_width() for p in left.patches]
    assert widths == pytest.approx([1.6, 0.3, 0.1, 0.1, 5.0, 6.0])
    assert [ln.get_xdata()[0] for ln in right.lines] == [80e9, 7e6]  # the capacities
    assert shown.caption == (
        "dp: arguments 1.6 + outputs not in place 0.1 + temporaries 5 = 6.7 MB "
        "(0.0084% of H100 80 GB, 96% of limit); fsdp: arguments 0.3 + outputs not in place 0.1 "
        "+ temporaries 6 = 6.4 MB (0.008% of H100 80 GB, 91% of limit)."
    )
    ticks = [t.get_text() for t in right.get_xticklabels()]
    assert "100 GB" in ticks or "10 GB" in ticks
    assert figures.overlapping_labels(shown.figure) == []


def test_roofline_draws_the_roofs_meeting_at_their_ridges() -> None:
    assert figures.ridge(989.0, 3350.0) == pytest.approx(295.22, abs=0.01)
    with pytest.raises(ValueError, match="positive"):
        figures.ridge(0.0, 3350.0)
    points = [Series("matmul", [21.3, 42.7], [0.01, 0.03], names=["n=128", "n=256"])]
    shown = figures.roofline(
        "Roofline",
        {"bf16": 989.0, "fp8": 1979.0},
        ("HBM", 3350.0),
        points,
        measured_roofs={"this CPU": 0.03},
    )
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert ax.get_xlabel() == "arithmetic intensity (FLOPs per byte)"
    assert ax.get_ylabel() == "TFLOP/s"
    labels = [ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")]
    assert labels == ["HBM 3350 GB/s", "bf16", "fp8", "this CPU", "matmul"]
    bf16 = next(ln for ln in ax.lines if ln.get_label() == "bf16")
    assert bf16.get_xdata()[0] == pytest.approx(295.22, abs=0.01)  # starts at its ridge
    assert "bf16 989 TFLOP/s (ridge at 295 FLOPs/byte)" in shown.caption
    assert "fp8 1979 TFLOP/s (ridge at 591 FLOPs/byte)" in shown.caption
    assert "this CPU 0.03 TFLOP/s" in shown.caption
    assert "matmul: 0.01 TFLOP/s at n=128, 0.03 TFLOP/s at n=256" in shown.caption
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert all(re.fullmatch(r"1(0*)", t) for t in ticks), ticks  # whole decades, plain
    assert figures.overlapping_labels(shown.figure) == []


def test_layout_grids_draw_one_stripe_per_holder_and_list_every_block() -> None:
    rows = [[(0,), (1,)], [(2,), (3,)]]
    replicated = [[(0, 2), (1, 3)]]
    shown = figures.layout_grids(
        {"x (4, 4)": rows, "w (4, 4)": replicated}, "Layouts", processes={0: 0, 1: 0, 2: 1, 3: 1}
    )
    svg = shown.svg
    assert svg.startswith("<svg") and svg.count('class="labkit-block"') == 6
    # one fill per holding device: 4 blocks x 1 + 2 blocks x 2, then 4 legend swatches
    fills = re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"', svg)
    assert len(fills) == 4 + 4 + 4
    assert fills[:4] == [figures.device_color(d) for d in range(4)]
    assert re.findall(r'data-devices="([^"]+)"', svg) == ["0", "1", "2", "3", "0,2", "1,3"]
    assert ">0,2 p0,1</text>" in svg  # replicated over both processes
    assert shown.text == "x (4, 4):\n[0] [1]\n[2] [3]\n\nw (4, 4):\n[0,2] [1,3]"
    assert shown.caption == (
        "x (4, 4): 2 x 2 blocks, each on 1 device(s) (row 0: 0 | 1; row 1: 2 | 3); "
        "w (4, 4): 1 x 2 blocks, each on 2 device(s) (row 0: 0,2 | 1,3)."
    )
    html = shown._repr_html_()
    assert "<svg" in html and "<b>Layouts.</b>" in html
    with pytest.raises(ValueError, match="empty"):
        figures.layout_grids({"x": []}, "t")


def test_log_ticks_write_decades_plainly_or_as_powers() -> None:
    fig, (ax,) = figures.new_figure()
    ax.loglog([1e-40, 1e30], [1e-3, 1e3])
    ax.set(xlabel="|x|", ylabel="gap")
    figures.log_ticks(ax.xaxis)
    figures.log_ticks(ax.yaxis)
    fig.canvas.draw()  # type: ignore[no-untyped-call]
    x = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    y = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert all(re.fullmatch(r"1e-?\d+", t) for t in x), x
    assert "0.01" in y and "100" in y, y
    assert figures.overlapping_labels(fig) == []


def test_curves_draw_values_against_their_index_in_distinct_styles() -> None:
    shown = figures.curves("Loss", "step", "loss (nats)", {"a": [3.0, 2.0], "b": [3.0, 2.5]})
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert [ln.get_linestyle() for ln in ax.lines] == ["-", "--"]
    assert list(ax.lines[1].get_xdata()) == [0.0, 1.0]
    assert shown.caption == "a: 3 at 0, 2 at 1; b: 3 at 0, 2.5 at 1."
