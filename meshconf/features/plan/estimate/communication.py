"""Bytes each dim's collectives send per rank per training step, and their time on the
network of the levels a dim's groups cross (a bandwidth inside a node, one inside each
level above it, one across the outermost).

Pure Python. Ring algorithms: an all-gather or reduce-scatter of ``X`` bytes over ``n``
ranks sends ``X (n - 1) / n`` per rank, an all-reduce twice that, an all-to-all
``X (n - 1) / n``. Formulas and sources in docs/plan.md ("Communication per step").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshconf.core.levels import NODE, NVLINK, Level
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training, microbatches
from meshconf.features.plan.estimate.work import StageWork, busiest_stage

#: Dims whose traffic overlaps with compute (issued ahead by FSDP, or once a step).
OVERLAPPED = frozenset({"fsdp", "efsdp", "dp_replicate"})


def overlapped_dims(training: Training) -> frozenset[str]:
    """The dims whose traffic overlaps with compute: :data:`OVERLAPPED`, and with
    ``ep_overlap`` the experts' dispatch and combine, which DeepSeek-V3's DualPipe runs
    under another micro-batch's compute (DeepSeek-V3 report, section 3.2.1; torchtitan's
    ``pipeline_parallel_expert_parallel_overlap`` with its DualPipeV schedule)."""
    return OVERLAPPED | {"ep"} if training.ep_overlap else OVERLAPPED


EXPERT_DIMS = frozenset({"ep", "etp", "efsdp"})
COMM_DIMS = ("tp", "cp", "ep", "etp", "pp", "fsdp", "efsdp", "dp_replicate")


@dataclass(frozen=True)
class DimTraffic:
    """One dim's bytes per step per rank, the seconds they take, and whether its groups
    cross nodes (which picks the bandwidth)."""

    name: str
    size: int
    bytes: int
    seconds: float
    crosses_nodes: bool
    #: Bandwidth the traffic was charged at, GB/s per GPU.
    gb_s: float = 0.0


def level_bandwidths(levels: Sequence[Level], training: Training) -> tuple[float, ...]:
    """GB/s per GPU inside one unit of each level, then across the outermost: a level's
    own ``bandwidth_gb_s``, else the node's bandwidth for a node or an NVLink domain
    (``nvlink``) and the network's for a level above them. Empty without levels: then
    :func:`traffic` tells only inside a node from across nodes."""
    if not levels:
        return ()
    inside = tuple(
        level.bandwidth_gb_s
        if level.bandwidth_gb_s is not None
        else training.intra_node_gb_s
        if level.name in (NODE, NVLINK)
        else training.inter_node_gb_s
        for level in levels
    )
    return (*inside, training.inter_node_gb_s)


def traffic(
    arch: Architecture,
    par: Parallelism,
    training: Training,
    crosses: Mapping[str, int],
    stage: StageWork | None = None,
    bandwidths: Sequence[float] = (),
) -> dict[str, DimTraffic]:
    """Every dim of more than one rank with the bytes it sends per step per rank.

    ``crosses`` is, per dim, how many levels its groups cross (:func:`level_bandwidths`
    gives ``bandwidths``, one per count); without ``bandwidths``, a dim that crosses is
    charged the network's bandwidth and one that does not the node's."""
    work = stage or busiest_stage(arch, par, training)
    sent = _bytes(arch, par, training, work)
    found: dict[str, DimTraffic] = {}
    for name in COMM_DIMS:
        size = getattr(par, name)
        if size == 1 or (arch.experts is None and name in EXPERT_DIMS):
            continue
        crossed = int(crosses.get(name, 0))
        bandwidth = _bandwidth(training, bandwidths, crossed)
        seconds = sent[name] / (bandwidth * 1e9)
        limit = training.moe_max_nodes
        if name == "ep" and limit is not None and crossed and arch.experts is not None:
            # Node-limited routing (DeepSeek-V3, section 2.1.2; its dispatch kernels, 3.2.2):
            # a token crosses to at most ``limit`` units, one copy per unit, and is forwarded
            # there to its top-k experts over the unit's own links.
            remote = sent[name] * min(limit, arch.experts.top_k) / arch.experts.top_k
            local = _bandwidth(training, bandwidths, crossed - 1)
            seconds = remote / (bandwidth * 1e9) + sent[name] / (local * 1e9)
        found[name] = DimTraffic(name, size, sent[name], seconds, crossed > 0, bandwidth)
    return found


def _bandwidth(training: Training, bandwidths: Sequence[float], crossed: int) -> float:
    """GB/s for groups that cross ``crossed`` levels (:func:`traffic`)."""
    if bandwidths:
        return bandwidths[min(crossed, len(bandwidths) - 1)]
    return training.inter_node_gb_s if crossed else training.intra_node_gb_s


def _ring(ranks: int) -> float:
    return (ranks - 1) / ranks


def _bytes(
    arch: Architecture, par: Parallelism, training: Training, work: StageWork
) -> dict[str, int]:
    m = microbatches(par, training)
    # the micro-batches through each of the rank's chunks: half of them when mirrored
    through = m * training.chunk_share(par.pp)
    tokens = training.seq_len * training.micro_batch // par.cp
    p, g = training.param_bytes, training.grad_bytes
    # passes over a block per micro-batch that move activations: forward and backward, and
    # full recomputation's second forward, for the share of the rank's blocks it recomputes
    passes = 2 + (work.recomputed_layers / work.layers if work.layers else 0)
    # torchtitan's selective policy keeps the outputs of the attention kernel, reduce-scatter
    # and all-to-all, so its recomputation repeats only the all-gathers: half of what tp's
    # and etp's sequence-parallel collectives move in a pass; norms-latent-swiglu recomputes
    # the norms, whose outputs the products' backward pass gathers again, as many
    gathering_passes = passes + (
        0.5 if training.checkpointing in ("selective", "norms-latent-swiglu") else 0
    )
    hidden = arch.hidden
    top_k = arch.experts.top_k if arch.experts else 0
    dense, expert = work.dense_elements, work.expert_elements
    # ZeRO 3: all-gather in forward and again in backward per micro-batch; ZeRO 1 and 2:
    # once a step, after the optimizer; each one reduce-scatter of the gradients. ZeRO 0
    # all-reduces the gradients, which moves twice what a reduce-scatter does.
    gathers = {0: 0, 1: 1, 2: 1, 3: 2 * through}[training.zero_stage]
    reductions = 2 if training.zero_stage == 0 else 1
    # the dense linear weights go in fp8 with fp8_param_gather
    gathered = dense * p - work.linear_elements * (p - training.linear_bytes)
    shards = (dense / par.fsdp + expert / par.efsdp) * g
    kv_per_token = _kv_per_token(arch, par)
    # dispatch (in the dispatch dtype) and combine all-to-all per pass, tokens split by tp
    ep_passes = (training.dispatch_bytes + p) / p * passes * work.moe_layers * through
    etp_passes = 2 * gathering_passes * work.moe_layers * through
    sent = {
        "fsdp": (gathers * gathered + reductions * dense * g) * _ring(par.fsdp),
        "efsdp": (gathers * expert * p + reductions * expert * g) * _ring(par.efsdp),
        # all-reduce of the gradient shards, once per step
        "dp_replicate": 2 * shards * _ring(par.dp_replicate),
        # sequence parallelism: per block 2 all-gathers + 2 reduce-scatters per pass
        "tp": 4 * gathering_passes * work.layers * through * tokens * hidden * p * _ring(par.tp),
        # ring attention: every rank receives the other cp-1 key/value chunks per pass,
        # and in backward also their gradients
        "cp": (passes + 1) * work.layers * through * tokens * kv_per_token * p * (par.cp - 1),
        "ep": ep_passes * tokens * top_k * hidden * p * _ring(par.ep) / par.tp,
        "etp": etp_passes * tokens * top_k * hidden * p * _ring(par.etp) / par.tp,
        "pp": _pp_sends(par.pp, training) * m * tokens * hidden * p / par.tp
        # mirrored, each chunk's two copies sum their gradient shards once a step, an
        # all-reduce between the mirror ranks
        + (shards if training.placement == "mirror" and par.pp > 1 else 0),
    }
    return {name: int(value) for name, value in sent.items()}


def _pp_sends(pp: int, training: Training) -> int:
    """Activations and gradients the busiest pipeline rank sends to other ranks per
    micro-batch: one forward and one backward across each chunk boundary it sits on, two a
    chunk on a rank that holds neither end. With pp 2 every rank holds an end, which sends
    one way only; in a V, rank 0 holds both ends and the last rank passes its two chunks'
    boundary on itself. Mirrored, each micro-batch passes through one of the rank's two
    chunks, whose neighbours are the same ranks: as with one chunk a rank."""
    v = training.chunks_per_stage
    if pp > 2:
        return 2 * v
    return 2 if training.placement == "v" else 2 * v - 1


def _kv_per_token(arch: Architecture, par: Parallelism) -> float:
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        return 2 * attention.kv_heads * attention.head_dim / par.tp
    qk = attention.qk_nope_head_dim + attention.qk_rope_head_dim
    return attention.heads * (qk + attention.v_head_dim) / par.tp
