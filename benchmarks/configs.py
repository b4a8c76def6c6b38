"""Generated config files for the benchmarks: realistic valid configs drawn with a seeded RNG,
and configs that break one formula rule while keeping every key, type and range valid (so a
JSON Schema accepts them). Every file is checked with ``load_config`` before it is timed.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from meshconf import ConfigError, load_config

SEED = 20240611
BROKEN_EVERY = 10  # one file in ten breaks a formula rule
WORLD_MIN, WORLD_MAX = 8, 65536
WORLD_FACTORS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DEGREES = (*WORLD_FACTORS, "ep", "etp")  # the order a file writes them in

CUSTOM_DOMAIN_SETS: list[tuple[dict[str, str], dict[str, list[str]]]] = [
    # (derived, domains): a few shapes seen in real training configs.
    ({}, {"dense": ["pp", "dp_replicate", "fsdp", "tp"], "loss": ["pp", "loss", "tp"]}),
    (
        {"expert_dp": "dp_shard * cp * tp / (ep * etp)"},
        {
            "dense": ["pp", "dp_replicate", "fsdp", "tp"],
            "moe": ["pp", "dp_replicate", "expert_dp", "ep", "etp"],
        },
    ),
    (
        {"attn_dp": "dp_shard * cp"},
        {
            "attention": ["pp", "dp_replicate", "attn_dp", "tp"],
            "dataloading": ["pp", "batch", "cp", "tp"],
        },
    ),
    (
        {"model_parallel": "pp * tp", "tokens": "dp_replicate * dp_shard * cp"},
        {
            "dense": ["pp", "dp_replicate", "fsdp", "tp"],
            "seq": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
            "loss": ["pp", "tokens", "tp"],
        },
    ),
]


def write_auto_style(
    written: dict[str, int], degrees: dict[str, int], style: int, rng: random.Random
) -> None:
    """Write the -1 one of four ways: dp_shard left out (its default), dp_shard written as -1,
    another world factor as -1, or every world factor explicit."""
    if style == 0:
        written.pop("dp_shard", None)
    elif style == 1:
        written["dp_shard"] = -1
    elif style == 2:
        auto = rng.choice([n for n in ("pp", "dp_replicate", "tp") if n in written] or ["pp"])
        written["dp_shard"] = degrees["dp_shard"]
        written[auto] = -1
    else:
        written.update({n: degrees[n] for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp")})


@dataclass(frozen=True)
class GeneratedConfig:
    """One config file's text; ``broken_rule`` names the formula rule it breaks, if any."""

    path: Path
    text: str
    world_size: int
    broken_rule: str | None = None


@dataclass
class ConfigShape:
    """What a config file says, before it is rendered to YAML."""

    world_size: int
    degrees: dict[str, int]
    gpus_per_node: int | None = None
    derived: dict[str, str] = field(default_factory=dict)
    domains: dict[str, list[str]] = field(default_factory=dict)
    runtime: dict[str, str | int] = field(default_factory=dict)
    comment: str | None = None

    def render(self) -> str:
        lines = [f"# {self.comment}"] if self.comment else []
        lines.append(f"world_size: {self.world_size}")
        if self.gpus_per_node is not None:
            lines.append(f"gpus_per_node: {self.gpus_per_node}")
        lines.append("degrees:")
        lines += [f"  {name}: {self.degrees[name]}" for name in DEGREES if name in self.degrees]
        if self.derived:
            lines.append("derived:")
            lines += [f'  {name}: "{formula}"' for name, formula in self.derived.items()]
        if self.domains:
            lines.append("domains:")
            lines += [f"  {name}: [{', '.join(dims)}]" for name, dims in self.domains.items()]
        if self.runtime:
            lines.append("runtime:")
            lines += [f"  {name}: {value}" for name, value in self.runtime.items()]
        return "\n".join(lines) + "\n"


DERIVED_ONLY = [{"dp_total": "dp_replicate * dp_shard"}, {"sp": "cp * tp"}]

# The first valid configs pin the ends of the world-size range.
ANCHORS = [
    {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 8, "ep": 1, "etp": 1},
    {"pp": 8, "dp_replicate": 2, "dp_shard": 256, "cp": 2, "tp": 8, "ep": 16, "etp": 8},
]


def world_of(degrees: dict[str, int]) -> int:
    return math.prod(degrees[name] for name in WORLD_FACTORS)


def no_condition(degrees: dict[str, int]) -> bool:
    return True


def random_degrees(rng: random.Random, accept: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Resolved degrees (no -1) with a world size in range that ``accept`` takes."""
    while True:
        tp = rng.choice([1, 2, 4, 8, 8])
        degrees = {
            "pp": rng.choice([1, 1, 2, 4, 8, 16]),
            "dp_replicate": rng.choice([1, 1, 2, 4, 8]),
            "dp_shard": rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512]),
            "cp": rng.choice([1, 1, 1, 2, 4]),
            "tp": tp,
            "etp": rng.choice([1, 1, tp]),
        }
        lender = degrees["dp_shard"] * degrees["cp"] * tp
        eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64) if lender % (ep * degrees["etp"]) == 0]
        degrees["ep"] = rng.choice(eps)
        if WORLD_MIN <= world_of(degrees) <= WORLD_MAX and accept(degrees):
            return degrees


def written_degrees(degrees: dict[str, int], style: int, rng: random.Random) -> dict[str, int]:
    """The degrees as a file writes them: defaults left out, and one of four -1 styles."""
    written = {
        name: value
        for name, value in degrees.items()
        if value != 1 or (name == "dp_shard") or rng.random() < 0.3
    }
    write_auto_style(written, degrees, style, rng)
    return written


def add_extras(shape: ConfigShape, rng: random.Random, with_domains: bool) -> None:
    """Optional blocks, drawn independently: about a fifth of the files have none of them."""
    if rng.random() < 0.5:
        shape.gpus_per_node = rng.choice([4, 8, 8, 8])
    if with_domains and rng.random() < 0.3:
        shape.derived, shape.domains = rng.choice(CUSTOM_DOMAIN_SETS)
    elif rng.random() < 0.15:
        shape.derived = dict(rng.choice(DERIVED_ONLY))
    if rng.random() < 0.25:
        shape.runtime = {
            "timeout_s": rng.choice([600, 1800, 3600]),
            "backend": rng.choice(["auto", "nccl"]),
        }
    if rng.random() < 0.4:
        shape.comment = f"{rng.choice(['llama', 'moe', 'dense', 'long-context'])} run layout"


def valid_config(index: int, rng: random.Random) -> ConfigShape:
    degrees = dict(ANCHORS[index]) if index < len(ANCHORS) else random_degrees(rng, no_condition)
    shape = ConfigShape(world_of(degrees), written_degrees(degrees, index % 4, rng))
    add_extras(shape, rng, with_domains=True)
    return shape


# How each formula rule is broken. Every broken file keeps its keys, types and ranges valid,
# so the JSON Schema accepts it.
def _break_world_product(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees.update({name: degrees[name] for name in WORLD_FACTORS})
    shape.world_size = shape.world_size // 2 if shape.world_size >= 16 else shape.world_size * 2


def _break_auto_fill(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees.update({name: degrees[name] for name in ("pp", "dp_replicate", "cp", "tp")})
    shape.degrees.pop("dp_shard", None)  # dp_shard defaults to -1 and cannot fill exactly
    shape.world_size += 1


def _break_expert_borrowing(shape: ConfigShape, degrees: dict[str, int]) -> None:
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    twos = (lender & -lender).bit_length() - 1  # the power of two in the lender
    shape.degrees["ep"] = 2 ** (twos + 1)
    shape.degrees.pop("etp", None)


def _break_etp(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees["etp"] = degrees["tp"] // 2
    shape.degrees.pop("ep", None)


def _break_derived_division(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {"tp_half_groups": "tp / 16"}


def _break_derived_name(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {"moe_dp": "dp_shard * cp * tpp"}


def _break_domain_product(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {}
    shape.domains = {"dense": ["pp", "fsdp", "tp"], "loss": ["pp", "loss", "tp"]}


def _break_same_groups(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {}
    shape.domains = {
        "dense": ["pp", "dp_replicate", "fsdp", "tp"],
        "tp_outer": ["pp", "dp_replicate", "tp", "fsdp"],
    }


@dataclass(frozen=True)
class BrokenRule:
    name: str
    key_prefix: str  # every diagnostic meshconf reports sits under this key
    needs: Callable[[dict[str, int]], bool]  # which degrees can be broken this way
    apply: Callable[[ConfigShape, dict[str, int]], None]


BROKEN_RULES = [
    BrokenRule("world product", "degrees.", no_condition, _break_world_product),
    BrokenRule(
        "-1 fills exactly",
        "degrees.",  # on the written degree that does not fit
        lambda d: world_of(d) // d["dp_shard"] >= 2,
        _break_auto_fill,
    ),
    BrokenRule("experts borrow", "degrees.ep", no_condition, _break_expert_borrowing),
    BrokenRule("etp is 1 or tp", "degrees.etp", lambda d: d["tp"] >= 4, _break_etp),
    BrokenRule("derived integer", "derived.", no_condition, _break_derived_division),
    BrokenRule("derived names", "derived.", no_condition, _break_derived_name),
    BrokenRule(
        "domain product", "domains.", lambda d: d["dp_replicate"] >= 2, _break_domain_product
    ),
    BrokenRule(
        "same rank groups",
        "domains.",
        lambda d: d["tp"] >= 2 and d["dp_shard"] * d["cp"] >= 2,
        _break_same_groups,
    ),
]


def broken_config(index: int, rng: random.Random) -> tuple[ConfigShape, BrokenRule]:
    rule = BROKEN_RULES[(index // BROKEN_EVERY) % len(BROKEN_RULES)]
    degrees = random_degrees(rng, rule.needs)
    shape = ConfigShape(world_of(degrees), written_degrees(degrees, index % 4, rng))
    add_extras(shape, rng, with_domains=False)
    rule.apply(shape, degrees)
    return shape, rule


def check_generated(path: Path, rule: BrokenRule | None) -> None:
    """A valid file loads; a broken one fails only under its rule's key (else: a generator bug)."""
    try:
        load_config(path)
    except ConfigError as error:
        keys = [d.key for d in error.diagnostics]
        if rule is None or not all(key.startswith(rule.key_prefix) for key in keys):
            sys.exit(f"generator bug: {path} ({rule.name if rule else 'valid'}) fails:\n{error}")
        return
    if rule is not None:
        sys.exit(f"generator bug: {path} should break {rule.name!r} but is valid")


def generate_configs(
    count: int, directory: Path, broken_every: int | None = BROKEN_EVERY
) -> list[GeneratedConfig]:
    """``count`` distinct configs written to ``directory``, each checked with ``load_config``;
    file ``i`` breaks a formula rule when ``i % broken_every == broken_every - 1``."""
    rng = random.Random(SEED)
    seen: set[str] = set()
    configs: list[GeneratedConfig] = []
    while len(configs) < count:
        index = len(configs)
        rule: BrokenRule | None = None
        if broken_every is not None and index % broken_every == broken_every - 1:
            shape, rule = broken_config(index, rng)
        else:
            shape = valid_config(index, rng)
        body = replace(shape, comment=None).render()  # distinct beyond the comment line
        if body in seen:
            continue
        seen.add(body)
        path = directory / f"mesh_{index:04d}.yaml"
        path.write_text(shape.render())
        check_generated(path, rule)
        broken_rule = rule.name if rule else None
        configs.append(GeneratedConfig(path, shape.render(), shape.world_size, broken_rule))
    return configs
