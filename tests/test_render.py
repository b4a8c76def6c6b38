"""``meshconf render`` and ``meshconf.render``: the picture of a domain's rank grid."""

from __future__ import annotations

import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from conftest import REPO, TEXTBOOK

from meshconf import load_config
from meshconf.cli import main
from meshconf.core.layout import DimLayout, DomainLayout, LayoutError, Mode
from meshconf.features.render.grid import FULL_LIMIT, SUMMARY_CELLS
from meshconf.features.render.shapes import Rect
from meshconf.render import Drawing, draw_domain, render_svg, to_png, to_svg

SVG = "{http://www.w3.org/2000/svg}"


NO_WORLD = """\
degrees: {tp: 8, dp_shard: -1}
"""


def textbook() -> DomainLayout:
    return DomainLayout.row_major("textbook", [("dp_replicate", 8), ("pp", 4), ("tp", 8)])


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def cells(root: ET.Element) -> list[ET.Element]:
    return [rect for rect in root.iter(f"{SVG}rect") if "cell" in rect.get("class", "").split()]


def with_class(elements: list[ET.Element], css_class: str) -> list[ET.Element]:
    return [e for e in elements if css_class in e.get("class", "").split()]


def rank_labels(root: ET.Element) -> list[str]:
    return [text.text or "" for text in root.iter(f"{SVG}text") if text.get("class") == "rank"]


def node_outlines(root: ET.Element) -> list[ET.Element]:
    return [path for path in root.iter(f"{SVG}path") if path.get("class") == "node"]


# --- the drawing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sizes",
    [
        [("fsdp", 8)],
        [("pp", 1), ("dp_replicate", 2), ("fsdp", 4), ("tp", 8)],
        [("dp_replicate", 8), ("pp", 4), ("tp", 8)],
        [("pp", 4), ("fsdp", 128), ("tp", 8)],
    ],
)
def test_one_cell_and_one_label_per_rank(sizes: list[tuple[str, int]]) -> None:
    layout = DomainLayout.row_major("dense", sizes)
    root = parse(render_svg(layout, 0, 8))
    ranks = sorted(int(cell.get("data-rank", "-1")) for cell in cells(root))
    assert ranks == list(range(layout.world_size))
    labels = rank_labels(root)
    if labels:  # labels are dropped only where cells are too small to read them
        assert sorted(map(int, labels)) == list(range(layout.world_size))
    if layout.world_size <= 256:
        assert len(labels) == layout.world_size


@pytest.mark.parametrize("rank", [0, 37, 255])
def test_the_highlighted_cells_are_the_layouts_groups(rank: int) -> None:
    layout = textbook()
    root = parse(render_svg(layout, rank, 8))
    for dim in layout.dim_names:
        highlighted = with_class(cells(root), f"group-{dim}")
        assert sorted(int(cell.get("data-rank", "-1")) for cell in highlighted) == sorted(
            layout.group(rank, dim)
        )
    (selected,) = with_class(cells(root), "selected")
    assert selected.get("data-rank") == str(rank)


def test_group_cells_take_their_dims_colour_and_the_rank_is_dark() -> None:
    root = parse(render_svg(textbook(), 37, 8))
    tp_cells = with_class(cells(root), "group-tp")
    fills = {cell.get("fill") for cell in tp_cells if "selected" not in cell.get("class", "")}
    assert len(fills) == 1
    (selected,) = with_class(cells(root), "selected")
    assert selected.get("fill") == "#222222"


def test_one_outline_per_node() -> None:
    root = parse(render_svg(textbook(), 0, 8))
    assert len(node_outlines(root)) == 256 // 8
    root = parse(render_svg(textbook(), 0, 32))
    assert len(node_outlines(root)) == 256 // 32


def test_no_outlines_without_gpus_per_node() -> None:
    root = parse(render_svg(textbook(), 0, None))
    assert node_outlines(root) == []
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert "nodes: unknown (set gpus_per_node or pass --gpus-per-node)" in legend


def test_a_node_inside_one_row_is_one_closed_rectangle() -> None:
    # tp=8 along x, one node per row: each outline is the 4 sides of the row of 8 cells.
    root = parse(render_svg(textbook(), 0, 8))
    for outline in node_outlines(root):
        segments = outline_segments(outline)
        assert len(segments) == 4
        xs = {x for x1, _, x2, _ in segments for x in (x1, x2)}
        ys = {y for _, y1, _, y2 in segments for y in (y1, y2)}
        assert len(xs) == len(ys) == 2


def outline_segments(outline: ET.Element) -> list[tuple[float, float, float, float]]:
    """The ``Mx1 y1Lx2 y2`` segments of an outline's path."""
    segments = []
    for part in outline.get("d", "").split("M")[1:]:
        start, end = part.split("L")
        x1, y1 = map(float, start.split())
        x2, y2 = map(float, end.split())
        segments.append((x1, y1, x2, y2))
    return segments


def test_a_node_split_by_a_block_gap_is_one_outline_around_the_gap() -> None:
    # 64 GPUs per node: tp=8 along x, pp=4 then dp_replicate along y, so a node is two
    # dp_replicate blocks of 4 rows, one above the other with a gap between them. The node is
    # one rectangle whose sides go past the gap: 4 segments, 2 distinct x and 2 distinct y.
    root = parse(render_svg(textbook(), 0, 64))
    outlines = node_outlines(root)
    assert len(outlines) == 256 // 64
    for outline in outlines:
        segments = outline_segments(outline)
        assert len(segments) == 4
        assert len({y1 for x1, y1, x2, y2 in segments if y1 == y2}) == 2


def test_the_legend_names_each_dim_with_size_stride_and_node_locality() -> None:
    root = parse(render_svg(textbook(), 0, 8))
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert legend == [
        "rank 0: dp_replicate=0 pp=0 tp=0",
        "dp_replicate: size 8, stride 32, 32 groups, inter-node; coloured: rank 0's group",
        "pp: size 4, stride 8, 64 groups, inter-node; coloured: rank 0's group",
        "tp: size 8, stride 1, 32 groups, intra-node; coloured: rank 0's group",
        "outlined: 32 nodes of 8 GPUs",
    ]


def test_headers_label_blocks_with_their_coordinate() -> None:
    layout = DomainLayout.row_major("dense", [("dp_replicate", 2), ("fsdp", 2), ("tp", 2)])
    root = parse(render_svg(layout, 5, None))
    headers = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "header"]
    for label in ["tp=0", "tp=1", "fsdp=0", "fsdp=1", "dp_replicate=0", "dp_replicate=1"]:
        assert label in headers


def test_text_is_escaped() -> None:
    layout = DomainLayout.row_major("a<b&c", [("tp", 2)])
    svg = render_svg(layout)
    assert "a&lt;b&amp;c" in svg
    parse(svg)


def test_multi_mode_dims_are_drawn_in_rank_order() -> None:
    # 16 ranks, a dim 'inner' of modes (2, 8), (2, 2): groups such as [0, 2, 8, 10].
    layout = DomainLayout(
        "split",
        16,
        (
            DimLayout("outer", (Mode(2, 4), Mode(2, 1))),
            DimLayout("inner", (Mode(2, 8), Mode(2, 2))),
        ),
    )
    root = parse(render_svg(layout, 0, 4))
    highlighted = with_class(cells(root), "group-inner")
    assert sorted(int(c.get("data-rank", "-1")) for c in highlighted) == [0, 2, 8, 10]
    assert len(node_outlines(root)) == 4


def test_a_single_rank() -> None:
    layout = DomainLayout.row_major("dense", [("pp", 1), ("tp", 1)])
    root = parse(render_svg(layout, 0, 8))
    assert [cell.get("data-rank") for cell in cells(root)] == ["0"]
    assert len(node_outlines(root)) == 1


def test_bad_arguments() -> None:
    with pytest.raises(LayoutError, match=r"rank 256 is outside the world \[0, 256\)"):
        draw_domain(textbook(), 256)
    with pytest.raises(ValueError, match="gpus_per_node must be >= 1, got 0"):
        draw_domain(textbook(), 0, 0)


# --- summaries of large worlds -------------------------------------------------------------


def test_up_to_the_limit_every_rank_has_its_cell() -> None:
    layout = DomainLayout.row_major("dense", [("pp", 4), ("fsdp", FULL_LIMIT // 32), ("tp", 8)])
    drawing = draw_domain(layout, 0, 8)
    assert drawing.ranks_per_cell == 1
    assert drawing.cells == FULL_LIMIT


def test_65536_ranks_are_summarised_small() -> None:
    layout = DomainLayout.row_major(
        "dense", [("pp", 8), ("dp_replicate", 4), ("fsdp", 256), ("tp", 8)]
    )
    drawing = draw_domain(layout, 1234, 8)
    svg = to_svg(drawing)
    assert len(svg.encode()) < 200_000
    assert drawing.cells <= SUMMARY_CELLS
    assert drawing.ranks_per_cell == 128  # tp=8 and 16 of fsdp's 256
    root = parse(svg)
    summary = [t.text or "" for t in root.iter(f"{SVG}text") if (t.text or "").startswith("summ")]
    assert summary == [
        "summary: 65536 ranks is more than 4096; each cell is 128 consecutive ranks "
        "(tp=8 x 16 of fsdp=256), labelled with its first rank"
    ]
    # Rank 1234's cell holds ranks 1152-1279; its pp group passes through 8 cells.
    (selected,) = with_class(cells(root), "selected")
    assert selected.get("data-ranks") == "1152-1279"
    pp_cells = with_class(cells(root), "group-pp")
    starts = sorted(int(c.get("data-ranks", "").split("-")[0]) for c in pp_cells)
    assert starts == [1152 + 8192 * k for k in range(8)]
    legend = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"]
    assert "8192 nodes of 8 GPUs; not outlined: each cell is 16 whole nodes" in legend
    assert (
        "tp: size 8, stride 1, 8192 groups, intra-node; rank 1234's group lies inside its cell"
        in legend
    )


def test_a_summary_cell_may_be_part_of_a_node() -> None:
    layout = DomainLayout.row_major("dense", [("fsdp", 1024), ("tp", 64)])
    drawing = draw_domain(layout, 0, 256)
    assert drawing.ranks_per_cell == 128
    assert len(node_outlines(parse(to_svg(drawing)))) == 65536 // 256


@pytest.mark.parametrize("world_size", [2**20, 2**24])
def test_huge_worlds_cost_no_more_than_their_cells(world_size: int) -> None:
    layout = DomainLayout.row_major("dense", [("fsdp", world_size // 8), ("tp", 8)])
    svg = render_svg(layout, world_size - 1, 8)
    assert len(svg.encode()) < 200_000
    parse(svg)


def test_a_prime_sized_world_is_one_cell() -> None:
    layout = DomainLayout.row_major("dense", [("fsdp", 1_048_573)])
    drawing = draw_domain(layout, 5)
    assert (drawing.cells, drawing.ranks_per_cell) == (1, 1_048_573)


def selected_centre(drawing: Drawing) -> tuple[float, float]:
    (cell,) = [
        shape
        for shape in drawing.shapes
        if isinstance(shape, Rect) and "selected" in shape.css_class.split()
    ]
    return cell.x + cell.width / 2, cell.y + cell.height / 2


def decode_png(data: bytes) -> Any:
    return matplotlib.image.imread(io.BytesIO(data), format="png")


@pytest.mark.slow  # matplotlib draws the PNG for seconds: the quick loop leaves it out
@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_png_is_the_drawing_at_its_size_with_the_rank_dark(scale: float) -> None:
    drawing = draw_domain(textbook(), 37, 8)
    pixels = decode_png(to_png(drawing, scale=scale))
    assert pixels.shape == (round(drawing.height * scale), round(drawing.width * scale), 4)
    x, y = selected_centre(drawing)
    dark = pixels[round(y * scale), round(x * scale)]
    assert list(dark[:3]) == pytest.approx([0x22 / 255] * 3, abs=0.02)
    other = draw_domain(textbook(), 0, 8)
    assert selected_centre(other) != (x, y)
    moved = decode_png(to_png(other, scale=scale))[round(y * scale), round(x * scale)]
    assert min(moved[:3]) > 0.5  # rank 37's cell is a coloured or grey cell now
    assert pixels[0, 0].tolist() == [1.0, 1.0, 1.0, 1.0]  # the background is white


# --- the command line ----------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "mesh.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_cli_writes_an_svg(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = write(tmp_path, TEXTBOOK)
    out = tmp_path / "grid.svg"
    result = run_cli("render", config, "--out", str(out), "--rank", "37")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"wrote {out}: domain textbook, 256 ranks in 8 x 32 cells, groups of rank 37\n"
    )
    root = parse(out.read_text())
    tp = with_class(cells(root), "group-tp")
    assert sorted(int(c.get("data-rank", "-1")) for c in tp) == list(range(32, 40))
    assert len(node_outlines(root)) == 32


def test_cli_draws_dense_by_default_and_takes_overrides(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "grid.svg"
    result = run_cli(
        "render", "examples/llama3_8b_8gpu_fsdp.yaml", "-O", str(out), "-o", "degrees.tp=2",
        "-o", "degrees.dp_shard=4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "domain dense, 8 ranks in 2 x 4 cells" in result.stdout


def test_cli_gpus_per_node_outlines_nodes(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = write(tmp_path, "world_size: 16\ndegrees: {tp: 4}\n")
    out = tmp_path / "grid.svg"
    assert run_cli("render", config, "--out", str(out)).returncode == 0
    assert node_outlines(parse(out.read_text())) == []
    assert run_cli("render", config, "--out", str(out), "--gpus-per-node", "4").returncode == 0
    assert len(node_outlines(parse(out.read_text()))) == 4


def test_cli_writes_png(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "grid.png"
    result = run_cli("render", "examples/llama3_70b_64gpu_hsdp_tp.yaml", "--out", str(out))
    assert result.returncode == 0, result.stderr
    layout = load_config(REPO / "examples/llama3_70b_64gpu_hsdp_tp.yaml").layout("dense")
    drawing = draw_domain(layout, 0, 8)
    assert decode_png(out.read_bytes()).shape == (drawing.height * 2, drawing.width * 2, 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--domain", "nope"],
            "unknown domain 'nope'; domains: dataloading, dense, sparse, loss",
        ),
        (["--rank", "8"], "--rank 8 is outside the world [0, 8)"),
        (
            ["--gpus-per-node", "4"],
            "--gpus-per-node 4 disagrees with gpus_per_node 8 in examples/llama3_8b_8gpu_fsdp.yaml",
        ),
    ],
)
def test_cli_usage_errors(run_cli, tmp_path: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "grid.svg"
    result = run_cli("render", "examples/llama3_8b_8gpu_fsdp.yaml", "--out", str(out), *args)
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        f"meshconf: error: {message}\n",
    )
    assert not out.exists()


def test_cli_gpus_per_node_range(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = "examples/llama3_8b_8gpu_fsdp.yaml"
    result = run_cli("render", config, "--out", str(tmp_path / "g.svg"), "--gpus-per-node", "8192")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --gpus-per-node: 8192 is larger than 4096, more than any node holds\n"
    )


def test_cli_output_errors(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = "examples/llama3_8b_8gpu_fsdp.yaml"
    result = run_cli("render", config, "--out", str(tmp_path / "grid.pdf"))
    assert result.returncode == 2
    assert result.stderr == (
        f"meshconf: error: --out {tmp_path / 'grid.pdf'}: the file name must end in .svg or .png\n"
    )
    missing = tmp_path / "no" / "such" / "dir.svg"
    result = run_cli("render", config, "--out", str(missing))
    assert result.returncode == 2
    assert result.stderr == (
        f"meshconf: error: cannot write {missing}: No such file or directory\n"
    )
    result = run_cli("render", config)
    assert result.returncode == 2
    assert result.stderr == "meshconf: error: the following arguments are required: -O/--out\n"


def test_cli_unknown_world_size(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = write(tmp_path, NO_WORLD)
    out = tmp_path / "grid.svg"
    result = run_cli("render", config, "--out", str(out))
    assert (result.returncode, result.stderr) == (
        2,
        f"meshconf: error: {config}: the world size is unknown (degrees.dp_shard is -1); "
        "set world_size in the file or pass --world-size N\n",
    )
    result = run_cli("render", config, "--out", str(out), "--world-size", "64")
    assert result.returncode == 0, result.stderr
    assert "64 ranks in 8 x 8 cells" in result.stdout


def test_cli_invalid_config_prints_problems_like_validate(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "grid.svg"
    result = run_cli("render", "examples/invalid/world_product.yaml", "--out", str(out))
    assert result.returncode == 1
    assert result.stdout == (
        "examples/invalid/world_product.yaml:9:3: degrees.tp: pp(1) * dp_replicate(2) * "
        "dp_shard(2) * cp(1) * tp(3) = 12 != world_size 8\n"
    )
    assert not out.exists()


def test_cli_png_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    out = tmp_path / "grid.png"
    code = main(["render", str(REPO / "examples/llama3_8b_8gpu_fsdp.yaml"), "--out", str(out)])
    assert code == 2
    assert capsys.readouterr().err == (
        "meshconf: error: writing PNG needs matplotlib, which is not installed: "
        f"pip install '{REPO}[png]'\n"
    )
    assert not out.exists()
