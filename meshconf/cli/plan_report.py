"""What ``meshconf plan`` prints: the ranked table, its JSON report, one row's memory
explained, and one row as a config with the command that prints it again."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import yaml

from meshconf.cli.common import table_lines
from meshconf.core.degrees import DEGREE_NAMES, EXPERT_DEGREES, WORLD_FACTORS
from meshconf.core.levels import plural_units, unit_article
from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate_text import (
    explain_lines,
    gib,
    hardware_line,
    headroom_gib,
    memory_json,
    memory_lines,
    settings_json,
    settings_line,
)
from meshconf.features.plan.ranking import (
    Assignment,
    DimLocality,
    Plan,
    build_config,
    config_data,
    kept_inside,
    rationale,
)
from meshconf.features.plan.request import Request, level_text, option_flag


def _command_line(request: Request, index: int, model_words: list[str]) -> str:
    """The command that prints this config again: the request's options in a fixed order,
    then ``model_words`` (the config, if any, and the model's options)."""
    words = ["meshconf plan", f"--world-size {request.world_size}"]
    if request.node_bandwidth_gb_s is not None:
        words += [f"--level {level_text(level)}" for level in request.topology]
    else:
        if request.gpus_per_node is not None:
            words.append(f"--gpus-per-node {request.gpus_per_node}")
        words += [f"--level {level_text(level)}" for level in request.levels]
    if request.order is not None:
        words.append(f"--order {','.join(request.order)}")
    words += [
        f"{option_flag(name)} {request.pins[name]}" for name in DEGREE_NAMES if name in request.pins
    ]
    words += model_words
    words.append(f"--emit {index}")
    return " ".join(words)


def _dims_text(dims: Sequence[DimLocality]) -> str:
    return " ".join(f"{dim.name}({dim.size})" for dim in dims) or "-"


def _split(dims: list[DimLocality], levels: int = 1) -> list[str]:
    """The dims of more than one rank by how many of ``levels`` levels their groups cross,
    the most first."""
    used = [dim for dim in dims if dim.size > 1]
    return [
        _dims_text([dim for dim in used if len(dim.crossed) == count])
        for count in reversed(range(levels + 1))
    ]


def _split_headings(request: Request) -> list[str]:
    """The headings of :func:`_split`'s columns, from ``groups cross nodes`` (or the
    outermost level) to ``groups stay in a node``."""
    names = [level.name for level in request.topology]
    headings = [f"groups cross {plural_units(names[-1])}"]
    for count in reversed(range(1, len(names))):
        headings.append(f"cross {plural_units(names[count - 1])}, in {unit_article(names[count])}")
    return [*headings, "groups stay in a node"]


class _ConfigDumper(yaml.SafeDumper):
    """Lists on one line, as the examples write ``order``."""


def _flow_list(dumper: yaml.SafeDumper, items: list[str]) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=True)


_ConfigDumper.add_representer(list, _flow_list)


def emitted_yaml(plan: Plan, index: int, model_words: list[str], training: dict[str, Any]) -> str:
    """Row ``index`` as a config, after comments that say why it ranks there and the command
    that prints it again. Its ``inside`` (:func:`kept_inside`) makes the runtime check the
    placement the row was ranked on."""
    request = plan.request
    assignment = plan.best[index - 1]
    config = build_config(request, assignment.degrees)
    columns = _split(rationale(request, config), len(request.topology))
    locality = ""
    if request.gpus_per_node is not None:
        headings = [heading.removeprefix("groups ") for heading in _split_headings(request)]
        pairs = zip(headings, columns, strict=True)
        locality = "# groups " + "; ".join(f"{where}: {dims}" for where, dims in pairs) + "\n"
    data = config_data(request, assignment.degrees, kept_inside(request, config))
    if training:
        data["training"] = training
    body = yaml.dump(data, Dumper=_ConfigDumper, sort_keys=False)
    return (
        f"# {_command_line(request, index, model_words)} (assignment {index} of {plan.total})"
        f"\n{locality}{_estimate_comment(assignment)}{body}"
    )


def explained_row(plan: Plan, index: int) -> list[str]:
    """Row ``index``: its degrees and settings, its memory by term (what each holds and its
    source) and what it delivers."""
    request = plan.request
    assignment = plan.best[index - 1]
    found = assignment.estimate
    assert request.model is not None and found is not None
    degrees = " ".join(f"{name}={assignment.degrees[name]}" for name in _shown_degrees(request))
    return [
        f"assignment {index} of {plan.total}: {degrees}",
        settings_line(request.model, request.training),
        *memory_lines(found, request.training),
        _throughput_line(request, found),
        *explain_lines(found, request.training),
    ]


def _throughput_line(request: Request, found: Estimate) -> str:
    """What the rows that fit are ranked by: the step's tokens per second per GPU."""
    wanted = request.training.global_batch_tokens
    if wanted is None:
        against = ""
    elif found.batch_tokens == wanted:
        against = " (the batch asked for)"
    else:
        against = f" ({_batch_difference_text(found.batch_tokens, wanted)} against {wanted})"
    tokens = _throughput_text(found.tokens_per_second_per_gpu(request.world_size))
    return (
        f"throughput: {tokens} tokens/s per GPU, the step's {found.batch_tokens} tokens"
        f"{against} in {found.step_seconds:.3g} s over {request.world_size} GPUs"
    )


def _estimate_comment(assignment: Assignment) -> str:
    found = assignment.estimate
    if found is None:
        return ""
    if found.problem:
        verdict = f"cannot run: {found.problem}"
    else:
        verdict = "fits" if found.fits else "does NOT fit"
    return (
        f"# estimated: {gib(found.memory.total):g} GiB per GPU ({verdict}), "
        f"step {found.step_seconds:.3g} s, {found.exposed_seconds:.3g} s of it communication "
        "not hidden\n"
    )


def _header(plan: Plan) -> list[str]:
    request = plan.request
    gpus = request.gpus_per_node
    world = f"world_size {request.world_size}"
    if gpus is not None and request.world_size % gpus == 0:
        world += f" = {request.world_size // gpus} nodes x {gpus} GPUs"
    elif gpus is not None:
        world += f", {gpus} GPUs per node"
    pins = " ".join(f"{name}={value}" for name, value in request.pins.items()) or "none"
    order = "" if request.order is None else f"; order: {', '.join(request.order)}"
    shown = len(plan.best)
    if plan.total == 1:
        count = "1 valid assignment"
    else:
        which = f"the best {shown}" if shown < plan.total else "all"
        count = f"{plan.total} valid assignments; {which}, best first (ranking: docs/plan.md)"
    lines = [f"{world}; pinned: {pins}{order}"]
    if request.model is not None:
        lines += [settings_line(request.model, request.training), hardware_line(request.training)]
        fit = f"{plan.fitting} fit in {request.training.gpu_memory_gib:g} GiB"
        count = count.replace(";", f"; {fit};", 1) if ";" in count else f"{count}; {fit}"
    lines.append(count)
    if plan.left_out_by_order:
        lines.append(
            f"{plan.left_out_by_order} more left out: under this order their expert dims would "
            "split world factors unevenly"
        )
    lines += [f"{count} left out: {reason}" for reason, count in plan.left_out.items()]
    if plan.tried:
        tried = "; ".join(
            f"{name}{' tried' if position == 0 else ''}: {', '.join(map(str, values))}"
            for position, (name, values) in enumerate(plan.tried.items())
        )
        lines.append(tried)
    if gpus is None:
        lines.append(
            "no --gpus-per-node: node locality unknown; ranked by smaller pp, dp_replicate, cp, "
            "dp_shard in turn"
        )
    return lines


def _estimate_headings(request: Request) -> list[str]:
    """The columns of a row's estimate; ``batch`` with ``--global-batch-tokens``."""
    if request.model is None:
        return []
    batch = [] if request.training.global_batch_tokens is None else ["batch"]
    return ["GiB", "headroom", "tokens/s/GPU", *batch, "step s", "compute s", "exposed s"]


def _throughput_text(tokens_per_second: float) -> str:
    if tokens_per_second >= 100:
        return f"{tokens_per_second:.0f}"
    return f"{tokens_per_second:.3g}"


def _batch_difference_text(batch_tokens: int, wanted: int) -> str:
    """``=``, or how far the step's batch is from the one asked for, in percent: two
    significant digits below 10% (``+0.024%``), so that a batch that differs never shows as
    ``0%``."""
    if batch_tokens == wanted:
        return "="
    percent = 100 * (batch_tokens - wanted) / wanted
    if abs(percent) >= 10:
        return f"{percent:+.0f}%"
    decimals = 1 - math.floor(math.log10(abs(percent)))
    return f"{percent:+.{decimals}f}".rstrip("0").rstrip(".") + "%"


def _problem_marks(plan: Plan) -> dict[str, int]:
    """A number for each reason other than memory that a shown row cannot run for, in the
    order of the rows: the table marks the rows with it and gives the reason once, below."""
    marks: dict[str, int] = {}
    for assignment in plan.best:
        found = assignment.estimate
        if found is not None and found.problem is not None:
            marks.setdefault(found.problem, len(marks) + 1)
    return marks


def _estimate_cells(plan: Plan, found: Estimate, marks: dict[str, int]) -> list[str]:
    request = plan.request
    wanted = request.training.global_batch_tokens
    headroom = f"[{marks[found.problem]}]" if found.problem else f"{headroom_gib(found):.1f}"
    batch = [] if wanted is None else [_batch_difference_text(found.batch_tokens, wanted)]
    return [
        f"{found.memory.total / GIB:.1f}",
        headroom,
        _throughput_text(found.tokens_per_second_per_gpu(request.world_size)),
        *batch,
        f"{found.step_seconds:.3g}",
        f"{found.compute_seconds:.3g}",
        f"{found.exposed_seconds:.3g}",
    ]


def _shown_degrees(request: Request) -> tuple[str, ...]:
    return WORLD_FACTORS + (EXPERT_DEGREES if request.experts else ())


def _rows(plan: Plan, marks: dict[str, int]) -> list[list[str]]:
    """The table, header first: index, degrees, the estimate (with ``marks`` for headroom
    where a row cannot run), rationale."""
    located = plan.request.gpus_per_node is not None
    shown = _shown_degrees(plan.request)
    header = ["#", *shown, *_estimate_headings(plan.request)]
    header += _split_headings(plan.request) if located else ["dims (ranks)"]
    rows = [header]
    for index, assignment in enumerate(plan.best, start=1):
        dims = rationale(plan.request, build_config(plan.request, assignment.degrees))
        cells = [str(index), *(str(assignment.degrees[name]) for name in shown)]
        found = assignment.estimate
        if found is not None:
            cells += _estimate_cells(plan, found, marks)
        levels = len(plan.request.topology)
        cells += _split(dims, levels) if located else [_dims_text([d for d in dims if d.size > 1])]
        rows.append(cells)
    return rows


def print_table(plan: Plan) -> None:
    """The plan's heading, its best rows, then why each marked row cannot run."""
    print("\n".join(_header(plan)))
    marks = _problem_marks(plan)
    rows = _rows(plan, marks)
    numeric = 1 + len(_shown_degrees(plan.request)) + len(_estimate_headings(plan.request))
    print("\n".join(table_lines(rows, range(numeric))))
    for problem, mark in marks.items():
        print(f"[{mark}] cannot run: {problem}")


def _json_entry(plan: Plan, index: int, assignment: Assignment) -> dict[str, Any]:
    dims = rationale(plan.request, build_config(plan.request, assignment.degrees))
    entry: dict[str, Any] = {
        "index": index,
        "degrees": dict(assignment.degrees),
        "dims": [
            {"name": dim.name, "size": dim.size, "crosses_nodes": dim.crosses_nodes}
            | ({"crosses": list(dim.crossed)} if plan.request.levels else {})
            for dim in dims
        ],
    }
    found = assignment.estimate
    if found is not None:
        entry.update(memory_json(found))
        wanted = plan.request.training.global_batch_tokens
        entry["tokens_per_second_per_gpu"] = round(
            found.tokens_per_second_per_gpu(plan.request.world_size), 2
        )
        entry["batch_difference_tokens"] = None if wanted is None else found.batch_tokens - wanted
    return entry


def json_report(plan: Plan) -> dict[str, Any]:
    """The request and the plan's best rows with every figure of each."""
    request = plan.request
    report: dict[str, Any] = {
        "world_size": request.world_size,
        "gpus_per_node": request.gpus_per_node,
        **(
            {"levels": [dataclasses.asdict(level) for level in request.levels]}
            if request.levels
            else {}
        ),
        "pins": dict(request.pins),
        "order": list(request.rank_order),
        "total": plan.total,
        "left_out_by_order": plan.left_out_by_order,
        "left_out": dict(plan.left_out),
        "tried": {name: list(values) for name, values in plan.tried.items()},
        "assignments": [
            _json_entry(plan, index, assignment)
            for index, assignment in enumerate(plan.best, start=1)
        ],
    }
    if request.model is not None:
        report.update(settings_json(request.model, request.training))
        report["fitting"] = plan.fitting
    return report
