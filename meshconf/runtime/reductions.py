"""Reductions over a mesh that may be None (a disabled dim): then the local value is the result."""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def all_reduce(
    tensor: torch.Tensor,
    op: Literal["sum", "avg", "max", "min"],
    mesh: DeviceMesh | None,
) -> torch.Tensor:
    """Reduce ``tensor`` over every rank of ``mesh`` (all its dims); a new tensor.

    ``mesh=None`` (what ``get_optional_mesh`` returns for a size-1 dim) returns a copy of
    ``tensor``, so call sites need no ``if`` for parallelism that is switched off.
    """
    result = tensor.detach().clone()
    if mesh is None:
        return result
    for dim in range(mesh.ndim):
        dist.all_reduce(result, op=_OPS[op], group=mesh.get_group(dim))
    if op == "avg":
        result = result / mesh.size()
    return result
