"""KempnerForge's ``[distributed]`` table as meshconf degrees and runtime options: its ep
ranks are ranks of their own, which meshconf borrows from dp_shard * cp * tp instead."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from meshconf.core.degrees import AUTO, product_text
from meshconf.core.errors import describe_value
from meshconf.features.convert.draft import Draft, integer_problem, integers, unknown_keys

#: Every key of KempnerForge's ``DistributedConfig``, in its order.
KEMPNERFORGE_KEYS = (
    "dp_shard",
    "dp_replicate",
    "tp",
    "pp",
    "pp_schedule",
    "cp",
    "ep",
    "nccl_timeout_sec",
    "backend",
)
#: KempnerForge's world factors, in the order of its world-size formula.
KEMPNERFORGE_FACTORS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
#: The backend strings meshconf can express, and the ``runtime.backend`` each one is.
KEMPNERFORGE_BACKENDS = {
    "cpu:gloo,cuda:nccl": "auto",
    "cuda:nccl,cpu:gloo": "auto",
    "nccl": "nccl",
    "gloo": "gloo",
}


def from_kempnerforge(draft: Draft, table: Mapping[str, Any]) -> None:
    unknown_keys(
        draft,
        table,
        KEMPNERFORGE_KEYS,
        "a key of KempnerForge's [distributed]",
        f"; its keys are {', '.join(KEMPNERFORGE_KEYS)}",
    )
    identity = {name: name for name in KEMPNERFORGE_FACTORS}
    written = integers(draft, table, identity)
    runtime_notes = _kempnerforge_runtime(draft, table)
    draft.check()
    factors = {name: 1 for name in KEMPNERFORGE_FACTORS} | {"dp_shard": AUTO} | written
    if draft.world_size is not None:
        _kempnerforge_world(draft, factors, draft.world_size)
        draft.check()
    draft.origins |= {("degrees", name): name for name in KEMPNERFORGE_FACTORS}
    draft.degrees = written
    if factors["ep"] > 1:
        _borrow_expert_ranks(draft, factors)
    if factors["cp"] > 1:
        draft.notes.append(
            f"cp = {factors['cp']}: KempnerForge counts it in its world size, but has no mesh dim "
            "for it and applies no context parallelism. In meshconf, cp has its own groups in "
            "the dataloading domain and is part of fsdp, loss and efsdp."
        )
    draft.notes += runtime_notes
    if "pp_schedule" in table:
        draft.notes.append(
            "pp_schedule is not converted: it is not a mesh setting; keep it in the training "
            "config."
        )


def _kempnerforge_runtime(draft: Draft, table: Mapping[str, Any]) -> list[str]:
    """Convert nccl_timeout_sec and backend into draft.runtime; return their notes."""
    notes = []
    if "nccl_timeout_sec" in table:
        timeout = table["nccl_timeout_sec"]
        problem = integer_problem(timeout, auto=False)
        if problem is not None:
            draft.fail("nccl_timeout_sec", problem)
        else:
            draft.runtime["timeout_s"] = timeout
            draft.origins[("runtime", "timeout_s")] = "nccl_timeout_sec"
            draft.comments["runtime.timeout_s"] = "KempnerForge's nccl_timeout_sec"
            notes.append(
                f"nccl_timeout_sec = {timeout} is runtime.timeout_s. KempnerForge gives it to "
                "init_process_group, for the default group; meshconf gives it to the default "
                "group and to every group it creates."
            )
    if "backend" in table:
        notes += _kempnerforge_backend(draft, table["backend"])
    return notes


def _kempnerforge_backend(draft: Draft, backend: Any) -> list[str]:
    converted = KEMPNERFORGE_BACKENDS.get(backend) if isinstance(backend, str) else None
    if converted is None:
        choices = ", ".join(repr(text) for text in KEMPNERFORGE_BACKENDS)
        draft.fail(
            "backend",
            f"expected one of {choices}, got {describe_value(backend)}: meshconf's "
            "runtime.backend is auto, nccl or gloo",
        )
        return []
    draft.runtime["backend"] = converted
    draft.origins[("runtime", "backend")] = "backend"
    draft.comments["runtime.backend"] = f"KempnerForge's backend {backend!r}"
    if converted != "auto":
        return [f"backend = {backend!r} is runtime.backend: {converted}."]
    return [
        f"backend = {backend!r} is runtime.backend: auto. KempnerForge's string gives every "
        "group two backends, gloo for CPU tensors and nccl for CUDA tensors; meshconf gives "
        "each group one, nccl on GPUs and gloo on CPU."
    ]


def _kempnerforge_world(draft: Draft, factors: Mapping[str, int], world_size: int) -> None:
    """KempnerForge's own check: its six factors, ep included, multiply to the world size."""
    if factors["dp_shard"] == AUTO:
        others = tuple(name for name in KEMPNERFORGE_FACTORS if name != "dp_shard")
        divisor = math.prod(factors[name] for name in others)
        if world_size % divisor:
            draft.fail(
                "dp_shard",
                f"-1 cannot fill the remaining ranks: world_size {world_size} is not divisible "
                f"by {product_text(factors, others)} = {divisor} (KempnerForge counts ep as a "
                "world factor)",
            )
        return
    product = math.prod(factors[name] for name in KEMPNERFORGE_FACTORS)
    if product != world_size:
        draft.fail(
            None,
            f"{product_text(factors, KEMPNERFORGE_FACTORS)} = {product} != world_size "
            f"{world_size} (KempnerForge counts ep as a world factor)",
        )


def _borrow_expert_ranks(draft: Draft, factors: Mapping[str, int]) -> None:
    """KempnerForge's ep ranks are ranks of their own; meshconf's are borrowed from
    dp_shard * cp * tp, so dp_shard grows by ep, and etp = tp keeps KempnerForge's groups."""
    ep, tp, dp_shard = factors["ep"], factors["tp"], factors["dp_shard"]
    if dp_shard == AUTO:
        draft.comments["degrees.dp_shard"] = "fills in as KempnerForge's dp_shard * ep"
        how = (
            "-1 stays -1: meshconf fills it with world_size / (pp * dp_replicate * cp * tp), "
            "which is KempnerForge's dp_shard times ep"
        )
    else:
        draft.degrees["dp_shard"] = dp_shard * ep
        draft.comments["degrees.dp_shard"] = f"KempnerForge's dp_shard {dp_shard} * ep {ep}"
        how = f"dp_shard is KempnerForge's dp_shard times ep: {dp_shard} * {ep} = {dp_shard * ep}"
    draft.notes.append(
        "KempnerForge counts ep as a world factor: dp_replicate * dp_shard * tp * pp * cp * ep "
        "is its world size. meshconf's experts borrow their ranks from dp_shard * cp * tp "
        f"instead, so {how}."
    )
    if tp > 1:
        draft.degrees["etp"] = tp
        draft.comments["degrees.etp"] = "= tp, for KempnerForge's expert groups"
    if factors["cp"] == 1:
        draft.notes.append(_expert_groups_note(tp))
    draft.notes.append(
        "The data split changes. KempnerForge's data-parallel ranks are dp_replicate * "
        f"dp_shard: the {ep} ranks of an ep group read the same samples. In meshconf those "
        f"ranks are data-parallel ranks too: batch (dp_replicate * dp_shard) is {ep} times "
        f"KempnerForge's data-parallel size, and the dense layers shard over fsdp, {ep} times "
        f"KempnerForge's dp_shard. Divide the per-rank batch by {ep} to keep the global batch, "
        "or take the sampler's rank and size from the sparse domain's dp_replicate and efsdp "
        "to keep KempnerForge's split."
    )


def _expert_groups_note(tp: int) -> str:
    note = (
        "The sparse domain [pp, dp_replicate, efsdp, ep, etp] has the rank groups of "
        "KempnerForge's mesh [pp, dp_replicate, dp_shard, ep, tp]: efsdp is KempnerForge's "
        "dp_shard"
    )
    if tp == 1:
        return f"{note}."
    return (
        f"{note}, and etp, set to tp ({tp}), is its tp. With etp 1, each ep group would sit "
        "inside one tp group instead."
    )
