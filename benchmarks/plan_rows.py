"""Every row of six plans, checked as a user would check them: can the model run it, is the
work the same whatever the layout, and does row 1 deliver the most of the rows that fit.

Run from the repository root with the interpreter meshconf is installed in::

    python benchmarks/plan_rows.py

Each plan runs ``meshconf plan ... --format json --limit 100000`` as a user would type it.
The checks here are written apart from meshconf's own, from the models' published
configurations (``features/plan/estimate/presets.py`` holds the same numbers):

- runnable: tp divides the attention heads, tp and the KV heads divide one another, tp divides
  the feed-forward width, ep divides the routed experts, every pipeline chunk can hold a
  layer, DualPipe has an even pp, and the sequence splits into ``2 cp`` chunks
  (Megatron-Core's ``TransformerConfig`` and ``ColumnParallelLinear``, DeepSeek's
  ``DualPipe.step``, torchtitan's load-balanced context parallelism);
- work: compute seconds x world / tokens, which only the pipeline's shape may change, spread
  (largest / smallest) within each pipeline degree;
- delivered: the most tokens per second per GPU of any fitting row / row 1's.

The results go into docs/plan.md ("Layouts a model cannot run"). Nothing here is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from harness import table


@dataclass(frozen=True)
class Shape:
    """What a model's runnability depends on, from its published configuration."""

    layers: int
    heads: int
    kv_heads: int | None
    ffn: int
    experts: int | None


SHAPES = {
    "llama3-8b": Shape(32, 32, 8, 14336, None),
    "llama3-70b": Shape(80, 64, 8, 28672, None),
    "mixtral-8x7b": Shape(32, 32, 8, 14336, 8),
    "deepseek-v3": Shape(61, 128, None, 18432, 256),
    "qwen3-30b-a3b": Shape(48, 32, 4, 6144, 128),
}

#: 16 GB200 NVL72 racks, 4 GPUs a node, as a user writes them.
GB200_CONFIG = """\
world_size: 1152
levels:
  - {name: node, size: 4, bandwidth_gb_s: 900}
  - {name: nvlink, size: 72, bandwidth_gb_s: 900}
degrees:
  dp_shard: -1
"""
#: DeepSeek-V3's report's settings (section 3), given to both models on GB200.
GB200_OPTIONS = (
    "--gpu", "gb200", "--seq-len", "4096", "--global-batch-tokens", "62914560",
    "--pp-schedule", "dualpipe", "--ep-overlap", "--dispatch-dtype", "fp8",
    "--optimizer-dtype", "bf16", "--zero-stage", "1", "--activation-dtype", "fp8",
    "--moe-max-nodes", "4",
)  # fmt: skip
H100 = ("--gpus-per-node", "8")


def plans(config: Path) -> list[tuple[str, str, int, list[str]]]:
    """(title, model, seq_len, plan arguments) of the six plans."""
    return [
        ("llama3-8b, 96 H100", "llama3-8b", 8192, ["--world-size", "96", *H100]),
        ("mixtral-8x7b, 96 H100", "mixtral-8x7b", 8192, ["--world-size", "96", *H100]),
        ("llama3-70b, 1,024 H100", "llama3-70b", 8192, ["--world-size", "1024", *H100]),
        ("deepseek-v3, 1,024 H100", "deepseek-v3", 8192, ["--world-size", "1024", *H100]),
        ("deepseek-v3, 1,152 GB200", "deepseek-v3", 4096, [str(config), *GB200_OPTIONS]),
        ("qwen3-30b-a3b, 1,152 GB200", "qwen3-30b-a3b", 4096, [str(config), *GB200_OPTIONS]),
    ]


def schedule(arguments: list[str]) -> str:
    """The plan's pipeline schedule."""
    if "--pp-schedule" in arguments:
        return arguments[arguments.index("--pp-schedule") + 1]
    return "1f1b"


def chunks_per_rank(arguments: list[str]) -> int:
    """Model chunks the layers are split over, per pipeline rank, under the plan's schedule:
    two in a V (``dualpipev``, ``zbv``); DualPipe's two chunks on a rank are copies of the
    stages ``r`` and ``pp - 1 - r`` of one split into ``pp`` (DeepSeek-V3 report, 3.2.1)."""
    return 2 if schedule(arguments) in ("dualpipev", "zbv") else 1


def problems(
    shape: Shape, degrees: dict[str, int], seq_len: int, arguments: list[str]
) -> list[str]:
    """Why a model cannot run a row, one reason per broken rule."""
    chunks = chunks_per_rank(arguments)
    tp, ep, cp, pp = degrees["tp"], degrees.get("ep", 1), degrees["cp"], degrees["pp"]
    found = []
    if shape.heads % tp:
        found.append("tp does not divide the heads")
    if shape.kv_heads is not None and shape.kv_heads % tp and tp % shape.kv_heads:
        found.append("tp and the KV heads do not divide one another")
    if shape.ffn % tp:
        found.append("tp does not divide the feed-forward width")
    if shape.experts is not None and shape.experts % ep:
        found.append("ep does not divide the experts")
    if pp * chunks > shape.layers:
        found.append("more pipeline chunks than layers")
    if schedule(arguments) == "dualpipe" and pp > 1 and pp % 2:
        found.append("an odd pp, which DualPipe does not pair (num_ranks % 2 == 0)")
    if cp > 1 and seq_len % (2 * cp):
        found.append("the sequence does not split into 2 cp chunks")
    return found


def main() -> None:
    print("# Every row of six plans\n")
    print("Command: `python benchmarks/plan_rows.py`\n")
    summary, reasons_rows = [], []
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "gb200.yaml"
        config.write_text(GB200_CONFIG)
        for title, model, seq_len, arguments in plans(config):
            command = [sys.executable, "-m", "meshconf", "plan", *arguments, "--model", model]
            command += ["--format", "json", "--limit", "100000"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            if done.returncode:
                summary.append([title, "refused", "", "", "", "", done.stderr.strip()[:120]])
                continue
            report = json.loads(done.stdout)
            rows = report["assignments"]
            shape = SHAPES[model]
            world = report["world_size"]
            reasons: Counter[str] = Counter()
            bad = 0
            work: dict[int, list[float]] = defaultdict(list)
            for row in rows:
                found = problems(shape, row["degrees"], seq_len, arguments)
                bad += bool(found)
                reasons.update(found)
                if not found:
                    per_token = row["compute_seconds"] * world / row["batch_tokens"]
                    work[row["degrees"]["pp"]].append(per_token)
            spreads = [max(values) / min(values) for values in work.values()]
            wide = sum(spread > 1.15 for spread in spreads)
            delivered = [
                row["batch_tokens"] / row["step_seconds"] / world for row in rows if row["fits"]
            ]
            first = rows[0] if rows else None
            if first is not None and first["fits"] and delivered:
                ratio = f"{max(delivered) / delivered[0]:.2f}"
            else:
                ratio = "row 1 does not fit"
            summary.append(
                [
                    title,
                    str(len(rows)),
                    str(bad),
                    str(sum(row["fits"] for row in rows)),
                    f"{wide} of {len(spreads)}, up to {max(spreads, default=1):.2f}x",
                    ratio,
                    " ".join(f"{k}={v}" for k, v in rows[0]["degrees"].items()) if rows else "",
                ]
            )
            reasons_rows += [[title, reason, str(count)] for reason, count in reasons.items()]
            left = report.get("left_out", {})
            reasons_rows += [[title, f"left out by plan: {r}", str(n)] for r, n in left.items()]
    headers = [
        "plan", "rows", "not runnable", "fit", "pp groups with work spread > 15%",
        "best fitting ÷ row 1, tokens/s/GPU", "row 1",
    ]  # fmt: skip
    print(table(headers, summary, right=(1, 2, 3)))
    print("\nReasons:\n")
    print(table(["plan", "reason", "rows"], reasons_rows, right=(2,)))


if __name__ == "__main__":
    main()
