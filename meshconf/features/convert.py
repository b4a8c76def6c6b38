"""Convert another tool's parallelism settings into a meshconf config: torchtitan's
``[parallelism]`` table (torchtitan 0.2.1's ``Parallelism``) or KempnerForge's
``[distributed]`` table.

The conversion is pure: a table as read from TOML goes in; the meshconf mapping, short
comments on changed values, and one note per semantic difference come out. The mapping is
validated with :func:`~meshconf.sources.loading.load_config`, and each problem meshconf finds is
placed on the TOML key it came from. Reading the TOML and printing the YAML are left to
``meshconf convert`` (``cli/convert.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshconf.core.degrees import AUTO, DEGREE_NAMES, product_text
from meshconf.core.errors import ConfigError, KeyPath, MeshconfError, describe_value
from meshconf.core.messages import did_you_mean
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config

TORCHTITAN = "torchtitan"
KEMPNERFORGE = "kempnerforge"
SOURCES = (TORCHTITAN, KEMPNERFORGE)
#: The TOML table each tool keeps its parallelism settings in.
TABLES = {TORCHTITAN: "parallelism", KEMPNERFORGE: "distributed"}
#: How the notes name each tool.
TOOL_NAMES = {TORCHTITAN: "torchtitan", KEMPNERFORGE: "KempnerForge"}

#: Every field of torchtitan 0.2.1's ``Parallelism`` dataclass, in its order.
TORCHTITAN_FIELDS = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "fsdp_reshard_after_forward",
    "tensor_parallel_degree",
    "disable_loss_parallel",
    "enable_async_tensor_parallel",
    "pipeline_parallel_degree",
    "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size",
    "pipeline_parallel_expert_parallel_overlap",
    "context_parallel_degree",
    "context_parallel_rotate_method",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
    "expert_parallel_comm_backend",
)
#: The fields that are mesh settings, and the meshconf degree each one is.
TORCHTITAN_DEGREES = {
    "pipeline_parallel_degree": "pp",
    "data_parallel_replicate_degree": "dp_replicate",
    "data_parallel_shard_degree": "dp_shard",
    "context_parallel_degree": "cp",
    "tensor_parallel_degree": "tp",
    "expert_parallel_degree": "ep",
    "expert_tensor_parallel_degree": "etp",
}

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

#: Both tools default every degree to what meshconf does, so a key left out of the table
#: and a degree left out of the config mean the same.
DEFAULT_DEGREES = {name: 1 for name in DEGREE_NAMES} | {"dp_shard": AUTO}

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INTEGER_TEXT = re.compile(r"[-+]?[0-9]+")


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare when it can be, quoted otherwise."""
    if _BARE_KEY.fullmatch(key):
        return key
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@dataclass(frozen=True)
class SourceProblem:
    """A problem with one key of the source table, or with the table itself (``key`` None)."""

    table: str
    key: str | None
    message: str

    @property
    def where(self) -> str:
        table = f"[{self.table}]"
        return table if self.key is None else f"{table}.{toml_key(self.key)}"


class ConversionError(MeshconfError):
    """The source table cannot be converted; ``problems`` holds one entry per problem."""

    def __init__(self, problems: Sequence[SourceProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(f"{p.where}: {p.message}" for p in self.problems))


@dataclass(frozen=True)
class Conversion:
    """A converted, validated config, and what the reader of it needs to know."""

    source: str
    table: str
    #: The meshconf config, keys in the order they are to be written.
    data: dict[str, Any]
    #: Short remarks on values that changed, by dotted key (``degrees.dp_shard``).
    comments: dict[str, str]
    #: One paragraph per semantic difference between the tool and meshconf.
    notes: tuple[str, ...]


@dataclass
class _Draft:
    """A conversion under way."""

    table: str
    world_size: int | None
    gpus_per_node: int | None
    #: The table's keys in file order, to report problems in that order.
    key_order: tuple[str, ...] = ()
    #: The degrees the table set, by meshconf name, as converted.
    degrees: dict[str, int] = field(default_factory=dict)
    runtime: dict[str, int | str] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The source key of each meshconf key, to place meshconf's problems.
    origins: dict[KeyPath, str] = field(default_factory=dict)
    problems: list[SourceProblem] = field(default_factory=list)

    def fail(self, key: str | None, message: str) -> None:
        self.problems.append(SourceProblem(self.table, key, message))

    def check(self) -> None:
        if self.problems:
            order = {key: index for index, key in enumerate(self.key_order)}
            # The table's own problems (key None) come first, then the keys in file order.
            raise ConversionError(
                sorted(self.problems, key=lambda problem: order.get(problem.key or "", -1))
            )

    def config_data(self, degrees: Mapping[str, int]) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.world_size is not None:
            data["world_size"] = self.world_size
        if self.gpus_per_node is not None:
            data["gpus_per_node"] = self.gpus_per_node
        data["degrees"] = dict(degrees)
        if self.runtime:
            data["runtime"] = dict(self.runtime)
        return data


def convert(
    source: str,
    table: Any,
    *,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Conversion:
    """Convert ``table``, the source's table as read from TOML (``None`` when the file has
    none, which means the tool's defaults), into a validated meshconf config.

    Raises :class:`ConversionError` with every problem, each placed on its TOML key.
    """
    draft = _Draft(TABLES[source], world_size, gpus_per_node)
    if table is None:
        table = {}
        draft.notes.append(
            f"The file has no [{draft.table}] table: every setting is "
            f"{TOOL_NAMES[source]}'s default."
        )
    if not isinstance(table, Mapping):
        draft.fail(None, f"expected a table, got {describe_value(table)}")
        draft.check()
    draft.key_order = tuple(table)
    builders: dict[str, Callable[[_Draft, Mapping[str, Any]], None]] = {
        TORCHTITAN: _from_torchtitan,
        KEMPNERFORGE: _from_kempnerforge,
    }
    builders[source](draft, table)
    config = _validate(draft)
    notes = [_world_size_note(source, draft, config), *draft.notes]
    degrees = DEFAULT_DEGREES | draft.degrees
    return Conversion(
        source=source,
        table=draft.table,
        data=draft.config_data({name: degrees[name] for name in DEGREE_NAMES}),
        comments=draft.comments,
        notes=tuple(notes),
    )


def _unknown_keys(
    draft: _Draft, table: Mapping[str, Any], known: Sequence[str], what: str, listed: str = ""
) -> None:
    """A key that is not ``known`` is a problem: not ``what``, a close match, ``listed``."""
    for key in table:
        if key not in known:
            draft.fail(key, f"not {what}{did_you_mean(key, list(known))}{listed}")


def _integer_problem(value: Any, *, auto: bool, hint: str = "") -> str | None:
    """Why ``value`` is not a degree (an integer >= 1, or -1 where ``auto``), if it is not;
    ``hint`` follows a -1 that is not allowed."""
    expected = "an integer >= 1" + (" or -1 (fill the remaining ranks)" if auto else "")
    if isinstance(value, bool) or not isinstance(value, int):
        quoted = isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip())
        unquote = " (a quoted number is a string; write the integer unquoted)" if quoted else ""
        return f"expected {expected}, got {describe_value(value)}{unquote}"
    if value < 1 and not (auto and value == AUTO):
        return f"expected {expected}, got {value}{hint if value == AUTO else ''}"
    return None


def _integers(draft: _Draft, table: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, int]:
    """The degrees among ``keys`` (source key -> meshconf name) that the table sets, by
    meshconf name; a bad value is a problem on its key. Only ``dp_shard`` may be -1 in
    either tool."""
    found: dict[str, int] = {}
    auto_key = next(key for key, name in keys.items() if name == "dp_shard")
    hint = f": only {auto_key} may be -1"
    for key, name in keys.items():
        if key not in table:
            continue
        problem = _integer_problem(table[key], auto=name == "dp_shard", hint=hint)
        if problem is None:
            found[name] = table[key]
        else:
            draft.fail(key, problem)
    return found


def _from_torchtitan(draft: _Draft, table: Mapping[str, Any]) -> None:
    _unknown_keys(draft, table, TORCHTITAN_FIELDS, "a field of torchtitan 0.2.1's Parallelism")
    draft.degrees = _integers(draft, table, TORCHTITAN_DEGREES)
    draft.check()
    draft.origins = {("degrees", name): key for key, name in TORCHTITAN_DEGREES.items()}
    ep, etp = draft.degrees.get("ep", 1), draft.degrees.get("etp", 1)
    if ep == 1 and etp != 1:
        draft.degrees["etp"] = 1
        draft.comments["degrees.etp"] = f"was {etp}: torchtitan ignores it while ep is 1"
        draft.notes.append(
            f"expert_tensor_parallel_degree = {etp} is written as etp: 1. torchtitan ignores it "
            "while expert_parallel_degree is 1, but meshconf checks etp even without experts: "
            "it must be 1 or tp."
        )
    not_converted = [
        key for key in TORCHTITAN_FIELDS if key in table and key not in TORCHTITAN_DEGREES
    ]
    if not_converted:
        draft.notes.append(
            f"Not converted, as they are not mesh settings (keep them in the torchtitan job "
            f"config): {', '.join(not_converted)}."
        )


def _from_kempnerforge(draft: _Draft, table: Mapping[str, Any]) -> None:
    _unknown_keys(
        draft,
        table,
        KEMPNERFORGE_KEYS,
        "a key of KempnerForge's [distributed]",
        f"; its keys are {', '.join(KEMPNERFORGE_KEYS)}",
    )
    identity = {name: name for name in KEMPNERFORGE_FACTORS}
    written = _integers(draft, table, identity)
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


def _kempnerforge_runtime(draft: _Draft, table: Mapping[str, Any]) -> list[str]:
    """Convert nccl_timeout_sec and backend into draft.runtime; return their notes."""
    notes = []
    if "nccl_timeout_sec" in table:
        timeout = table["nccl_timeout_sec"]
        problem = _integer_problem(timeout, auto=False)
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


def _kempnerforge_backend(draft: _Draft, backend: Any) -> list[str]:
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


def _kempnerforge_world(draft: _Draft, factors: Mapping[str, int], world_size: int) -> None:
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


def _borrow_expert_ranks(draft: _Draft, factors: Mapping[str, int]) -> None:
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


def _validate(draft: _Draft) -> MeshConfig:
    """Validate what the table set (the defaults are the same in both), so that meshconf
    places a problem on a key the table has."""
    try:
        return load_config(draft.config_data(draft.degrees))
    except ConfigError as error:
        problems = []
        for diagnostic in error.diagnostics:
            key = draft.origins.get(diagnostic.path)
            text = diagnostic.message if key is not None else diagnostic.render()
            problems.append(SourceProblem(draft.table, key, text))
        raise ConversionError(problems) from None


def _world_size_note(source: str, draft: _Draft, config: MeshConfig) -> str:
    tool = TOOL_NAMES[source]
    where = f"world_size is not in the TOML: {tool} takes it from the launcher."
    if draft.world_size is not None:
        return (
            f"{where} {draft.world_size} comes from --world-size; at start-up meshconf checks "
            "that the launcher's world size agrees."
        )
    if config.resolved_world_size is not None:
        return (
            f"{where} With no degree at -1, meshconf takes the product of the degrees, "
            f"{config.resolved_world_size}, and checks at start-up that the launcher's world "
            "size agrees."
        )
    return (
        f"{where} So does this config: meshconf fills the -1 degree from the launcher's world "
        "size at start-up. `meshconf validate FILE --world-size N` runs the checks that wait "
        "for it."
    )
