"""The text and JSON of one layout's estimate; and, for ``--explain``, its memory by term,
what each term holds under the settings and its source (docs/estimate.md has each check)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.architecture import Architecture
from meshconf.features.plan.estimate.memory import Memory
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.estimate.terms import NOT_COUNTED, memory_terms

#: The terms of what the step's tensors hold, which torch's memory tracker measures on CPU.
STATE_PARTS = ("params", "grads", "optimizer", "gathers", "activations")
#: Every memory term: the step's tensors, then what only a GPU holds.
MEMORY_PARTS = (*STATE_PARTS, "runtime")


def gib(value: float) -> float:
    return round(value / GIB, 2)


#: What lowers each memory term, for a layout that does not fit.
_REMEDIES: Mapping[str, str] = {
    "params": "shard the weights over more ranks (a larger dp_shard with --zero-stage 3) or "
    "split them with tp or pp",
    "grads": "shard the gradients over more ranks (a larger dp_shard with --zero-stage 2 or 3) "
    "or split them with tp or pp",
    "optimizer": "shard the optimizer state over more ranks (a larger dp_shard) or split it "
    "with tp or pp",
    "gathers": "reshard after each forward pass (--reshard-after-forward always), or hold "
    "fewer layers per rank (a larger pp)",
    "activations": "recompute more (--activation-checkpointing full, every block), run "
    "shorter micro-batches, or split the sequence with tp or cp",
    "runtime": "send over fewer communicators, or give the figures measured on your GPUs "
    "(--runtime-gib, --nccl-communicator-gib)",
}


def remedy(memory: Memory, term: str) -> str:
    """What lowers ``term`` at the phase where ``memory`` peaks."""
    if term == "gathers" and memory.phase != "block":
        return "split the output and the embedding with tp, which splits their vocabulary"
    return _REMEDIES[term]


def headroom_gib(found: Estimate) -> float:
    """GiB left on the GPU; negative for a layout that does not fit."""
    return round(found.headroom / GIB, 2)


def largest_term(found: Estimate) -> str:
    return max(MEMORY_PARTS, key=lambda part: int(getattr(found.memory, part)))


def memory_json(found: Estimate) -> dict[str, Any]:
    """The estimate of one layout as ``--format json`` gives it."""
    memory = found.memory
    return {
        "memory_gib": _memory_parts(memory, gib),
        # exact, for a model whose figures round to nothing in GiB
        "memory_bytes": _memory_parts(memory, int),
        "runtime_gib": _runtime_json(found),
        "memory_pp_rank": memory.pp_rank,
        "memory_peak_phase": memory.phase,
        "headroom_gib": headroom_gib(found),
        "largest_term": largest_term(found),
        "fits": found.fits,
        "problem": found.problem,
        "microbatches": found.microbatches,
        "batch_tokens": found.batch_tokens,
        "compute_seconds": round(found.compute_seconds, 4),
        "bubble_fraction": round(found.bubble_fraction, 4),
        "communication": {
            name: {
                "bytes": flow.bytes,
                "seconds": round(flow.seconds, 4),
                "crosses_nodes": flow.crosses_nodes,
            }
            for name, flow in found.traffic.items()
        },
        "exposed_communication_seconds": round(found.exposed_seconds, 4),
        "compute_mfu": None if found.compute_mfu is None else round(found.compute_mfu, 4),
        "step_seconds": round(found.step_seconds, 4),
    }


def _memory_parts(memory: Memory, unit: Callable[[float], float]) -> dict[str, float]:
    terms = {part: getattr(memory, part) for part in MEMORY_PARTS}
    totals = {"total": memory.total, "total_without_runtime": memory.training_state}
    return {name: unit(value) for name, value in {**terms, **totals}.items()}


def _runtime_json(found: Estimate) -> dict[str, Any]:
    runtime = found.runtime
    if runtime.given is not None:
        return {"given": gib(runtime.given)}
    return {
        "cuda_context": gib(runtime.cuda_context),
        "nccl": gib(runtime.nccl),
        "allocator": gib(runtime.allocator),
        "communicators": dict(runtime.communicators),
    }


def estimate_json(model: Architecture, found: Estimate) -> dict[str, Any]:
    """The estimate of one layout, with the model it is for, as ``--format json`` gives it."""
    return {"model": model.name, **memory_json(found)}


def settings_json(model: Architecture, training: Training) -> dict[str, Any]:
    """The model and every setting a plan estimated with, as ``--format json`` gives them."""
    return {"model": model.name, "training": dict(training.__dict__)}


def settings_line(model: Architecture, training: Training) -> str:
    """One line naming the model and the settings an estimate used."""
    count = model.parameter_count()
    # 70.6B from a billion on; below, every digit: 3,660,032
    parameters = f"{count / 1e9:.1f}B" if count >= 10**9 else f"{count:,}"
    batch = training.global_batch_tokens
    batch_text = "one micro-batch per GPU" if batch is None else f"{batch} tokens per step"
    schedule: str = training.schedule
    resharding = (
        ""
        if training.reshard_after_forward == "default"
        else f"; reshard after forward: {training.reshard_after_forward}"
    )
    if training.zero_stage != 3:
        resharding += f"; ZeRO stage {training.zero_stage}"
    if training.fp8_param_gather:
        resharding += "; fp8 param gather"
    if training.activation_dtype is not None:
        resharding += f"; {training.activation_dtype} activations"
    if training.optimizer_dtype != "fp32":
        resharding += f"; {training.optimizer_dtype} optimizer moments"
    if training.sequence_parallel != "dtensor":
        resharding += f"; sequence parallelism: {training.sequence_parallel}"
    if training.norm_kernel != "fused":
        resharding += f"; {training.norm_kernel} norms"
    if training.mfu_over == "step":
        resharding += f"; MFU {training.mfu:g} over the step"
    if training.layers_per_stage is not None:
        schedule += f", {training.layers_per_stage} layers a chunk"
    elif training.pipeline_schedule.looped:
        schedule += f" x{training.virtual_stages}"
    if training.microbatch_group is not None:
        schedule += f" in groups of {training.microbatch_group} micro-batches"
    ends = (training.first_stage_layers, training.last_stage_layers)
    weights = training.split_weights
    if ends != (None, None):
        first, last = ("-" if size is None else str(size) for size in ends)
        schedule += f" (first and last chunks of {first} and {last} layers)"
    elif weights is not None:
        schedule += f" (the embedding and output as {weights[0]} and {weights[1]} layers)"
    every = ""
    if training.checkpoint_every is not None:
        every = f" of 1 block in {training.checkpoint_every}"
    elif training.checkpoint_first is not None:
        every = f" of the first {training.checkpoint_first} blocks of each chunk"
    elif training.checkpoint_group is not None:
        every = f" in groups of {training.checkpoint_group} blocks"
    return (
        f"model {model.name} ({parameters} parameters); seq "
        f"{training.seq_len}, micro-batch {training.micro_batch}, {batch_text}; "
        f"{training.checkpointing} checkpointing{every}, {schedule}; "
        f"{training.param_dtype} params, {training.grad_dtype} grads; "
        f"{training.gpu}, {training.gpu_memory_gib:g} GiB per GPU{resharding}"
    )


def hardware_line(training: Training) -> str:
    """The GPU an estimate assumed, with the figures it used (the preset's, or the options
    that replace them)."""
    return (
        f"gpu {training.gpu}: {training.gpu_memory_gib:g} GiB, {training.peak_tflops:g} TFLOP/s "
        f"dense bf16 at MFU {training.mfu:g}, {training.intra_node_gb_s:g} GB/s inside a node, "
        f"{training.inter_node_gb_s:g} GB/s across nodes"
    )


def memory_lines(found: Estimate, training: Training) -> list[str]:
    """The memory breakdown, communication and step time of one layout, as text; first, for
    a layout that cannot run for a reason other than memory, that reason."""
    gpu_memory_gib = training.gpu_memory_gib
    memory = found.memory
    parts = ", ".join(f"{part} {gib(getattr(memory, part)):g}" for part in MEMORY_PARTS)
    headroom = headroom_gib(found)
    if found.headroom >= 0:
        verdict = f"fits in {gpu_memory_gib:g} GiB, {headroom:g} GiB to spare"
    else:
        term = largest_term(found)
        verdict = (
            f"does NOT fit in {gpu_memory_gib:g} GiB, {-headroom:g} GiB over; the largest "
            f"term is {term} ({gib(getattr(memory, term)):g}): {remedy(memory, term)}"
        )
    share = ""
    if training.mfu_over == "step":
        share = (
            f" ({found.compute_mfu:.3g} of peak)"
            if found.compute_mfu is not None
            else " (at the peak: the bubble and the communication not hidden leave no time to "
            "reach --mfu)"
        )
    lines = [] if found.problem is None else [f"cannot run: {found.problem}"]
    lines += [
        f"memory per GPU (GiB, pipeline rank {memory.pp_rank}): {parts}; total "
        f"{gib(memory.total):g} ({gib(memory.training_state):g} without runtime): {verdict}",
        f"step: {found.microbatches} micro-batch{'' if found.microbatches == 1 else 'es'}, "
        f"compute {found.compute_seconds:.3g} s"
        f"{share}, "
        f"communication not hidden {found.exposed_seconds:.3g} s, pipeline bubble "
        f"{found.bubble_fraction:.3g}, estimated {found.step_seconds:.3g} s",
    ]
    if found.traffic:
        flows = ", ".join(
            f"{name} {flow.bytes / 1e9:.3g} GB {flow.seconds:.3g} s"
            for name, flow in found.traffic.items()
        )
        lines.append(f"communication per step and GPU: {flows}")
    return lines


def explain_json(found: Estimate, training: Training) -> dict[str, Any]:
    """The memory by term as ``--format json`` gives it beside the estimate."""
    terms = [
        {"term": term.name, "gib": gib(term.bytes), "holds": term.holds, "source": term.source}
        for term in memory_terms(found, training)
    ]
    return {"terms": terms, "not_counted": NOT_COUNTED}


def explain_lines(found: Estimate, training: Training) -> list[str]:
    """The memory by term as text: a table, then what is not counted."""
    terms = memory_terms(found, training)
    lines = [
        f"memory by term (GiB, pipeline rank {found.memory.pp_rank}; each term's check in "
        "docs/estimate.md):"
    ]
    width = max(len(term.name) for term in terms)
    for term in terms:
        lines.append(f"  {term.name:<{width}}  {gib(term.bytes):>7.2f}  {term.holds}")
        lines.append(f"  {'':<{width}}  {'':>7}  source: {term.source}")
    lines.append(f"not counted: {NOT_COUNTED}")
    return lines
