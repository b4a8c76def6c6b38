"""Megatron-Core's own pure-Python definitions, read from the installed megatron-core: the
rank arithmetic of ``RankGenerator``, and ``get_num_layers_to_build``, which says how many
layers each pipeline chunk builds.

``import megatron.core`` loads torch, Transformer Engine fallbacks and compiled kernels (about
8 s on two cores), while what the tests compare with is a few pure-Python definitions. This
module compiles exactly those definitions from the installed files, unchanged, so the tests
run Megatron's code without paying for the package.
"""

from __future__ import annotations

import ast
from importlib.metadata import distribution
from typing import Any, Optional


def source(file: str) -> str:
    """The text of ``file`` of the installed megatron-core."""
    return distribution("megatron-core").locate_file(file).read_text(encoding="utf-8")


def _load(file: str, names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    """``names``, defined in ``file`` of the installed megatron-core, over ``namespace``."""
    path = distribution("megatron-core").locate_file(file)
    tree = ast.parse(source(file), filename=str(path))
    wanted = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names
    ]
    assert sorted(node.name for node in wanted) == sorted(names), f"{path} has changed"
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


RankGenerator = _load(
    "megatron/core/parallel_state.py",
    ("generate_masked_orthogonal_rank_groups", "RankGenerator"),
    {"List": list},
)["RankGenerator"]

#: ``get_num_layers_to_build(config, vp_stage, pp_rank)``: with ``pp_rank`` given it reads
#: only the config's pipeline settings (a namespace with Megatron's attribute names will do)
#: and the two virtual-stage tests beside it.
get_num_layers_to_build = _load(
    "megatron/core/transformer/transformer_block.py",
    ("get_num_layers_to_build",),
    _load(
        "megatron/core/pipeline_parallel/utils.py",
        ("is_vp_first_stage", "is_vp_last_stage"),
        {"Optional": Optional, "TransformerConfig": object},
    ),
)["get_num_layers_to_build"]

#: ``get_pp_rank_microbatches(num_microbatches, num_model_chunks, group_size, ...,
#: p2p_communicator=...)``: the warm-up forward passes each rank runs before its first
#: backward pass, under 1F1B and the interleaved schedule. Given a communicator it reads the
#: pipeline's size, the rank and the chunks per rank from it, and nothing of Megatron's state.
get_pp_rank_microbatches = _load(
    "megatron/core/pipeline_parallel/schedules.py",
    ("get_pp_rank_microbatches",),
    {"Optional": Optional, "P2PCommunicator": object, "parallel_state": None},
)["get_pp_rank_microbatches"]

#: ``get_schedule_table(num_microbatches, num_model_chunks, group_size)``: the (micro-batch,
#: model chunk) of each of a rank's forward passes, in the order the interleaved schedule
#: runs them.
get_schedule_table = _load(
    "megatron/core/pipeline_parallel/schedules.py", ("get_schedule_table",), {}
)["get_schedule_table"]
