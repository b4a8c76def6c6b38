"""How many elements of a model's weights a rank holds: after tensor and expert parallelism,
as FSDP shards them, and as an FSDP all-gather rebuilds them.

Pure Python. Formulas and sources in docs/plan.md ("Weights and model state per rank").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from meshconf.features.plan.estimate.architecture import Architecture, LayerKind, Weight
from meshconf.features.plan.estimate.step_inputs import Parallelism

#: How many elements of some weights a rank holds: :func:`unsharded` or :func:`gathered`.
Sizing = Callable[[Sequence[Weight], Parallelism], int]


@dataclass(frozen=True)
class Shard:
    """Elements and tensors of some weights on one rank."""

    elements: int
    tensors: int


def local_shard(weights: Sequence[Weight], par: Parallelism) -> Shard:
    """The weights' local shard after tp (etp and ep for experts), then FSDP over ``fsdp``
    (``efsdp`` for experts), which splits dim 0 into equal parts, padding the last: each
    rank allocates ``ceil(rows / n)`` rows."""
    return Shard(sum(_sharded(weight, par) for weight in weights), len(weights))


def unsharded(weights: Sequence[Weight], par: Parallelism) -> int:
    """Elements of the weights after tp/ep/etp only: what an FSDP all-gather rebuilds."""
    return sum(math.prod(_tp_local(weight, par)) for weight in weights)


@lru_cache(maxsize=4096)
def linear_split(
    arch: Architecture, kind: LayerKind, par: Parallelism, size: Sizing = unsharded
) -> tuple[int, int]:
    """Elements of one block's dense linear weights and of its other weights, sized by
    ``size``."""
    weights = arch.layer_weights(kind)
    linear = [weight for weight in weights if weight.dense_linear]
    return size(linear, par), size([weight for weight in weights if not weight.dense_linear], par)


def gathered(weights: Sequence[Weight], par: Parallelism) -> int:
    """Elements an FSDP all-gather of the weights rebuilds. FSDP2 pads each weight's dim 0
    to a multiple of the group's size, gathers the padded shards, and the unsharded
    parameter is a view of that padded output (``FSDPParam.init_all_gather_outputs``), so
    a small weight in a large group costs the group's size in rows."""
    return sum(
        _sharded(weight, par) * (par.efsdp if weight.experts else par.fsdp) for weight in weights
    )


def end_weights(arch: Architecture, first: bool, last: bool) -> tuple[Weight, ...]:
    """The weights the first pipeline rank (the embedding) and the last (the final norm and
    the output) hold besides their blocks."""
    return (arch.embedding_weights() if first else ()) + (arch.output_weights() if last else ())


@lru_cache(maxsize=4096)
def block_split(arch: Architecture, kind: LayerKind, par: Parallelism) -> tuple[int, int]:
    """Elements of one block after tp/ep/etp: the non-expert weights, and the experts."""
    weights = arch.layer_weights(kind)
    experts = unsharded([weight for weight in weights if weight.experts], par)
    return unsharded([weight for weight in weights if not weight.experts], par), experts


def _tp_local(weight: Weight, par: Parallelism) -> tuple[int, int]:
    """Rows and columns of one rank's part after tensor parallelism (etp and ep for
    experts, whose ``rows`` count every local expert)."""
    ways = par.etp if weight.experts else par.tp
    rows = -(-weight.rows // ways) if weight.split == "rows" else weight.rows
    cols = -(-weight.cols // ways) if weight.split == "cols" else weight.cols
    if weight.experts:
        rows *= -(-weight.experts // par.ep)
    return rows, cols


def _sharded(weight: Weight, par: Parallelism) -> int:
    rows, cols = _tp_local(weight, par)
    ways = par.efsdp if weight.experts else par.fsdp
    return -(-rows // ways) * cols
