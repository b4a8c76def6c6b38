"""``meshconf render`` of levels above the node, on generated configs: one outline per unit
that holds exactly its unit's cells, a wrap that makes units rectangles, headers that never
overlap in the font the picture names, and colours that readers with colour blindness tell
apart."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET
from functools import cache

import pytest
from hypothesis import given, settings, strategies as st
from matplotlib import font_manager, ft2font

from meshconf import load_config
from meshconf.core.levels import NODE
from meshconf.features.render.grid import repeated_units
from meshconf.features.render.shapes import (
    _DIM_COLOURS,
    CELL_FILL,
    LEVEL_STROKES,
    NODE_STROKE,
    dim_colours,
    text_width,
)
from meshconf.model.config import MeshConfig
from meshconf.render import render_svg

SVG = "{http://www.w3.org/2000/svg}"
Segment = tuple[float, float, float, float]


def draw(config: MeshConfig, domain: str, rank: int = 0) -> ET.Element:
    above = tuple(level for level in config.topology if level.name != NODE)
    svg = render_svg(config.layouts[domain], rank, config.node_size)
    if above:  # render_svg draws nodes only; the levels go through draw_domain
        from meshconf.render import draw_domain, to_svg

        svg = to_svg(draw_domain(config.layouts[domain], rank, config.node_size, above))
    return ET.fromstring(svg)


def segments_of(path: ET.Element) -> list[Segment]:
    found = []
    for part in path.get("d", "").split("M")[1:]:
        start, end = part.split("L")
        x1, y1 = map(float, start.split())
        x2, y2 = map(float, end.split())
        found.append((x1, y1, x2, y2))
    return found


def inside(point: tuple[float, float], segments: list[Segment]) -> bool:
    """Whether ``point`` lies inside the closed outline the axis-aligned ``segments`` draw:
    a ray to the right crosses its vertical sides an odd number of times."""
    x, y = point
    crossings = 0
    for x1, y1, x2, y2 in segments:
        if x1 == x2 and x1 > x and min(y1, y2) <= y < max(y1, y2):
            crossings += 1
    return crossings % 2 == 1


def cell_centres(root: ET.Element) -> list[tuple[int, tuple[float, float]]]:
    """(first rank, centre) of every cell."""
    found = []
    for rect in root.iter(f"{SVG}rect"):
        if "cell" not in rect.get("class", "").split():
            continue
        first = int((rect.get("data-rank") or rect.get("data-ranks", "")).split("-")[0])
        x, y = float(rect.get("x", 0)), float(rect.get("y", 0))
        width, height = float(rect.get("width", 0)), float(rect.get("height", 0))
        found.append((first, (x + width / 2, y + height / 2)))
    return found


def check_outlines(root: ET.Element, css_class: str, size: int, world_size: int) -> None:
    """Every unit of ``size`` ranks has one outline, and each cell lies inside its own unit's
    outline and no other's."""
    paths = [path for path in root.iter(f"{SVG}path") if path.get("class") == css_class]
    units = {int(path.get("data-unit", "-1")): segments_of(path) for path in paths}
    assert len(paths) == len(units) == -(-world_size // size)
    boxes = {
        unit: (
            min(min(s[0], s[2]) for s in segments),
            max(max(s[0], s[2]) for s in segments),
            min(min(s[1], s[3]) for s in segments),
            max(max(s[1], s[3]) for s in segments),
        )
        for unit, segments in units.items()
    }
    for first, centre in cell_centres(root):
        own = first // size
        assert inside(centre, units[own]), (css_class, first)
        for unit, (left, right, top, bottom) in boxes.items():
            if unit != own and left < centre[0] < right and top < centre[1] < bottom:
                assert not inside(centre, units[unit]), (css_class, first, unit)


@st.composite
def level_configs(draw_: st.DrawFn) -> dict[str, object]:
    """A world of pp, dp_shard, tp and, for experts, ep, on nodes and one or two levels
    above them whose sizes are multiples of the level below."""
    tp = draw_(st.sampled_from([1, 2, 4, 8]))
    pp = draw_(st.sampled_from([1, 2, 4]))
    dp_shard = draw_(st.sampled_from([2, 3, 4, 6, 8, 9, 16, 18, 24, 36, 72]))
    world = pp * dp_shard * tp
    node = draw_(st.sampled_from([size for size in (2, 4, 8) if world % size == 0] or [1]))
    multiples = [m for m in (2, 3, 4, 6, 8, 9, 16, 18) if world % (node * m) == 0]
    levels = [{"name": NODE, "size": node}]
    if multiples:
        first = draw_(st.sampled_from(multiples))
        levels.append({"name": "nvlink", "size": node * first})
        further = [m for m in (2, 3, 4) if world % (node * first * m) == 0]
        if further and draw_(st.booleans()):
            levels.append({"name": "pod", "size": node * first * draw_(st.sampled_from(further))})
    ep = draw_(st.sampled_from([e for e in (1, 2, 4, 8) if (dp_shard * tp) % e == 0]))
    return {
        "world_size": world,
        "levels": levels,
        "degrees": {"pp": pp, "dp_shard": dp_shard, "tp": tp, "ep": ep},
    }


@settings(max_examples=40, deadline=None)
@given(level_configs(), st.sampled_from(["dense", "sparse", "dataloading"]))
def test_every_unit_of_every_level_is_one_outline_around_its_cells(
    data: dict[str, object], domain: str
) -> None:
    config = load_config(data)
    if domain not in config.layouts:
        domain = "dense"
    root = draw(config, domain)
    world_size = config.resolved_world_size
    assert world_size is not None
    # a level whose units are single GPUs, or another level's units, is not outlined
    above = tuple(level for level in config.topology if level.name != NODE)
    node = next((level.size for level in config.topology if level.name == NODE), None)
    repeated = repeated_units(node, above)
    for level in config.topology:
        if level.name in repeated:
            continue
        css_class = NODE if level.name == NODE else f"level-{level.name}"
        check_outlines(root, css_class, level.size, world_size)


def nvl72(domain: str) -> ET.Element:
    config = load_config(
        {
            "world_size": 1152,
            "levels": [{"name": "node", "size": 4}, {"name": "nvlink", "size": 72}],
            "degrees": {"pp": 4, "tp": 4, "ep": 8},
        }
    )
    return draw(config, domain)


@pytest.mark.parametrize("domain", ["dense", "sparse"])
def test_racks_of_72_are_16_rectangles_each_with_its_index(domain: str) -> None:
    root = nvl72(domain)
    paths = [p for p in root.iter(f"{SVG}path") if p.get("class") == "level-nvlink"]
    assert len(paths) == 16
    for path in paths:
        segments = segments_of(path)
        assert len(segments) == 4  # one rectangle: the wrap keeps a rack in one block
    tabs = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "level-nvlink tab"]
    assert tabs == [f"nvlink {unit}" for unit in range(16)]
    check_outlines(root, "level-nvlink", 72, 1152)
    check_outlines(root, NODE, 4, 1152)


# --- headers -------------------------------------------------------------------------------


@cache
def _font() -> ft2font.FT2Font:
    return ft2font.FT2Font(font_manager.findfont("DejaVu Sans"))


def rendered_width(text: str, size: float, hinted: bool = True) -> float:
    """The width ``text`` takes at ``size`` pixels as FreeType lays it out in DejaVu Sans:
    hinted, glyphs snapped to whole pixels as matplotlib draws the PNG (a little wider), or
    not, as a scalable viewer draws the SVG."""
    font = _font()
    font.set_size(size, 72)
    flags = ft2font.LoadFlags.FORCE_AUTOHINT if hinted else ft2font.LoadFlags.NO_HINTING
    font.set_text(text, 0.0, flags=flags)
    return float(font.get_width_height()[0]) / 64


def test_text_widths_are_dejavu_sans_own() -> None:
    for text in ["ep=0", "dp_replicate=15", "fsdp+36", "nvlink 3", "0123456789"]:
        expected = rendered_width(text, 12.0, hinted=False)
        assert text_width(text, 12.0) == pytest.approx(expected, abs=1.0)


def overlapping_headers(root: ET.Element) -> list[tuple[str, str]]:
    boxes = []
    for text in root.iter(f"{SVG}text"):
        if text.get("class") != "header":
            continue
        size, x, y = (float(text.get(key, 0)) for key in ("font-size", "x", "y"))
        width = rendered_width(text.text or "", size)
        anchor = text.get("text-anchor")
        left = x - width / 2 if anchor == "middle" else x - width if anchor == "end" else x
        boxes.append((text.text or "", left, left + width, y - size / 2, y + size / 2))
    return [
        (a[0], b[0])
        for a, b in itertools.combinations(boxes, 2)
        if a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]
    ]


@settings(max_examples=40, deadline=None)
@given(level_configs(), st.sampled_from(["dense", "sparse", "dataloading", "loss"]))
def test_no_two_headers_overlap(data: dict[str, object], domain: str) -> None:
    config = load_config(data)
    if domain not in config.layouts:
        domain = "dense"
    assert overlapping_headers(draw(config, domain)) == []


@pytest.mark.parametrize("domain", ["dense", "sparse"])
def test_the_headers_of_racks_of_72_do_not_run_together(domain: str) -> None:
    root = nvl72(domain)
    headers = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "header"]
    assert ("ep=0" in headers) == (domain == "sparse")
    assert overlapping_headers(root) == []


# --- colours -------------------------------------------------------------------------------

# Machado, Oliveira and Fernandes, "A Physiologically-based Model for Simulation of Color
# Vision Deficiency" (IEEE TVCG 2009), severity 1.0, applied to linear RGB.
_DEFICIENCIES = {
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
    "typical": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
}
#: The least CIE 1976 colour difference (Delta E) two colours of one picture keep under each
#: simulation; 2.3 is a just noticeable difference, and 10 or more reads as another colour.
_LEAST_DIFFERENCE = 15.0


def _lab(colour: str, deficiency: str) -> tuple[float, float, float]:
    def linear(channel: int) -> float:
        c = channel / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    rgb = [linear(int(colour[i : i + 2], 16)) for i in (1, 3, 5)]
    seen = [
        min(1.0, max(0.0, sum(m * c for m, c in zip(row, rgb, strict=True))))
        for row in _DEFICIENCIES[deficiency]
    ]
    r, g, b = seen
    xyz = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    fx, fy, fz = (t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def least_difference(colours: list[str]) -> float:
    return min(
        math.dist(_lab(a, kind), _lab(b, kind))
        for a, b in itertools.combinations(colours, 2)
        for kind in _DEFICIENCIES
    )


@pytest.mark.parametrize(
    "dims",
    [
        ["pp", "batch", "cp", "tp"],
        ["pp", "dp_replicate", "fsdp", "tp"],
        ["pp", "dp_replicate", "efsdp", "ep", "etp"],
        ["pp", "loss", "tp"],
    ],
)
def test_each_default_domain_s_dims_stay_apart_for_colour_blind_readers(dims: list[str]) -> None:
    fills = list(dim_colours(dims).values())
    assert least_difference([*fills, CELL_FILL]) >= _LEAST_DIFFERENCE


def test_the_outlines_stay_apart_from_every_fill_and_each_other() -> None:
    fills = sorted(set(_DIM_COLOURS.values()) | {CELL_FILL})
    outlines = [NODE_STROKE, *LEVEL_STROKES[:3]]
    for outline in outlines:
        for fill in fills:
            assert least_difference([outline, fill]) >= _LEAST_DIFFERENCE, (outline, fill)
    assert least_difference(outlines) >= _LEAST_DIFFERENCE


def test_any_dims_of_one_picture_take_different_colours() -> None:
    names = ["tp", "ep", "fsdp", "efsdp", "cp", "mine", "yours"]
    colours = dim_colours(names)
    assert len(set(colours.values())) == len(names)
    assert colours["tp"] == _DIM_COLOURS["tp"] and colours["fsdp"] == _DIM_COLOURS["fsdp"]


# --- levels whose units are already drawn --------------------------------------------------


def svg_text(config: MeshConfig, domain: str) -> str:
    from meshconf.render import draw_domain, to_svg

    above = tuple(level for level in config.topology if level.name != NODE)
    return to_svg(draw_domain(config.layouts[domain], 0, config.node_size, above))


def shapes_of(root: ET.Element) -> list[ET.Element]:
    return [
        element for element in root.iter() if element.tag[len(SVG) :] in ("rect", "path", "text")
    ]


@st.composite
def with_repeated_levels(
    draw_: st.DrawFn,
) -> tuple[dict[str, object], dict[str, object], dict[str, str]]:
    """A config of :func:`level_configs`, the same with levels whose units are one GPU, one
    node or an inner level's mixed in, and what each added level's unit is."""
    data = draw_(level_configs())
    levels: list[dict[str, object]] = list(data["levels"])  # type: ignore[call-overload]
    added: dict[str, str] = {}
    mixed: list[dict[str, object]] = []
    for index in range(draw_(st.integers(0, 3))):
        mixed.append({"name": f"gpu{index}", "size": 1})
        added[f"gpu{index}"] = "one GPU"
    for level in levels:
        mixed.append(level)
        for index in range(draw_(st.integers(0, 2))):
            name = f"{level['name']}_again{index}"
            mixed.append({"name": name, "size": level["size"]})
            if level["size"] == 1:
                added[name] = "one GPU"  # a unit of one GPU, whatever the level
            elif level["name"] == NODE:
                added[name] = "one node"
            else:
                added[name] = f"one {level['name']} domain"
    return data, {**data, "levels": mixed}, added


@settings(max_examples=30, deadline=None)
@given(with_repeated_levels(), st.sampled_from(["dense", "sparse"]))
def test_levels_whose_units_are_drawn_add_one_legend_line_and_no_outline(
    configs: tuple[dict[str, object], dict[str, object], dict[str, str]], domain: str
) -> None:
    plain, mixed, added = configs
    without, with_ = load_config(plain), load_config(mixed)
    if domain not in without.layouts:
        domain = "dense"
    text_without, text_with = svg_text(without, domain), svg_text(with_, domain)
    root_without, root_with = ET.fromstring(text_without), ET.fromstring(text_with)

    def outlines(root: ET.Element) -> list[tuple[str | None, str | None, str | None]]:
        return [(p.get("class"), p.get("stroke"), p.get("d")) for p in root.iter(f"{SVG}path")]

    assert outlines(root_with) == outlines(root_without)
    assert len(shapes_of(root_with)) == len(shapes_of(root_without)) + len(added)
    # the legend line and the title's mention of each added level, and no more
    assert len(text_with) - len(text_without) <= 260 * len(added)
    legend = [t.text or "" for t in root_with.iter(f"{SVG}text") if t.get("class") == "legend"]
    world = with_.resolved_world_size
    assert world is not None
    for level in with_.topology:
        if level.name in added:
            units = world // level.size
            domains = f"{units} {level.name} domain{'s' if units > 1 else ''}"
            gpus = f"{level.size} GPU{'s' if level.size > 1 else ''}"
            line = f"{domains} of {gpus}; not outlined: each is {added[level.name]}"
            assert line in legend


def test_sixteen_levels_of_one_gpu_draw_no_outline() -> None:
    levels = [{"name": NODE, "size": 1}, *({"name": f"l{i}", "size": 1} for i in range(15))]
    degrees = {"tp": 8, "dp_shard": 512}
    config = load_config({"world_size": 4096, "levels": levels, "degrees": degrees})
    bare = load_config({"world_size": 4096, "degrees": degrees})
    text, bare_text = svg_text(config, "dense"), svg_text(bare, "dense")
    root = ET.fromstring(text)
    assert list(root.iter(f"{SVG}path")) == []
    assert len(shapes_of(root)) == len(shapes_of(ET.fromstring(bare_text))) + 15
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert "4096 nodes of 1 GPU; not outlined: each is one GPU" in legend
    assert "4096 l14 domains of 1 GPU; not outlined: each is one GPU" in legend
    assert len(text) < len(bare_text) + 16 * 260
