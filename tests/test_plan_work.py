"""Work is conserved: the FLOPs of every rank of a layout (``work.pipeline_flops``) sum to
the model's FLOPs per token times the step's tokens, exactly, whatever tp, etp, ep, cp and
data parallelism are, and what one rank's routed experts do is what a routed mixture of
experts split over the ranks computes.

The model's FLOPs per token are written out here from the weights, apart from the
estimator's code, and compared with Megatron-LM's ``num_floating_point_operations``
(``megatron/training/training.py`` at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553,
its ``transformer_flops``), re-implemented below: the terms that differ are named and
counted exactly.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from meshconf.core.degrees import divisors
from meshconf.core.schedules import Schedule
from meshconf.core.setting_values import CHECKPOINTING, Checkpointing, MfuCounts
from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
    LatentAttention,
    LayerKind,
)
from meshconf.features.plan.estimate.model_file import load_model_file
from meshconf.features.plan.estimate.pipeline import rank_stage, stage_layers
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training, microbatches
from meshconf.features.plan.estimate.work import pass_flops, pipeline_flops, stage_work
from meshconf.features.plan.runnable import unrunnable

# --- the model's FLOPs, from its weights -------------------------------------------------


def _active(arch: Architecture, kind: LayerKind) -> int:
    """Weight elements a token passes through in one block: ``top_k`` of the routed
    experts, every other weight whole."""
    experts = arch.experts
    total = 0
    for weight in arch.layer_weights(kind):
        routed = weight.experts and experts is not None
        total += weight.rows * weight.cols * (experts.top_k if routed and experts else 1)
    return total


def _output(arch: Architecture) -> int:
    """The final norm and the output projection: a tied model multiplies by the embedding."""
    return arch.hidden + arch.vocab * arch.hidden


def _scores(arch: Architecture, seq_len: int) -> int:
    """Forward FLOPs per token of one block's attention scores and their use."""
    attention = arch.attention
    if isinstance(attention, GroupedQueryAttention):
        return 2 * seq_len * 2 * attention.heads * attention.head_dim
    qk = attention.qk_nope_head_dim + attention.qk_rope_head_dim
    return 2 * seq_len * attention.heads * (qk + attention.v_head_dim)


def model_flops_per_token(arch: Architecture, seq_len: int) -> int:
    """``6 N`` over the weights a token passes through, the embedding's look-up left out,
    and the attention's ``2 s`` per dim, three passes."""
    blocks = sum(_active(arch, arch.kind(layer)) for layer in range(arch.layers))
    return 6 * (blocks + _output(arch)) + 3 * arch.layers * _scores(arch, seq_len)


def recomputed_flops_per_token(
    arch: Architecture, par: Parallelism, training: Training
) -> Fraction:
    """What the backward passes run again per token of the step, over the whole pipeline:
    every block's recomputed forward pass, the products ``selective`` runs again, or
    latent attention's up-projections under ``norms-latent-swiglu`` (counted here from the
    attention's widths). Each pipeline rank recomputes its own blocks (every N-th counted
    across its chunks, the first N of each chunk); mirrored, a micro-batch passes one of a
    rank's two chunks."""
    if training.checkpointing == "norms-latent-swiglu":
        return Fraction(2 * arch.layers * _up_projections(arch))
    if training.checkpointing == "selective":
        return Fraction(
            sum(
                2 * activations.recomputed_weights(arch, arch.kind(layer))
                for layer in range(arch.layers)
            )
        )
    if training.checkpointing != "full":
        return Fraction(0)
    share = Fraction(1, 2) if training.placement == "mirror" and par.pp > 1 else Fraction(1)
    ranks = stage_layers(
        arch.layers, par.pp, training.chunks_per_stage, training.stage_ends, training.placement
    )
    total = Fraction(0)
    for chunks in ranks:
        position = 0
        for chunk in chunks:
            for index, layer in enumerate(chunk):
                position += 1
                if training.checkpoint_every is not None:
                    again = position % training.checkpoint_every == 0
                elif training.checkpoint_first is not None:
                    again = index < training.checkpoint_first
                else:
                    again = True
                if again:
                    forward = 2 * _active(arch, arch.kind(layer)) + _scores(arch, training.seq_len)
                    total += share * forward
    return total


def _up_projections(arch: Architecture) -> int:
    """Weight elements of latent attention's up-projections in one block: the query's from
    its low rank (none without one), the key's and value's from theirs; none for
    grouped-query attention."""
    a = arch.attention
    if not isinstance(a, LatentAttention):
        return 0
    query = a.q_lora_rank * a.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    return query + a.kv_lora_rank * a.heads * (a.qk_nope_head_dim + a.v_head_dim)


# --- generated models and layouts ---------------------------------------------------------


@st.composite
def model_files(draw: st.DrawFn) -> str:
    """A model file's text: grouped-query or latent attention, dense or with experts."""
    layers = draw(st.integers(1, 12))
    heads = draw(st.sampled_from([1, 2, 4, 6, 8, 12]))
    lines = [
        "name: generated",
        f"layers: {layers}",
        f"hidden: {heads * draw(st.sampled_from([4, 8, 16]))}",
        f"ffn: {draw(st.sampled_from([12, 16, 24, 48, 96]))}",
        f"vocab: {draw(st.integers(1, 1000))}",
        f"tied_embeddings: {draw(st.sampled_from(['true', 'false']))}",
    ]
    if draw(st.booleans()):
        kv = draw(st.sampled_from(divisors(heads)))
        head_dim = draw(st.sampled_from([4, 8, 12]))
        norm = draw(st.sampled_from(["true", "false"]))
        lines.append(
            f"attention: {{heads: {heads}, kv_heads: {kv}, head_dim: {head_dim}, qk_norm: {norm}}}"
        )
    else:
        ranks = [draw(st.sampled_from([0, 8, 16])), draw(st.sampled_from([4, 8]))]
        dims = [draw(st.sampled_from([4, 8, 12])) for _ in range(3)]
        lines.append(
            f"attention: {{kind: latent, heads: {heads}, q_lora_rank: {ranks[0]}, "
            f"kv_lora_rank: {ranks[1]}, qk_nope_head_dim: {dims[0]}, "
            f"qk_rope_head_dim: {dims[1]}, v_head_dim: {dims[2]}}}"
        )
    if draw(st.booleans()):
        routed = draw(st.sampled_from([1, 2, 4, 6, 8, 16]))
        lines.append(
            f"experts: {{routed: {routed}, top_k: {draw(st.integers(1, routed))}, "
            f"ffn: {draw(st.sampled_from([4, 8, 12, 16]))}, shared: {draw(st.integers(0, 2))}, "
            f"dense_layers: {draw(st.integers(0, layers))}}}"
        )
    return "\n".join(lines) + "\n"


@st.composite
def trainings(draw: st.DrawFn, arch: Architecture) -> Training:
    """Training settings: every checkpointing mode and its options, every schedule, the
    ends given or not, model or hardware FLOPs."""
    checkpointing: Checkpointing = draw(st.sampled_from(CHECKPOINTING))
    options: dict[str, int | None] = {}
    if checkpointing == "full":
        option = draw(st.sampled_from(["checkpoint_every", "checkpoint_first", "checkpoint_group"]))
        options[option] = draw(st.integers(1, 4))
    schedule: Schedule = draw(
        st.sampled_from(
            ["1f1b", "gpipe", "interleaved", "loopedbfs", "zbv", "dualpipev", "dualpipe"]
        )
    )
    virtual = draw(st.integers(2, 3)) if schedule in ("interleaved", "loopedbfs") else 1
    ends = draw(st.sampled_from([(None, None), (1, None), (None, 1), (0, 2)]))
    mfu_counts: MfuCounts = draw(st.sampled_from(["model", "hardware"]))
    return Training(
        seq_len=8 * draw(st.integers(1, 64)),
        micro_batch=draw(st.integers(1, 2)),
        global_batch_tokens=draw(st.none() | st.integers(1, 10**6)),
        checkpointing=checkpointing,
        schedule=schedule,
        virtual_stages=virtual,
        first_stage_layers=ends[0],
        last_stage_layers=ends[1],
        mfu_counts=mfu_counts,
        **options,  # type: ignore[arg-type]
    )


def _runnable(
    arch: Architecture, degrees: dict[str, int], training: Training, degree: str | None = None
) -> bool:
    """Whether the model runs the layout (or, given ``degree``, whether that degree breaks
    none of its rules)."""
    problems = unrunnable(arch, degrees, training)
    return not [problem for problem in problems if degree in (None, problem.degree)]


@st.composite
def layouts(draw: st.DrawFn, arch: Architecture, training: Training, pp: int) -> Parallelism:
    """A layout the model can run over ``pp`` pipeline ranks: tp from the heads' divisors,
    etp 1 or tp, ep from the experts' divisors, cp splitting the sequence into ``2 cp``
    chunks, dp_shard large enough for the experts to borrow ``ep etp`` ranks."""
    tp = draw(
        st.sampled_from(
            [
                tp
                for tp in divisors(arch.attention.heads)[:5]
                if _runnable(arch, {"tp": tp}, training, "tp")
            ]
        )
    )
    experts = arch.experts
    ep = etp = 1
    if experts is not None:
        ep = draw(st.sampled_from(divisors(experts.routed)[:5]))
        etp = draw(
            st.sampled_from(
                [
                    e
                    for e in sorted({1, tp})
                    if _runnable(arch, {"tp": tp, "etp": e}, training, "etp")
                ]
            )
        )
    cp = draw(st.sampled_from([c for c in (1, 2, 4) if training.seq_len % (2 * c) == 0]))
    borrowed = ep * etp // math.gcd(ep * etp, cp * tp)
    dp_shard = borrowed * draw(st.integers(1, 3))
    degrees = {
        "pp": pp,
        "dp_replicate": draw(st.integers(1, 3)),
        "dp_shard": dp_shard,
        "cp": cp,
        "tp": tp,
        "ep": ep,
        "etp": etp,
    }
    assume(_runnable(arch, degrees, training))
    return Parallelism(**degrees)


def _pipelines(arch: Architecture, training: Training) -> list[int]:
    """The pp values the model can run under ``training`` (DualPipe's halves mirror each
    other: an even pp)."""
    found = []
    for pp in range(1, min(arch.layers, 8) + 1):
        if training.schedule == "dualpipe" and pp % 2:
            continue
        if _runnable(arch, {"pp": pp}, training, "pp"):
            found.append(pp)
    return found


@st.composite
def cases(draw: st.DrawFn, directory: Path) -> tuple[Architecture, Training, int]:
    """A preset or a generated model file, its training settings and a pp it can run."""
    text = draw(st.none() | model_files())
    arch = (
        PRESETS[draw(st.sampled_from(sorted(PRESETS)))] if text is None else _load(directory, text)
    )
    training = draw(trainings(arch))
    choices = _pipelines(arch, training)
    assume(choices)
    return arch, training, draw(st.sampled_from(choices))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def _load(directory: Path, text: str) -> Architecture:
    """The model file's architecture, read from a file as ``--model-file`` reads it."""
    path = directory / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    path.write_text(text)
    return load_model_file(str(path))


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.data())
def test_the_ranks_flops_sum_to_the_model_s_flops_times_the_tokens(
    model_dir: Path, data: st.DataObject
) -> None:
    arch, training, pp = data.draw(cases(model_dir))
    par = data.draw(layouts(arch, training, pp))
    resolved, _ = training.for_model(arch.layers, pp)
    tokens = microbatches(par, resolved) * par.batch * resolved.seq_len * resolved.micro_batch
    per_token = Fraction(model_flops_per_token(arch, resolved.seq_len))
    if resolved.mfu_counts == "hardware":
        per_token += recomputed_flops_per_token(arch, par, resolved)
    ranks = pipeline_flops(arch, par, training)
    assert len(ranks) == pp
    assert sum(ranks) * (par.world // pp) == per_token * tokens
    # the step runs at the pace of the rank that runs the most FLOPs (what it recomputes
    # included), its FLOPs counted as --mfu-counts says
    runs = pipeline_flops(arch, par, replace(training, mfu_counts="hardware"))
    found = estimate(arch, par, training, {})
    assert found.batch_tokens == tokens
    at_peak = found.compute_seconds * training.mfu * training.peak_tflops * 1e12
    assert at_peak == pytest.approx(float(ranks[runs.index(max(runs))]), rel=1e-12)


@PROPERTY
@given(st.data())
def test_compute_per_token_and_gpu_depends_only_on_pp(model_dir: Path, data: st.DataObject) -> None:
    """compute x world / the step's tokens is the same for every layout of one pp: tp, ep,
    etp, cp and data parallelism share the work, they do not add to it."""
    arch, training, pp = data.draw(cases(model_dir))
    first, second = data.draw(layouts(arch, training, pp)), data.draw(layouts(arch, training, pp))
    paces = [
        found.compute_seconds * par.world / found.batch_tokens
        for par in (first, second)
        for found in [estimate(arch, par, training, {})]
    ]
    assert paces[0] == pytest.approx(paces[1], rel=1e-9)


def test_deepseek_v3_s_compute_on_1024_gpus_does_not_grow_with_tp() -> None:
    """pp 16, ep 8: one micro-batch per GPU, so each step's tokens grow with the data
    parallelism that tp leaves, and the compute stays the same."""
    arch = PRESETS["deepseek-v3"]
    seconds = {
        tp: estimate(arch, Parallelism(pp=16, dp_shard=64 // tp, tp=tp, ep=8), Training(), {})
        for tp in (1, 2, 4, 8)
    }
    assert {tp: round(found.compute_seconds, 4) for tp, found in seconds.items()} == {
        1: 7.3225,
        2: 7.3225,
        4: 7.3225,
        8: 7.3225,
    }


# --- what one rank's routed experts compute ------------------------------------------------

TOY = Architecture(
    "toy", 2, 16, 16, 32, GroupedQueryAttention(4, 4, 4), Experts(8, 2, 8, shared=1, dense_layers=1)
)
#: Tokens of one tp group's micro-batch: each rank's share routes ``top_k`` copies per token
#: cyclically over the experts, the same number to each.
TOY_TOKENS = 32


def _toy_weights() -> dict[str, torch.Tensor]:
    experts = TOY.experts
    assert experts is not None
    generator = torch.Generator().manual_seed(0)
    h, f, routed, shared = TOY.hidden, experts.ffn, experts.routed, experts.shared * experts.ffn

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return {
        "gate": random(routed, h),
        "w1": random(routed, f, h),
        "w3": random(routed, f, h),
        "w2": random(routed, h, f),
        "shared.w1": random(shared, h),
        "shared.w3": random(shared, h),
        "shared.w2": random(h, shared),
    }


def _swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def _route(
    token: int,
    top_k: int,
    routed: int,
    weights: dict[str, torch.Tensor],
    x: torch.Tensor,
    balanced: bool,
) -> list[int]:
    """The experts a token goes to: the next ``top_k`` in turn (balanced, every rank's
    share of the tokens sends as many copies to each expert), or the router's top-k."""
    if balanced:
        return [(token * top_k + j) % routed for j in range(top_k)]
    chosen: list[int] = (x @ weights["gate"].T).topk(top_k).indices.tolist()
    return chosen


def _split_moe(tp: int, ep: int, etp: int, dp_shard: int, balanced: bool) -> tuple[list[int], bool]:
    """Run the mixture of experts of TOY over one pipeline stage of ``dp_shard * tp`` ranks
    as Megatron-LM runs it (``MoELayer`` under sequence parallelism; the all-to-all token
    dispatcher, ``token_dispatcher.py``): each rank routes its ``1 / tp`` of its group's
    tokens, dispatches each copy to the ep rank of its expert and, with etp, gathers the
    copies of its etp group, then applies its ``1 / etp`` of each local expert's weights;
    the shared experts run tp-split on the group's tokens. Returns the FLOPs torch's counter
    counts on each rank, and whether the ranks' partial outputs add up to the unsplit
    layer's output."""
    experts = TOY.experts
    assert experts is not None
    weights = _toy_weights()
    routed, top_k, ffn = experts.routed, experts.top_k, experts.ffn
    shared = experts.shared * ffn
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(dp_shard, TOY_TOKENS, TOY.hidden, generator=generator, dtype=torch.float64)
    ranks = dp_shard * tp
    local = routed // ep
    mine = TOY_TOKENS // tp

    def coordinates(rank: int) -> tuple[int, int, int]:
        """The rank's place in the sparse domain (efsdp, ep, etp), etp innermost: the expert
        degrees borrow the innermost of dp_shard * cp * tp."""
        return rank // (ep * etp), rank // etp % ep, rank % etp

    # every copy each rank sends: (its efsdp, the ep rank of the expert, group, token, expert)
    sent = []
    for rank in range(ranks):
        group, inside = divmod(rank, tp)
        efsdp = coordinates(rank)[0]
        for token in range(inside * mine, (inside + 1) * mine):
            for expert in _route(
                group * TOY_TOKENS + token, top_k, routed, weights, x[group, token], balanced
            ):
                sent.append((efsdp, expert // local, group, token, expert))
    out = torch.zeros_like(x)
    counts = []
    for rank in range(ranks):
        group, inside = divmod(rank, tp)
        efsdp, ep_rank, etp_rank = coordinates(rank)
        columns = slice(etp_rank * ffn // etp, (etp_rank + 1) * ffn // etp)
        with FlopCounterMode(display=False) as counter:
            # the router, on the rank's share of the sequence
            _ = x[group, inside * mine : (inside + 1) * mine] @ weights["gate"].T
            # the shared experts, column- and row-wise split over tp
            width = slice(inside * shared // tp, (inside + 1) * shared // tp)
            out[group] += _swiglu(
                x[group],
                weights["shared.w1"][width],
                weights["shared.w3"][width],
                weights["shared.w2"][:, width],
            )
            for expert in range(ep_rank * local, (ep_rank + 1) * local):
                copies = [
                    (g, t)
                    for f, e, g, t, chosen in sent
                    if (f, e) == (efsdp, ep_rank) and chosen == expert
                ]
                if not copies:
                    continue
                rows = torch.stack([x[g, t] for g, t in copies])
                partial = _swiglu(
                    rows,
                    weights["w1"][expert, columns],
                    weights["w3"][expert, columns],
                    weights["w2"][expert][:, columns],
                )
                for (g, t), value in zip(copies, partial, strict=True):
                    out[g, t] += value / top_k
        counts.append(counter.get_total_flops())
    whole = torch.zeros_like(x)
    for group in range(dp_shard):
        whole[group] = _swiglu(
            x[group], weights["shared.w1"], weights["shared.w3"], weights["shared.w2"]
        )
        for token in range(TOY_TOKENS):
            for expert in _route(
                group * TOY_TOKENS + token, top_k, routed, weights, x[group, token], balanced
            ):
                row = x[group, token : token + 1]
                whole[group, token] += (
                    _swiglu(
                        row, weights["w1"][expert], weights["w3"][expert], weights["w2"][expert]
                    )[0]
                    / top_k
                )
    return counts, torch.allclose(out, whole, rtol=1e-12, atol=1e-12)


def _estimated_moe(par: Parallelism) -> Fraction:
    """The estimate's forward FLOPs of TOY's mixture of experts on one rank per micro-batch:
    its MoE block less its dense block (the same attention and norms), plus the dense
    feed-forward, ``2 * 3 h ffn`` a token split over tp."""
    training = Training(seq_len=TOY_TOKENS, checkpointing="none")
    work = stage_work(TOY, par, rank_stage(TOY, 1, 1, 0), ("none", None, None))
    moe = replace(work, layers=1, moe_layers=1, last=False)
    dense = replace(work, layers=1, moe_layers=0, last=False)
    per_token = (
        Fraction(pass_flops(TOY, par, training, moe).forward)
        - Fraction(pass_flops(TOY, par, training, dense).forward)
        + Fraction(2 * 3 * TOY.hidden * TOY.ffn, par.tp)
    )
    return per_token * TOY_TOKENS


@pytest.mark.parametrize(
    ("tp", "ep", "etp", "dp_shard"),
    [
        (1, 1, 1, 1),
        (2, 1, 1, 1),  # etp 1 under tp: each rank runs the whole experts on its tokens
        (2, 2, 1, 1),  # ep borrowed from tp: each rank routes half the group's tokens
        (4, 4, 1, 2),
        (2, 4, 1, 2),  # ep across tp and dp_shard
        (2, 2, 2, 2),  # etp = tp: ep borrowed from dp_shard, weights split over etp
        (4, 2, 4, 2),
    ],
)
def test_one_rank_s_experts_do_what_the_estimate_gives(
    tp: int, ep: int, etp: int, dp_shard: int
) -> None:
    par = Parallelism(dp_shard=dp_shard, tp=tp, ep=ep, etp=etp)
    counts, same = _split_moe(tp, ep, etp, dp_shard, balanced=True)
    assert same
    assert counts == [_estimated_moe(par)] * (dp_shard * tp)


@pytest.mark.parametrize(("tp", "ep", "etp", "dp_shard"), [(2, 2, 1, 2), (2, 2, 2, 2)])
def test_unbalanced_routing_moves_work_between_ranks_and_keeps_its_sum(
    tp: int, ep: int, etp: int, dp_shard: int
) -> None:
    """Routed by the router's scores, some ranks get more copies than others (the estimate
    leaves load imbalance out), and the ranks together still do the estimate's work."""
    par = Parallelism(dp_shard=dp_shard, tp=tp, ep=ep, etp=etp)
    counts, same = _split_moe(tp, ep, etp, dp_shard, balanced=False)
    assert same
    assert len(set(counts)) > 1
    assert sum(counts) == _estimated_moe(par) * dp_shard * tp


# --- Megatron-LM's formula -------------------------------------------------------------------


def megatron_flops(args: Any, batch_size: int) -> tuple[Fraction, Fraction]:
    """Megatron-LM's ``num_floating_point_operations(args, batch_size)`` for a standard
    transformer with SwiGLU and no multi-token prediction (its ``transformer_flops``,
    ``megatron/training/training.py``), in exact fractions: the token-linear FLOPs and the
    core attention's (``QK^T`` and its use, halved for the causal mask), whose sum it
    returns."""
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.num_experts is None:
        num_dense_layers, num_moe_layers, num_experts_routed_to = args.num_layers, 0, 0
    else:
        pattern = args.moe_layer_freq
        num_moe_layers = sum(pattern)
        num_dense_layers = args.num_layers - num_moe_layers
        num_experts_routed_to = args.moe_router_topk
    moe_ffn_hidden_size = args.moe_ffn_hidden_size or args.ffn_hidden_size
    shared_expert_ffn_hidden_size = args.moe_shared_expert_intermediate_size or 0
    forward_backward_expansion_factor, fma_expansion_factor, ffn_expansion_factor = 3, 2, 3
    if args.multi_latent_attention:
        if args.q_lora_rank is None:
            q_term = (
                args.hidden_size
                * args.num_attention_heads
                * (args.qk_head_dim + args.qk_pos_emb_head_dim)
            )
        else:
            q_term = args.q_lora_rank * (
                args.hidden_size
                + args.num_attention_heads * (args.qk_head_dim + args.qk_pos_emb_head_dim)
                + 1
            )
        standard_self_attn_term = (
            forward_backward_expansion_factor
            * fma_expansion_factor
            * (
                q_term
                + args.kv_lora_rank
                * (
                    args.hidden_size
                    + args.num_attention_heads * (args.qk_head_dim + args.v_head_dim)
                    + 1
                )
                + args.hidden_size * args.qk_pos_emb_head_dim
                + (args.num_attention_heads * args.v_head_dim) * args.hidden_size
            )
        )
        standard_self_attn_core_term = (
            forward_backward_expansion_factor
            * fma_expansion_factor
            * (
                Fraction(
                    args.num_attention_heads * (args.qk_head_dim + args.qk_pos_emb_head_dim), 2
                )
                + Fraction(args.num_attention_heads * args.v_head_dim, 2)
            )
        )
    else:
        query_projection_size = args.kv_channels * args.num_attention_heads
        key_projection_size = args.kv_channels * args.num_query_groups
        value_projection_size = args.kv_channels * args.num_query_groups
        standard_self_attn_term = (
            forward_backward_expansion_factor
            * fma_expansion_factor
            * (
                args.hidden_size
                * (query_projection_size + key_projection_size + value_projection_size)
                + query_projection_size * args.hidden_size
            )
        )
        standard_self_attn_core_term = (
            forward_backward_expansion_factor
            * fma_expansion_factor
            * Fraction(query_projection_size, 2)
            * 2
        )
    tokens = batch_size * args.seq_length
    linear = tokens * (
        forward_backward_expansion_factor
        * fma_expansion_factor
        * args.hidden_size
        * (
            args.ffn_hidden_size * ffn_expansion_factor * num_dense_layers
            + moe_ffn_hidden_size * num_experts_routed_to * ffn_expansion_factor * num_moe_layers
            + shared_expert_ffn_hidden_size * ffn_expansion_factor * num_moe_layers
        )
        + standard_self_attn_term * args.num_layers
        + forward_backward_expansion_factor
        * fma_expansion_factor
        * args.hidden_size
        * args.padded_vocab_size
    )
    core = batch_size * args.seq_length**2 * standard_self_attn_core_term * args.num_layers
    return linear, core


def _megatron_args(arch: Architecture, seq_len: int) -> SimpleNamespace:
    """Megatron-LM's arguments for the model: its vocabulary, a multiple of 128 in every
    preset, is already what ``--make-vocab-size-divisible-by 128`` pads it to at tp 1."""
    attention = arch.attention
    experts = arch.experts
    args = SimpleNamespace(
        num_layers=arch.layers,
        hidden_size=arch.hidden,
        ffn_hidden_size=arch.ffn,
        num_attention_heads=attention.heads,
        seq_length=seq_len,
        padded_vocab_size=arch.vocab,
        swiglu=True,
        num_experts=None,
        moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None,
        moe_router_topk=0,
        moe_layer_freq=1,
        multi_latent_attention=isinstance(attention, LatentAttention),
        group_query_attention=isinstance(attention, GroupedQueryAttention),
    )
    if isinstance(attention, GroupedQueryAttention):
        args.num_query_groups = attention.kv_heads
        args.kv_channels = attention.head_dim
    else:
        args.q_lora_rank = attention.q_lora_rank or None
        args.kv_lora_rank = attention.kv_lora_rank
        args.qk_head_dim = attention.qk_nope_head_dim
        args.qk_pos_emb_head_dim = attention.qk_rope_head_dim
        args.v_head_dim = attention.v_head_dim
    if experts is not None:
        args.num_experts = experts.routed
        args.moe_router_topk = experts.top_k
        args.moe_ffn_hidden_size = experts.ffn
        args.moe_shared_expert_intermediate_size = experts.shared * experts.ffn or None
        args.moe_layer_freq = [int(arch.kind(layer) == "moe") for layer in range(arch.layers)]
    return args


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_model_flops_are_megatron_s_with_the_norms_the_router_and_the_whole_attention(
    name: str,
) -> None:
    """The estimate counts what Megatron-LM's formula counts, exactly, and three terms
    more: the norms' weights (``2 N`` a pass counts every weight: two norms a block and the
    final one; latent attention's two low-rank norms Megatron counts too), the router
    (``routed * hidden`` a block with experts, a product Megatron's formula leaves out), and
    the attention's scores over the whole sequence as PaLM counts them, twice Megatron's,
    which halves them for the causal mask."""
    arch, seq_len, batch = PRESETS[name], 4096, 3
    linear, core = megatron_flops(_megatron_args(arch, seq_len), batch)
    tokens = batch * seq_len
    found = sum(pipeline_flops(arch, Parallelism(dp_shard=batch), Training(seq_len=seq_len)))
    assert found * batch == model_flops_per_token(arch, seq_len) * tokens
    experts = arch.experts
    norms = 2 * arch.layers * arch.hidden + arch.hidden
    moe_layers = sum(arch.kind(layer) == "moe" for layer in range(arch.layers))
    router = moe_layers * experts.routed * arch.hidden if experts else 0
    assert found * batch == linear + 6 * tokens * (norms + router) + 2 * core
