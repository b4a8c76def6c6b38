"""Megatron-Core's own ``RankGenerator``, read from the installed megatron-core.

``import megatron.core`` loads torch, Transformer Engine fallbacks and compiled kernels (about
8 s on two cores), while the rank arithmetic the tests compare with is two pure-Python
definitions in ``megatron/core/parallel_state.py``. This module compiles exactly those two
definitions from the installed file, unchanged, so the tests run Megatron's code without
paying for the package.
"""

from __future__ import annotations

import ast
from importlib.metadata import distribution
from typing import Any

_FILE = "megatron/core/parallel_state.py"
_NAMES = ("generate_masked_orthogonal_rank_groups", "RankGenerator")


def _load() -> Any:
    path = distribution("megatron-core").locate_file(_FILE)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    wanted = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in _NAMES
    ]
    assert sorted(node.name for node in wanted) == sorted(_NAMES), f"{path} has changed"
    namespace: dict[str, Any] = {"List": list}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["RankGenerator"]


RankGenerator = _load()
