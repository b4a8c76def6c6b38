"""A meshconf config as Megatron-LM's arguments and Megatron-Core's
``initialize_model_parallel`` arguments, checked by converting them back.

The degrees map one to one (:data:`~.megatron_input.SIZE_DEGREES`), dp_replicate being the
distributed optimizer's instances; the rank order becomes Megatron's order string, inner to
outer, with ep beside cp where Megatron's expert grid takes cp's place. Megatron-LM's command
line spells two orders (its default and ``--use-tp-pp-dp-mapping``); Megatron-Core takes any.
The ``training`` keys that Megatron-LM's arguments give become those arguments. The result is
converted back with :func:`~.megatron_layout.convert_megatron`, and refused unless that gives the
same degrees, the same rank numbering and the same expert groups.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.errors import ConfigError, Diagnostic, KeyPath
from meshconf.core.schedules import megatron_schedule
from meshconf.core.setting_values import Spelling
from meshconf.core.settings import SETTINGS
from meshconf.features.convert.arguments import option
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.megatron_grid import DEFAULT_ORDER, TP_PP_DP_ORDER
from meshconf.features.convert.megatron_input import (
    NORMS_LATENT_SWIGLU_MODULES,
    SIZE_DEGREES,
    read_command_line,
)
from meshconf.features.convert.megatron_layout import convert_megatron
from meshconf.features.convert.megatron_training import partial_distopt_problem
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config

#: Megatron's order tokens for meshconf's world factors (dp_replicate and dp_shard are dp).
_TOKENS = {"tp": "tp", "cp": "cp", "dp_shard": "dp", "dp_replicate": "dp", "pp": "pp"}
#: The schedule Megatron-LM runs where its model chunks per rank are given: those arguments
#: say it.
_INTERLEAVED = megatron_schedule(interleaved=True).name


@dataclass(frozen=True)
class MegatronArguments:
    """A config as Megatron sees it."""

    #: Megatron-LM's arguments, in order: (flag, value), the value None for a switch; the
    #: value of an option that takes several (``--recompute-modules``) is its words joined by
    #: spaces, each an argument.
    arguments: tuple[tuple[str, str | None], ...]
    #: Megatron's order string, inner to outer.
    order: str
    #: ``parallel_state.initialize_model_parallel``'s keyword arguments.
    parallel_state: dict[str, Any]

    def command_line(self) -> str:
        """The arguments one to a line, each line but the last ending in a backslash."""
        lines = [flag if value is None else f"{flag} {value}" for flag, value in self.arguments]
        return " \\\n".join(lines) + "\n"


def megatron_arguments(config: MeshConfig, *, command_line: bool = True) -> MegatronArguments:
    """Megatron's arguments for ``config``, checked by converting them back.

    ``command_line``: the order must be one Megatron-LM's arguments spell (its default or
    ``--use-tp-pp-dp-mapping``); without it, any order Megatron-Core takes.

    Raises:
        ConfigError: a key Megatron cannot express, at that key:
            dp_replicate and dp_shard apart in ``order``, an order the command line cannot
            spell, ranks placed by ``levels`` or ``inside`` otherwise than Megatron numbers
            them, expert groups Megatron's grid does not make, or a training setting with no
            Megatron-LM argument.
        WorldSizeUnknownError: a degree is -1 and the config has no world size.
    """
    degrees = config.resolved_degrees
    problems: list[Diagnostic] = []
    arguments: list[tuple[str, str | None]] = [
        (option(name), str(degrees[degree])) for name, degree in SIZE_DEGREES.items()
    ]
    arguments += _training_arguments(config, problems)
    orders = _candidate_orders(config, problems, command_line=command_line)
    if problems:
        raise ConfigError(problems)
    variants = [arguments]
    if degrees["ep"] == 1:
        # Without experts Megatron still checks its expert grid, which with its default
        # expert tp (tp) fits every order; meshconf's etp then has no group to hold.
        variants.append([pair for pair in arguments if pair[0] != "--expert-tensor-parallel-size"])
    failure: Diagnostic | None = None
    for order, variant in itertools.product(orders, variants):
        written = list(variant)
        if order == TP_PP_DP_ORDER:
            written.append(("--use-tp-pp-dp-mapping", None))
        elif order != DEFAULT_ORDER:
            written.append(("--order", order))
        failure = _round_trip_problem(config, written)
        if failure is None:
            state = _parallel_state(degrees, config, order)
            if variant is not arguments:
                state["expert_tensor_parallel_size"] = None
            return MegatronArguments(tuple(written), order, state)
    assert failure is not None, "every config has at least one candidate order"
    raise ConfigError([failure])


def _candidate_orders(
    config: MeshConfig, problems: list[Diagnostic], *, command_line: bool
) -> list[str]:
    """Megatron orders that may number the ranks as ``config`` does: the two the command line
    spells and, without ``command_line``, the config's own order in Megatron's tokens."""
    sizes = config.resolved_degrees
    outer_first = [name for name in (config.order or WORLD_FACTORS) if sizes[name] > 1]
    if "dp_replicate" in outer_first and "dp_shard" in outer_first:
        at = outer_first.index("dp_replicate")
        if outer_first[at + 1 : at + 2] != ["dp_shard"]:
            problems.append(
                Diagnostic(
                    ("order",),
                    "Megatron numbers its distributed-optimizer instances (dp_replicate) just "
                    "outside the ranks each one shards over (dp_shard); put dp_replicate right "
                    "before dp_shard in order",
                )
            )
            return []
    tokens: list[str] = []
    for name in reversed(outer_first):
        if _TOKENS[name] not in tokens:
            tokens.append(_TOKENS[name])
    tokens += [token for token in ("tp", "cp", "dp", "pp") if token not in tokens]
    tokens.insert(tokens.index("cp") + 1, "ep")
    own = "-".join(tokens)
    orders = [DEFAULT_ORDER, TP_PP_DP_ORDER]
    return orders if command_line or own in orders else [*orders, own]


def _training_arguments(
    config: MeshConfig, problems: list[Diagnostic]
) -> list[tuple[str, str | None]]:
    training = config.training
    given = {} if training is None else training.model_dump(exclude_unset=True)
    arguments: list[tuple[str, str | None]] = []
    if config.resolved_degrees["dp_replicate"] > 1:
        # Megatron-LM's distributed-optimizer instances need the distributed optimizer.
        if given.get("zero_stage", 1) == 0:
            problems.append(
                Diagnostic(
                    ("training", "zero_stage"),
                    f"is 0, but dp_replicate is {config.resolved_degrees['dp_replicate']}: "
                    + partial_distopt_problem("set training.zero_stage to 1"),
                )
            )
        elif given.get("zero_stage", 1) == 1:
            given["zero_stage"] = 1
    for key, value in given.items():
        spelling = SETTINGS[key].megatron
        if spelling is not None and spelling.default == value:
            continue  # Megatron's own value: no argument
        if spelling is not None and spelling.on is not None and spelling.on == value:
            arguments.append((spelling.name, None))
        elif spelling is not None and _plain_integer(key, spelling):
            arguments.append((spelling.name, str(value)))
        elif key == "pp_schedule" and value == _INTERLEAVED and "virtual_stages" in given:
            continue
        elif key == "optimizer_dtype" and value == "bf16":
            arguments += [
                ("--use-precision-aware-optimizer", None),
                ("--exp-avg-dtype", "bf16"),
                ("--exp-avg-sq-dtype", "bf16"),
            ]
        elif key == "activation_checkpointing" and value == "full":
            first, group = given.get("checkpoint_first"), given.get("checkpoint_group")
            how = ("block", str(first)) if first is not None else ("uniform", str(group or 1))
            arguments += [
                ("--recompute-granularity", "full"),
                ("--recompute-method", how[0]),
                ("--recompute-num-layers", how[1]),
            ]
        elif key == "activation_checkpointing" and value == "norms-latent-swiglu":
            arguments += [
                ("--recompute-granularity", "selective"),
                ("--recompute-modules", " ".join(NORMS_LATENT_SWIGLU_MODULES)),
            ]
        elif (
            key in ("checkpoint_first", "checkpoint_group")
            and given.get("activation_checkpointing") == "full"
        ):
            continue
        else:
            problems.append(
                Diagnostic(
                    ("training", key),
                    f"{value!r} has no Megatron-LM argument meshconf writes; leave it out of "
                    "the config for Megatron, or set it in Megatron's own arguments",
                )
            )
    return arguments


def _plain_integer(key: str, spelling: Spelling) -> bool:
    """Whether Megatron-LM's argument of the setting ``key`` takes its integer as it is."""
    return SETTINGS[key].kind == "integer" and spelling.on is None and not spelling.beside


def _argument_keys(config: MeshConfig) -> dict[str, KeyPath]:
    """The ``training`` key each Megatron-LM argument of a training setting comes from, so
    that Megatron's refusal of an argument is reported where the user wrote the setting."""
    training = config.training
    given = () if training is None else training.model_dump(exclude_unset=True)
    keys: dict[str, KeyPath] = {}
    for key in given:
        spelling = SETTINGS[key].megatron
        if spelling is not None and spelling.name:
            keys[spelling.name] = ("training", key)
    if "activation_checkpointing" in given:
        for flag in ("--recompute-granularity", "--recompute-method", "--recompute-modules"):
            keys[flag] = ("training", "activation_checkpointing")
    if "optimizer_dtype" in given:
        keys["--use-precision-aware-optimizer"] = ("training", "optimizer_dtype")
    return keys


def _round_trip_problem(
    config: MeshConfig, arguments: list[tuple[str, str | None]]
) -> Diagnostic | None:
    """Why Megatron's groups under ``arguments`` are not ``config``'s, if they are not."""
    text = " ".join(flag if value is None else f"{flag} {value}" for flag, value in arguments)
    world = config.resolved_world_size
    try:
        back = load_config(convert_megatron(read_command_line(text), world_size=world).data)
    except ConversionError as error:
        problem = error.problems[0]
        key: KeyPath = ("order",) if config.order is not None else ("degrees",)
        key = _argument_keys(config).get(problem.key or "", key)
        return Diagnostic(key, problem.message)
    ours, theirs = config.resolved_degrees, back.resolved_degrees
    if ours["ep"] == 1:
        ours, theirs = {**ours, "etp": 1}, {**theirs, "etp": 1}
    if theirs != ours:
        return Diagnostic(("degrees",), "Megatron's sizes for these arguments differ")
    if back.layout_over("world", WORLD_FACTORS) != config.layout_over("world", WORLD_FACTORS):
        placed = "inside_node" if config.inside_node is not None else "order"
        key = ("inside",) if config.inside else (placed,)
        return Diagnostic(
            key,
            f"Megatron numbers the ranks otherwise than {'.'.join(map(str, key))} does, so its "
            "groups would hold other ranks; leave it out, or give an order Megatron has "
            "(tp-cp-ep-dp-pp inner to outer, or tp-cp-ep-pp-dp)",
        )
    sparse = back.effective_domains["sparse"]
    if ours["ep"] > 1 and back.layout("sparse").dims != config.layout_over("sparse", sparse).dims:
        return Diagnostic(
            ("degrees", "ep"),
            "Megatron's expert groups under this order are not meshconf's sparse groups; "
            "change order so that ep sits where Megatron puts it (beside cp)",
        )
    return None


def _parallel_state(degrees: dict[str, int], config: MeshConfig, order: str) -> dict[str, Any]:
    """``initialize_model_parallel``'s keyword arguments."""
    training = config.training
    chunks = None if training is None else training.virtual_stages
    return {
        "tensor_model_parallel_size": degrees["tp"],
        "pipeline_model_parallel_size": degrees["pp"],
        "virtual_pipeline_model_parallel_size": chunks if chunks and chunks > 1 else None,
        "context_parallel_size": degrees["cp"],
        "expert_model_parallel_size": degrees["ep"],
        "expert_tensor_parallel_size": degrees["etp"],
        "num_distributed_optimizer_instances": degrees["dp_replicate"],
        "order": order,
    }
