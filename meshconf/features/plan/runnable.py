"""Which layouts a model can run: the degrees its trainers refuse for its shape, each rule
as the trainer's own code states it, with the values that would work.

Pure Python. The rules, and where each trainer enforces them:

- tp divides the attention heads (grouped-query and latent attention alike): Megatron-Core
  0.16's ``TransformerConfig.__post_init__`` raises "num_attention_heads ... must be a
  multiple of tensor_model_parallel_size" (``megatron/core/transformer/transformer_config.py``).
- tp and the key/value heads divide one another: the same ``__post_init__`` raises
  "num_query_groups ... must be a multiple or divisor of tensor_model_parallel_size" (a tp
  above the KV heads replicates them).
- tp divides the feed-forward width of the dense layers and of the shared experts: their
  first linear layer is a ``ColumnParallelLinear``, whose ``divide(output_size,
  world_size)`` asserts that tp splits it (``megatron/core/tensor_parallel/layers.py``,
  ``megatron/core/utils.py``).
- ep divides the routed experts: ``MoELayer.__init__`` asserts ``num_moe_experts % ep_size
  == 0`` (``megatron/core/transformer/moe/moe_layer.py``), and ``__post_init__`` refuses an
  expert-parallel size above 1 without experts ("num_moe_experts must be non None to use
  expert-parallel").
- etp is 1 or tp (meshconf's rule, ``meshconf.model.rules.check_etp``), and divides the
  experts' feed-forward width: the grouped experts split it over the expert tensor-parallel
  group with the same ``divide`` (``megatron/core/transformer/moe/experts.py``).
- every pipeline chunk keeps a layer, after the first/last-stage and virtual-stage options:
  the chunking that :meth:`Training.for_model` resolves and :func:`split_problem`, as the
  estimate checks them; and the schedule runs over that many pipeline ranks
  (:func:`pipeline_ranks_problem`: DeepSeek's ``DualPipe`` pairs them, so an even count).
- cp splits the sequence into ``2 * cp`` equal chunks: load-balanced causal attention pairs
  chunk ``r`` with chunk ``2 cp - 1 - r`` on rank ``r``, and torch's ``_HeadTailLoadBalancer``
  refuses a sequence ``2 * world_size`` does not divide
  (``torch/distributed/tensor/experimental/_context_parallel/_load_balancer.py``, which
  torchtitan's context parallelism uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from meshconf.core.degrees import divisors
from meshconf.core.messages import either
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.pipeline import split_problem
from meshconf.features.plan.estimate.schedule import pipeline_ranks_problem
from meshconf.features.plan.estimate.step_inputs import Training

#: The degrees the rules read, in the order their problems are reported.
RULED_DEGREES = ("tp", "ep", "etp", "pp", "cp")


@dataclass(frozen=True)
class Unrunnable:
    """A degree the model cannot run with: where the problem is, the reason without the
    value (for counting layouts by reason), and the message with the values that would
    work."""

    degree: str
    reason: str
    message: str


def unrunnable(
    arch: Architecture,
    degrees: Mapping[str, int],
    training: Training,
    world_size: int | None = None,
) -> list[Unrunnable]:
    """Why ``arch`` cannot run with ``degrees`` (1 where missing) under ``training``: the
    first rule each degree breaks, in :data:`RULED_DEGREES` order, offering the values that
    pass every rule of that degree and divide ``world_size`` when given. Raises nothing."""
    tp = degrees.get("tp", 1)
    return [
        problem
        for problem in (
            _tp_problem(arch, tp, world_size),
            _ep_problem(arch, degrees.get("ep", 1), world_size),
            _etp_problem(arch, tp, degrees.get("etp", 1), world_size),
            _pp_problem(arch, degrees.get("pp", 1), training, world_size),
            _cp_problem(training.seq_len, degrees.get("cp", 1), world_size),
        )
        if problem is not None
    ]


def _use(choices: tuple[int, ...], world_size: int | None) -> str:
    """The values to offer: the rule's choices that also divide the world, where known."""
    fitting = [value for value in choices if world_size is None or world_size % value == 0]
    return either(fitting)


def _broken(degree: str, value: int, what: str, use: str) -> Unrunnable:
    """``degree``'s problem: ``tp does not divide ...`` as the reason, the value in its
    place in the message, and the values to use."""
    return Unrunnable(degree, f"{degree} {what}", f"{value} {what}; use {use}")


@lru_cache(maxsize=256)
def tp_choices(arch: Architecture) -> tuple[int, ...]:
    """Every tp that passes the model's tp rules: divisors of the heads."""
    return tuple(tp for tp in divisors(arch.attention.heads) if _tp_rule(arch, tp) is None)


def _tp_rule(arch: Architecture, tp: int) -> str | None:
    """What the first tp rule ``tp`` breaks says of it, or None."""
    name = arch.name
    heads = arch.attention.heads
    if heads % tp:
        return f"does not divide {name}'s {heads} attention heads"
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        kv = attention.kv_heads
        if kv % tp and tp % kv:
            return f"and {name}'s {kv} KV heads do not divide one another"
    experts = arch.experts
    widths = []
    if experts is None or experts.dense_layers > 0:
        widths.append(("dense", arch.ffn))
    if experts is not None and experts.shared:
        widths.append(("shared-expert", experts.ffn * experts.shared))
    for kind, width in widths:
        if width % tp:
            return f"does not divide {name}'s {kind} feed-forward width of {width}"
    return None


def _tp_problem(arch: Architecture, tp: int, world_size: int | None) -> Unrunnable | None:
    what = _tp_rule(arch, tp)
    if what is None:
        return None
    return _broken("tp", tp, what, _use(tp_choices(arch), world_size))


def ep_choices(arch: Architecture) -> tuple[int, ...]:
    """The divisors of the routed experts (1 alone without experts)."""
    experts = arch.experts
    return (1,) if experts is None else tuple(divisors(experts.routed))


def _ep_problem(arch: Architecture, ep: int, world_size: int | None) -> Unrunnable | None:
    experts = arch.experts
    if ep == 1:
        return None
    if experts is None:
        return _broken("ep", ep, f"needs experts, and {arch.name} has none", "1")
    if experts.routed % ep:
        what = f"does not divide {arch.name}'s {experts.routed} routed experts"
        return _broken("ep", ep, what, _use(ep_choices(arch), world_size))
    return None


def etp_choices(arch: Architecture, tp: int) -> tuple[int, ...]:
    """The etp meshconf's rule allows, 1 or ``tp``, that divide the experts' width."""
    width = None if arch.experts is None else arch.experts.ffn
    return tuple(etp for etp in sorted({1, tp}) if width is None or width % etp == 0)


def _etp_problem(
    arch: Architecture, tp: int, etp: int, world_size: int | None
) -> Unrunnable | None:
    if etp == 1:
        return None
    use = _use(etp_choices(arch, tp), world_size)
    if etp != tp:
        what = "is neither 1 nor tp"
        return Unrunnable("etp", f"etp {what}", f"{etp} {what} ({tp}); use {use}")
    experts = arch.experts
    if experts is not None and experts.ffn % etp:
        what = f"does not divide {arch.name}'s expert feed-forward width of {experts.ffn}"
        return _broken("etp", etp, what, use)
    return None


def pipeline_problem(arch: Architecture, pp: int, training: Training) -> str | None:
    """Why ``pp`` pipeline ranks cannot split the model's layers under ``training``, or its
    schedule cannot run over them, as the estimate says it, or None."""
    return _split_problem(arch, pp, training) or pipeline_ranks_problem(pp, training)


def _split_problem(arch: Architecture, pp: int, training: Training) -> str | None:
    resolved, chunking = training.for_model(arch.layers, pp)
    chunks = pp * resolved.chunks_per_stage
    return chunking or split_problem(arch.layers, chunks, resolved.stage_ends)


@lru_cache(maxsize=256)
def pp_choices(arch: Architecture, training: Training) -> tuple[int, ...]:
    """Every pp that splits the model's layers under ``training``: every chunk but the two
    at the ends holds a layer, so there are at most the layers and two chunks."""
    most = arch.layers + 2
    return tuple(pp for pp in range(1, most + 1) if pipeline_problem(arch, pp, training) is None)


def _pp_problem(
    arch: Architecture, pp: int, training: Training, world_size: int | None
) -> Unrunnable | None:
    split = _split_problem(arch, pp, training)
    problem = split or pipeline_ranks_problem(pp, training)
    if problem is None:
        return None
    if split is not None:
        what = f"cannot split {arch.name}'s {arch.layers} layers"
    else:
        what = f"is a pipeline the {training.schedule} schedule cannot run"
    use = _use(pp_choices(arch, training), world_size) or "none: change the pipeline options"
    return Unrunnable("pp", f"pp {what}", f"{pp} {what}: {problem}; use {use}")


@lru_cache(maxsize=256)
def cp_choices(seq_len: int) -> tuple[int, ...]:
    """Every cp that splits ``seq_len`` tokens into ``2 * cp`` equal chunks, and 1."""
    return tuple(divisors(seq_len // 2)) if seq_len % 2 == 0 else (1,)


def _cp_problem(seq_len: int, cp: int, world_size: int | None) -> Unrunnable | None:
    if cp == 1 or seq_len % (2 * cp) == 0:
        return None
    what = f"does not split the {seq_len}-token sequence into 2 * cp equal chunks"
    return Unrunnable(
        "cp",
        f"cp {what}",
        f"{cp} does not split the {seq_len}-token sequence into 2 * {cp} = {2 * cp} equal "
        f"chunks, as load-balanced causal attention needs; use "
        f"{_use(cp_choices(seq_len), world_size)}",
    )
