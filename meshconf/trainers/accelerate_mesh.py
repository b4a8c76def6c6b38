"""Hugging Face accelerate's mesh: its sizes and dims, the dims it flattens, how it is told to
run FSDP2, and the layouts it cannot express or refuses when it starts, each refusal worded
once, with each key named as the caller's input spells it (``dp_shard_size`` for ``meshconf
convert --from accelerate``, ``degrees.dp_shard`` for :mod:`meshconf.compat.accelerate`).

accelerate (1.10 and later) describes dp_replicate, dp_shard, cp and tp, lays them out in that
order (outer to inner), as meshconf's default order does, and reads its mesh only by dim
name: the enabled dims (those above 1) and three dims it flattens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: accelerate's sizes, by the name its ``ParallelismConfig``, its config file and its launcher
#: give them, and the meshconf degree each one is, outer to inner.
SIZE_DEGREES = {
    "dp_replicate_size": "dp_replicate",
    "dp_shard_size": "dp_shard",
    "cp_size": "cp",
    "tp_size": "tp",
}
#: accelerate's mesh dims, outer to inner, each the meshconf degree of the same name.
ACCELERATE_DIMS = tuple(SIZE_DEGREES.values())
#: DeepSpeed's Ulysses sequence parallelism, which meshconf has no degree for.
SP_SIZE = "sp_size"
#: The dims accelerate flattens, with the dims each joins (those enabled), and the meshconf
#: dim that holds the same groups: the batch, FSDP's shards, the loss.
FLATTENED_DIMS: Mapping[str, tuple[tuple[str, ...], str]] = {
    "dp": (("dp_replicate", "dp_shard"), "batch"),
    "dp_shard_cp": (("dp_shard", "cp"), "fsdp"),
    "dp_cp": (("dp_replicate", "dp_shard", "cp"), "loss"),
}
#: What ``accelerate launch`` sets for a script when FSDP is on, and the launcher's option each
#: variable is.
LAUNCH_ENVIRONMENT = {"ACCELERATE_USE_FSDP": "use_fsdp", "FSDP_VERSION": "fsdp_version"}
#: accelerate's issues, cited beside each of its refusals.
ISSUES = "https://github.com/huggingface/accelerate/issues"


@dataclass(frozen=True)
class Launch:
    """What the refusals read: the degrees (one accelerate does not have is 1), the world
    size, and whether accelerate runs FSDP2."""

    degrees: Mapping[str, int]
    world: int
    fsdp2: bool

    def __getitem__(self, degree: str) -> int:
        return self.degrees.get(degree, 1)

    @property
    def replicated_model_parallel(self) -> list[str]:
        """tp and cp, those above 1, beside replication that does not shard."""
        if self["dp_replicate"] > 1 and self["dp_shard"] == 1:
            return [name for name in ("tp", "cp") if self[name] > 1]
        return []


def uses_fsdp(settings: Mapping[str, object]) -> bool:
    """FSDP, as accelerate reads it from its config (``distributed_type``) or its launcher's
    options and environment (``use_fsdp``)."""
    kind, switch = settings.get("distributed_type"), settings.get("use_fsdp")
    return (kind is not None and str(kind).upper() == "FSDP") or (
        switch is not None and str(switch).lower() == "true"
    )


def uses_fsdp2(settings: Mapping[str, object]) -> bool:
    """FSDP version 2 (``fsdp_version``), as accelerate reads it."""
    version = settings.get("fsdp_version")
    return uses_fsdp(settings) and version is not None and str(version).strip() == "2"


#: How the caller's input names a degree: ``dp_shard`` -> ``dp_shard_size``.
Spelling = Callable[[str], str]


@dataclass(frozen=True)
class Refusal:
    """A layout accelerate cannot express or refuses when it starts: the degree the problem
    is reported on, when it applies, and what it says."""

    degree: str
    applies: Callable[[Launch], bool]
    says: Callable[[Launch, Spelling], str]


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "pp",
        lambda run: run["pp"] > 1,
        lambda run, key: (
            f"accelerate has no pipeline parallelism; set {key('pp')} to 1 "
            f"(giving its {run['pp']} ranks to dp_shard), or train with torchtitan or Megatron-Core"
        ),
    ),
    Refusal(
        "ep",
        lambda run: run["ep"] > 1,
        lambda run, key: (
            f"accelerate has no expert parallelism ({ISSUES}/4200); set "
            f"{key('ep')} to 1, or train with torchtitan, Megatron-Core or transformers' "
            "DistributedConfig"
        ),
    ),
    Refusal(
        "dp_replicate",
        lambda run: bool(run.replicated_model_parallel),
        lambda run, key: (
            f"accelerate refuses {' and '.join(run.replicated_model_parallel)} "
            f"beside replication that does not shard ({ISSUES}/3876): set {key('dp_shard')} to "
            f"{run['dp_replicate']} and {key('dp_replicate')} to 1 (FSDP), or {key('dp_shard')} "
            "above 1 as well (HSDP)"
        ),
    ),
    Refusal(
        "dp_shard",
        lambda run: run.fsdp2 and run["dp_shard"] == 1 and run["cp"] == 1 and run.world > 1,
        lambda run, key: (
            "FSDP2 shards over dp_shard * cp, which is 1 here, and accelerate "
            f"fails with KeyError 'dp_shard_cp' ({ISSUES}/3798): set {key('dp_shard')} above 1 "
            f"(lowering {key('tp')} to leave it processes), or turn FSDP off"
        ),
    ),
)


def refusals(launch: Launch, key: Spelling) -> list[tuple[str, str]]:
    """Each refusal that applies to ``launch``, as its degree and its message, the degrees
    named by ``key``."""
    return [(row.degree, row.says(launch, key)) for row in REFUSALS if row.applies(launch)]


def sp_size_problem(size: int) -> str | None:
    """Why an ``sp_size`` cannot be converted, if it cannot: meshconf has no degree for
    DeepSpeed's Ulysses sequence parallelism."""
    if size == 1:
        return None
    return (
        f"is {size}: DeepSpeed's Ulysses sequence parallelism, which meshconf has no degree "
        "for; set it to 1, or use cp_size for context parallelism"
    )
