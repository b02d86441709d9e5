"""labkit.core.lanes: lane charts as SVG, on one time axis, with a caption as their text."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from labkit.core.lanes import Bar, Bracket, Panel, Style, nice_ticks, render

SVG = "{http://www.w3.org/2000/svg}"
STYLES = {"a": Style("#123456", "kind a"), "b": Style("#654321", "kind b", hatch=True)}


def _panel(title: str, end: float) -> Panel:
    bars = (Bar("x", 0.0, end / 2, "a", "first", "first: half"), Bar("y", end / 2, end, "b"))
    return Panel(title, ("x", "y"), bars, (Bracket("x", 0.0, end, "all", "the whole"),))


def test_nice_ticks_cover_the_end_in_round_steps() -> None:
    assert nice_ticks(218.9) == [0, 50, 100, 150, 200, 250]
    assert nice_ticks(7.0) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert nice_ticks(0.0) == [0.0, 1.0]
    assert len(nice_ticks(123456.0)) <= 8


def test_render_is_svg_with_titles_tooltips_legend_and_one_axis() -> None:
    svg = render([_panel("top", 100.0), _panel("bottom", 40.0)], STYLES, unit="us")
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag == f"{SVG}svg"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "top" in texts and "bottom" in texts and "time (us)" in texts
    assert "kind a" in texts and "kind b" in texts  # the legend names each style used
    assert texts.count("100") == 1  # one shared axis, to the latest end of both panels
    tips = [t.text for t in root.iter(f"{SVG}title")]
    assert "first: half" in tips and "the whole" in tips
    assert 'id="h-b"' in svg and "url(#h-b)" in svg  # the hatched style has its pattern
    assert "script" not in svg and "http" not in svg.replace("http://www.w3.org/2000/svg", "")


def test_the_same_scale_for_every_panel() -> None:
    svg = render([_panel("long", 100.0), _panel("short", 50.0)], STYLES)
    rects = [r for r in ET.fromstring(svg).iter(f"{SVG}rect") if r.get("fill") == "#123456"]
    widths = [float(r.get("width", 0)) for r in rects]  # the "a" bars: half of each panel
    assert widths[0] == pytest.approx(2 * widths[1], rel=0.01)


def test_narrow_touching_bars_merge_and_say_how_many() -> None:
    bars = tuple(Bar("x", i * 0.001, (i + 1) * 0.001, "a", f"k{i}") for i in range(50))
    wide = Bar("x", 0.05, 100.0, "b", "wide")
    svg = render([Panel("p", ("x",), (*bars, wide))], STYLES)
    assert "50 bars, 0.05 us in all" in svg
    assert svg.count('fill="#123456"') == 1 + 1  # the merged bar and its legend swatch


def test_unknown_style_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"styles \['c'\] that are not in styles"):
        render([Panel("p", ("x",), (Bar("x", 0, 1, "c"),))], STYLES)
