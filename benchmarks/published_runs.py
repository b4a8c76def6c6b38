"""The estimate against published training runs: ``meshconf plan`` with each run's layout,
model, hardware and options, as a user would type it.

Run from the repository root with the interpreter meshconf is installed in::

    python benchmarks/published_runs.py

For each run it prints whether the published layout fits, its memory with and without the
runtime terms (the CUDA context, NCCL's buffers: published figures), its headroom, its rank
among the layouts of ``plan`` at the same world size (with only the run's tensor, context and
expert parallelism pinned, as a user who knows those three would ask), the step time at the
run's own
MFU taken over the compute (``--mfu``) against the published step, and, taking the MFU over
the whole step as it was measured (``--mfu-over step``), the share of the peak the compute
needs. Only figures the cited source states are used; where the source gives no memory, the
table has none, and where it gives no MFU, the MFU is the one its step gives. A published
step comes from the source's throughput: tokens per step over the world's tokens per
second. The results go into docs/estimate.md ("Published runs"). Nothing here is asserted.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass

from harness import table

#: H100 SXM and H800, from their presets (docs/plan.md): dense bf16 peak 989 TFLOPs, NVLink
#: 450 GB/s per direction on H100, 200 GB/s on H800, and 400 Gb/s of InfiniBand per GPU.
H100 = ("--gpu", "h100-sxm", "--gpus-per-node", "8")
H800 = ("--gpu", "h800", "--gpus-per-node", "8")
#: Llama 3's pipeline (The Llama 3 Herd of Models, section 3.3.2): its own schedule, N = 5
#: micro-batches in a group (the section's example), a first chunk of the embedding alone and
#: a last one of the output alone over 8 chunks a rank; FSDP sharding the optimizer state and
#: the gradients but keeping the weights after the forward pass (section 3.3.2: ZeRO 2); its
#: tensor parallelism is that of Shoeybi et al. and Korthikanti et al. (MLSys 2023), whom the
#: section cites for it: Megatron-LM's sequence parallelism.
LLAMA3_405B = (
    "--model", "llama3-405b", "--global-batch-tokens", "16777216", "--pp-schedule", "llama3",
    "--virtual-stages", "8", "--microbatch-group", "5", "--first-stage-layers", "0",
    "--last-stage-layers", "0", "--zero-stage", "2", "--sequence-parallel", "megatron",
)  # fmt: skip
#: "we could pretrain Llama 3 on sequences of 8K tokens without activation checkpointing"
#: (section 3.3.2); the long-context stage's recomputation is not stated, so the default.
WITHOUT_RECOMPUTATION = ("--activation-checkpointing", "none")


#: DeepSeek-V3's settings, as its report states them (the sources of its run below); its
#: recomputation: "We recompute all RMSNorm operations and MLA up-projections during
#: back-propagation" (section 3.2.3), "we cache the inputs of the SwiGLU operator and
#: recompute its output in the backward pass" (section 3.3.3): norms-latent-swiglu.
DEEPSEEK_V3 = (
    "--model", "deepseek-v3", "--seq-len", "4096", "--global-batch-tokens", "62914560",
    "--zero-stage", "1", "--moe-max-nodes", "4", "--dispatch-dtype", "fp8",
    "--pp-schedule", "dualpipe", "--ep-overlap", "--activation-dtype", "fp8",
    "--optimizer-dtype", "bf16", "--activation-checkpointing", "norms-latent-swiglu",
)  # fmt: skip
#: torchtitan's benchmark H100s: 96 GB of HBM2e, 95 GiB as torchtitan's memory percentages
#: give it (71.99 GiB is 75.75%, pytorch/pytorch PR #129721), at a 500 W power limit.
TORCHTITAN_H100 = ("--gpu", "h100-sxm", "--gpus-per-node", "8", "--gpu-memory-gib", "95")
#: torchtitan's Llama 3.1 8B runs of benchmarks/llama3_h100_202412_torchtitan.md, tables 1
#: and 3: FSDP alone, eager (no torch.compile, no Float8), local batch 2 of 8,192 tokens
#: (llama3_8b.toml), torchtitan's per-op selective activation checkpointing.
TORCHTITAN_8B = (
    "--model", "llama3-8b", "--seq-len", "8192", "--micro-batch", "2",
    "--activation-checkpointing", "selective",
)  # fmt: skip
TORCHTITAN_SOURCE = (
    "pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (torchtitan 9dec370, "
    "torch 1963fc8, run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
)


#: What a user who knows the run's tensor, context and expert parallelism pins in ``plan``.
PINNED = ("tp", "cp", "ep")


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    world_size: int
    layout: dict[str, int]
    pinned: tuple[str, ...]
    options: tuple[str, ...]
    published_step_s: float
    published_mfu: float | None
    #: The peak memory per GPU the source states (torchtitan: ``max_reserved``), GiB.
    published_gib: float | None = None


RUNS = (
    Run(
        "torchtitan Llama 3.1 8B, 8 H100",
        TORCHTITAN_SOURCE + "table 1, FSDP: 8 GPUs, global batch 16, 5,762 tokens/s a GPU, "
        "82.4 GiB (max reserved)",
        8,
        {"pp": 1, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 1},
        PINNED,
        (*TORCHTITAN_H100, *TORCHTITAN_8B, "--global-batch-tokens", str(16 * 8192)),
        2 * 8192 / 5762,
        None,
        82.4,
    ),
    Run(
        "torchtitan Llama 3.1 8B, 128 H100",
        TORCHTITAN_SOURCE + "table 3, FSDP: 128 GPUs, global batch 256, 5,605 tokens/s a GPU, "
        "67.0 GiB (max reserved)",
        128,
        {"pp": 1, "dp_replicate": 1, "dp_shard": 128, "cp": 1, "tp": 1},
        PINNED,
        (*TORCHTITAN_H100, *TORCHTITAN_8B, "--global-batch-tokens", str(256 * 8192)),
        2 * 8192 / 5605,
        None,
        67.0,
    ),
    Run(
        "Llama 3.1 405B, 8,192 H100",
        "Dubey et al., The Llama 3 Herd of Models (2024), table 4: TP 8, CP 1, PP 16, DP 64, "
        "seq 8,192, 16M tokens a step, 430 TFLOPs per GPU, 43% MFU; section 3.3.2: its "
        "pipeline schedule, ZeRO 2, no activation checkpointing at 8K",
        8192,
        {"pp": 16, "dp_replicate": 1, "dp_shard": 64, "cp": 1, "tp": 8},
        PINNED,
        (*H100, *LLAMA3_405B, *WITHOUT_RECOMPUTATION, "--seq-len", "8192"),
        0.0,
        0.43,
    ),
    Run(
        "Llama 3.1 405B, 16,384 H100",
        "same, table 4: TP 8, CP 1, PP 16, DP 128, seq 8,192, 16M tokens, 400 TFLOPs, 41% MFU",
        16384,
        {"pp": 16, "dp_replicate": 1, "dp_shard": 128, "cp": 1, "tp": 8},
        PINNED,
        (*H100, *LLAMA3_405B, *WITHOUT_RECOMPUTATION, "--seq-len", "8192"),
        0.0,
        0.41,
    ),
    Run(
        "Llama 3.1 405B, 16,384 H100, long context",
        "same, table 4: TP 8, CP 16, PP 16, DP 8, seq 131,072, 16M tokens, 380 TFLOPs, 38% MFU",
        16384,
        {"pp": 16, "dp_replicate": 1, "dp_shard": 8, "cp": 16, "tp": 8},
        PINNED,
        (*H100, *LLAMA3_405B, "--seq-len", "131072"),
        0.0,
        0.38,
    ),
    Run(
        "DeepSeek-V3, 2,048 H800",
        "DeepSeek-V3 technical report (2024), sections 3.2 and 4.2: PP 16, EP 64, ZeRO-1 data "
        "parallelism, no TP, seq 4,096, 15,360 sequences a step, routing to at most 4 nodes, "
        "fp8 dispatch, DualPipe (section 3.2.1) hiding the experts' all-to-all under compute; "
        "section 3.3.3: the linear layers' inputs cached in fp8 (the one after attention in "
        "E5M6), the experts' SwiGLU inputs cached in fp8 and its output recomputed, AdamW's "
        "moments in bf16; section 3.2.3: the norms and latent attention's up-projections "
        "recomputed, no whole block (norms-latent-swiglu); 180K H800 GPU hours per trillion "
        "tokens (no MFU published)",
        2048,
        {"pp": 16, "dp_replicate": 1, "dp_shard": 128, "cp": 1, "tp": 1, "ep": 64},
        PINNED,
        (*H800, *DEEPSEEK_V3),
        # tokens per step over tokens per second: 2,048 GPUs take 180,000 GPU hours a 1e12
        62914560 / (1e12 / (180_000 * 3600 / 2048)),
        None,
    ),
)


def _plan(run: Run, pins: dict[str, int], *options: str) -> list[dict[str, object]]:
    command = [sys.executable, "-m", "meshconf", "plan", "--world-size", str(run.world_size)]
    for name, value in pins.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    command += [*run.options, *options, "--format", "json", "--limit", "100000"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    rows: list[dict[str, object]] = json.loads(done.stdout)["assignments"]
    return rows


#: The memory terms of ``plan --format json``, in its order.
TERMS = ("params", "grads", "optimizer", "gathers", "activations", "runtime", "total")


def _number(row: dict[str, object], key: str) -> float:
    value = row[key]
    assert isinstance(value, (int, float))
    return float(value)


def main() -> None:
    print("# The estimate against published runs\n")
    print("Command: `python benchmarks/published_runs.py`\n")
    rows, terms, peaks = [], [], []
    gaps: list[float] = []
    for run in RUNS:
        if run.published_mfu is None:
            # the MFU the published step gives, with meshconf's count of the model's FLOPs
            (reference,) = _plan(run, run.layout, "--mfu", "0.4")
            mfu = 0.4 * _number(reference, "compute_seconds") / run.published_step_s
        else:
            mfu = run.published_mfu
        at_mfu = ("--mfu", f"{mfu:.4f}")
        (row,) = _plan(run, run.layout, *at_mfu)
        (over_step,) = _plan(run, run.layout, *at_mfu, "--mfu-over", "step")
        ranked = _plan(run, {name: run.layout.get(name, 1) for name in run.pinned}, *at_mfu)
        degrees = {name: run.layout.get(name, 1) for name in ranked[0]["degrees"]}  # type: ignore[attr-defined]
        rank = next(index for index, other in enumerate(ranked, 1) if other["degrees"] == degrees)
        estimated = _number(row, "step_seconds")
        # Llama 3 states TFLOPs per GPU: its step is the estimate's compute at that MFU.
        published = run.published_step_s or _number(row, "compute_seconds")
        needed = over_step["compute_mfu"]
        mfu_text = f"{mfu:.2f}" + (" (from the step)" if run.published_mfu is None else "")
        memory = row["memory_gib"]
        assert isinstance(memory, dict)
        terms.append([run.name, *(f"{memory[term]:.2f}" for term in TERMS)])
        if run.published_gib is not None:
            estimate = float(memory["total"])
            gap = math.log(estimate / run.published_gib)
            peaks.append(
                [
                    run.name,
                    f"{run.published_gib:.1f}",
                    f"{estimate:.2f}",
                    f"{memory['runtime']:.2f}",
                    f"{estimate / run.published_gib:.3f}",
                    f"{gap:+.3f}",
                ]
            )
            gaps.append(abs(gap))
        rows.append(
            [
                run.name,
                "yes" if row["fits"] else f"no ({row['problem'] or row['largest_term']})",
                f"{memory['total']:.2f}",
                f"{memory['total_without_runtime']:.2f}",
                f"{row['headroom_gib']}",
                f"{rank} of {len(ranked)} ({', '.join(run.pinned)} pinned)",
                mfu_text,
                f"{estimated:.2f}",
                f"{published:.2f}",
                f"{estimated / published:.2f}",
                "cannot reach it" if needed is None else f"{needed:.2f}",
            ]
        )
    headers = [
        "run", "fits", "GiB", "GiB without runtime", "headroom GiB", "rank in plan", "MFU",
        "step s, MFU over compute", "step s, published", "ratio",
        "compute needs (MFU over the step)",
    ]  # fmt: skip
    print(table(headers, rows, right=(2, 3, 4, 6, 7, 8, 9, 10)))
    print("\nMemory by term, GiB per GPU on the rank that needs the most:\n")
    print(table(["run", *TERMS], terms, right=tuple(range(1, len(TERMS) + 1))))
    print("\nPeak memory against the published peak (max reserved), GiB per GPU:\n")
    headers = ["run", "published", "estimate", "of it runtime", "ratio", "ln(ratio)"]
    print(table(headers, peaks, right=(1, 2, 3, 4, 5)))
    print(
        f"\n|ln(estimate / published)| over {len(gaps)} peaks: median "
        f"{statistics.median(gaps):.3f}, worst {max(gaps):.3f}"
    )
    print("\nSources:\n")
    for run in RUNS:
        print(f"- {run.name}: {run.source}.")


if __name__ == "__main__":
    main()
