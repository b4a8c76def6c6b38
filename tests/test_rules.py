"""Every rule of docs/configuration.md#rules, with the exact message a user sees (mapping input, no file)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from meshconf import ConfigError, MeshConfig, WorldSizeUnknownError, load_config


def errors(data: dict[str, Any], **kwargs: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(data, **kwargs)
    return [diagnostic.render() for diagnostic in caught.value.diagnostics]


def test_defaults_are_the_four_torchtitan_domains() -> None:
    config = load_config({"world_size": 8, "degrees": {"dp_replicate": 2, "tp": 2}})
    assert config.resolved_degrees == {
        "pp": 1,
        "dp_replicate": 2,
        "dp_shard": 2,
        "cp": 1,
        "tp": 2,
        "ep": 1,
        "etp": 1,
    }
    assert config.dim_sizes["batch"] == 4 and config.dim_sizes["fsdp"] == 2
    assert config.dim_sizes["loss"] == 4 and config.dim_sizes["efsdp"] == 4
    assert list(config.layouts) == ["dataloading", "dense", "sparse", "loss"]
    assert config.layout("dense").shape == (1, 2, 2, 2)
    assert config.pending_checks == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "expected an integer >= 1 or -1 (fill the remaining ranks), got the boolean true"),
        (
            "8",
            "expected an integer >= 1 or -1 (fill the remaining ranks), got the string '8' "
            "(a quoted number is a string; write the integer you mean, unquoted)",
        ),
        (8.0, "expected an integer >= 1 or -1 (fill the remaining ranks), got the float 8.0"),
        (0, "expected an integer >= 1 or -1 (fill the remaining ranks), got 0"),
        (-2, "expected an integer >= 1 or -1 (fill the remaining ranks), got -2"),
        (None, "expected an integer >= 1 or -1 (fill the remaining ranks), got null"),
        ([8], "expected an integer >= 1 or -1 (fill the remaining ranks), got a list"),
        (2**31, "2147483648 is larger than 2147483647, the most ranks torch can number"),
    ],
)
def test_degrees_are_strict_integers(value: Any, message: str) -> None:
    assert errors({"degrees": {"tp": value}}) == [f"degrees.tp: {message}"]


def test_only_world_factors_may_be_auto() -> None:
    assert errors({"degrees": {"ep": -1}}) == [
        "degrees.ep: expected an integer >= 1, got -1: only the world factors (pp, dp_replicate, "
        "dp_shard, cp, tp) may be -1; expert degrees borrow their ranks from dp_shard * cp * tp"
    ]


def test_at_most_one_auto() -> None:
    assert errors({"degrees": {"dp_shard": -1, "tp": -1}}) == [
        "degrees.tp: only one degree may be -1 (fill the remaining ranks), but dp_shard and tp both are"
    ]


def test_dp_shard_defaults_to_auto_unless_another_factor_is() -> None:
    assert load_config({"world_size": 16, "degrees": {"tp": 4}}).resolved_degrees["dp_shard"] == 4
    config = load_config({"world_size": 16, "degrees": {"tp": -1, "pp": 2}})
    assert config.resolved_degrees["dp_shard"] == 1 and config.resolved_degrees["tp"] == 8


def test_world_product() -> None:
    assert errors({"world_size": 8, "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 3}}) == [
        "degrees.tp: pp(1) * dp_replicate(2) * dp_shard(2) * cp(1) * tp(3) = 12 != world_size 8"
    ]


def test_auto_fill_divides_exactly() -> None:
    assert errors({"world_size": 12, "degrees": {"tp": 8}}) == [
        "degrees.tp: tp(8) leaves no whole number of ranks for dp_shard (-1 by default): "
        "world_size 12 is not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(8) = 8; tp could "
        "be one of 1, 2, 3, 4, 6, 12 (the divisors of 12)"
    ]
    # No single degree the user wrote can fit alone: the last one is named.
    assert errors({"world_size": 12, "degrees": {"pp": 8, "tp": 8}}) == [
        "degrees.tp: -1 cannot fill the remaining ranks (dp_shard defaults to -1): world_size 12 "
        "is not divisible by pp(8) * dp_replicate(1) * cp(1) * tp(8) = 64"
    ]
    assert errors({"world_size": 12, "degrees": {"pp": -1, "tp": 8}}) == [
        "degrees.pp: -1 cannot fill the remaining ranks: world_size 12 is not divisible by "
        "dp_replicate(1) * dp_shard(1) * cp(1) * tp(8) = 8"
    ]


def test_experts_borrow_from_dp_shard_cp_tp() -> None:
    assert errors({"world_size": 8, "degrees": {"dp_replicate": 4, "tp": 2, "ep": 4}}) == [
        "degrees.ep: ep(4) * etp(1) = 4 must divide dp_shard(1) * cp(1) * tp(2) = 2: "
        "experts borrow their ranks from those dims"
    ]


def test_etp_is_one_or_tp() -> None:
    assert errors({"world_size": 16, "degrees": {"tp": 4, "ep": 2, "etp": 2}}) == [
        "degrees.etp: etp(2) must be 1 or equal to tp(4)"
    ]
    config = load_config({"world_size": 16, "degrees": {"tp": 4, "ep": 2, "etp": 4}})
    assert config.dim_sizes["efsdp"] == 2


def test_derived_formulas() -> None:
    data = {
        "world_size": 8,
        "degrees": {"tp": 2},
        "derived": {
            "half": "tp / 4",
            "bad": "tp * (cp",
            "unknown": "fsdpp * 2",
            "early": "late * 2",
            "late": "tp",
            "tp": "2",
            "zero": "tp * 0",
            "self": "self * 2",
        },
    }
    assert errors(data) == [
        "derived.half: tp(2) / 4: 2 / 4 is not an integer",
        "derived.bad: 'tp * (cp': '(' at column 6 is never closed",
        "derived.unknown: 'fsdpp * 2' uses unknown name 'fsdpp' (did you mean 'fsdp'?); a formula "
        "may use the degrees and the derived dims defined before it: pp, dp_replicate, dp_shard, "
        "cp, tp, ep, etp, batch, fsdp, loss, efsdp, half",
        "derived.early: 'late * 2' uses 'late', which is defined after 'early'; a formula may "
        "use degrees and derived dims defined before it",
        "derived.tp: 'tp' is a degree; a derived dim needs a name of its own",
        "derived.zero: tp(2) * 0 = 0; a dim size must be >= 1",
        "derived.self: 'self * 2' uses 'self' itself",
    ]


def test_derived_names_and_formula_types() -> None:
    assert errors({"derived": {"2x": "tp"}}) == [
        "derived.2x: invalid key: '2x' is not a valid name: use letters, digits and '_', "
        "not starting with a digit"
    ]
    assert errors({"derived": {"x": ["tp"]}}) == [
        "derived.x: expected a formula such as 'dp_shard * cp', got a list"
    ]
    assert errors({1: 2}) == ["key 1 is not a string; meshconf keys are names"]


def test_user_derived_can_redefine_a_default() -> None:
    config = load_config(
        {
            "world_size": 16,
            "degrees": {"dp_shard": 4, "cp": 2, "tp": 2},
            "derived": {"loss": "batch * cp"},
        }
    )
    assert config.dim_sizes["loss"] == 8


def test_domains() -> None:
    base = {"world_size": 8, "degrees": {"dp_shard": 2, "tp": 4}}
    assert errors({**base, "domains": {"a": ["pp", "fsdpp", "tp", "tp"]}}) == [
        "domains.a[1]: unknown dim 'fsdpp' (did you mean 'fsdp'?); dims are the degrees and "
        "the derived dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp, batch, fsdp, loss, efsdp",
        "domains.a[3]: 'tp' appears twice in domain 'a'",
    ]
    assert errors({**base, "domains": {"a": ["pp", "tp"]}}) == [
        "domains.a: pp(1) * tp(4) = 4 != world_size 8"
    ]
    assert errors({**base, "domains": {"a": []}}) == ["domains.a: a domain needs at least one dim"]
    assert errors({**base, "domains": {}}) == [
        "domains: needs at least one domain (or leave it out for the defaults)"
    ]
    assert errors({**base, "domains": {"a": "pp, tp"}}) == [
        "domains.a: expected a list of dim names, outer to inner, such as [pp, fsdp, tp], "
        "got the string 'pp, tp'"
    ]
    assert errors({**base, "domains": {"a": ["pp", 8]}}) == [
        "domains.a[1]: expected a name, got the integer 8"
    ]


def test_shared_dims_denote_the_same_groups() -> None:
    data = {
        "world_size": 8,
        "degrees": {"dp_shard": 2, "tp": 4},
        "domains": {"dense": ["dp_shard", "tp"], "odd": ["tp", "dp_shard"]},
    }
    assert errors(data) == [
        "domains.odd[0]: 'tp' has size 4 stride 2 here but size 4 stride 1 in domain 'dense'; "
        "a dim must denote the same rank groups in every domain",
        "domains.odd[1]: 'dp_shard' has size 2 stride 1 here but size 2 stride 4 in domain "
        "'dense'; a dim must denote the same rank groups in every domain",
    ]


def test_size_one_dims_may_sit_anywhere() -> None:
    data = {
        "world_size": 8,
        "degrees": {"dp_shard": 8},
        "domains": {"a": ["tp", "dp_shard", "cp"], "b": ["cp", "dp_shard", "tp"]},
    }
    assert load_config(data).layout("b").dim_names == ("cp", "dp_shard", "tp")


def test_unknown_keys_with_hints() -> None:
    assert errors({"degrees": {"tpp": 2}, "degreez": {}}) == [
        "degrees.tpp: unknown key 'tpp' (did you mean 'pp' or 'tp'?); allowed: pp, dp_replicate, "
        "dp_shard, cp, tp, ep, etp",
        "degreez: unknown key 'degreez' (did you mean 'degrees'?); allowed: world_size, "
        "gpus_per_node, degrees, order, inside_node, levels, inside, derived, domains, runtime, training",
    ]


def test_a_hint_needs_more_than_letters_in_common_by_chance() -> None:
    """A NeMo file's ``model:`` shares three letters with 'order'; a typo shares most."""
    allowed = "allowed: world_size, gpus_per_node, degrees, order, inside_node, levels, inside, derived, domains, runtime, training"
    assert errors({"model": {}, "odrer": ["pp"], "world": 8}) == [
        f"model: unknown key 'model'; {allowed}",
        f"odrer: unknown key 'odrer' (did you mean 'order'?); {allowed}",
        f"world: unknown key 'world' (did you mean 'world_size'?); {allowed}",
    ]


def test_runtime_options() -> None:
    assert errors({"runtime": {"device": "cuds"}}) == [
        "runtime.device: expected 'auto', 'cuda' or 'cpu', got the string 'cuds' (did you mean 'cuda'?)"
    ]
    assert errors({"runtime": {"device": "cpu", "backend": "nccl"}}) == [
        "runtime.backend: nccl needs device cuda (or auto), not cpu"
    ]
    assert errors({"runtime": {"timeout_s": 0}}) == [
        "runtime.timeout_s: expected an integer >= 1, got 0"
    ]


def test_gpus_per_node_and_world_size_bounds() -> None:
    assert errors({"gpus_per_node": 5000}) == [
        "gpus_per_node: 5000 is larger than 4096, more than any node holds"
    ]
    assert errors({"world_size": 0}) == ["world_size: expected an integer >= 1, got 0"]


def test_checks_without_a_world_size_wait_for_it() -> None:
    config = load_config({"degrees": {"tp": 8, "ep": 4}})
    assert config.resolved_world_size is None
    assert config.pending_checks == (
        "degrees.dp_shard: fill -1 from world_size",
        "degrees.ep: ep * etp divides dp_shard * cp * tp",
        "domains.dataloading: product of dims == world_size",
        "domains.dense: product of dims == world_size",
        "domains.sparse: product of dims == world_size",
        "domains.loss: product of dims == world_size",
        "domains: shared dims denote the same rank groups",
    )
    with pytest.raises(WorldSizeUnknownError, match=r"degrees\.dp_shard is -1"):
        config.layouts  # noqa: B018
    assert config.with_world_size(64).resolved_degrees["dp_shard"] == 8
    # Rules that do not need the world size still run.
    assert errors({"degrees": {"tp": 4, "etp": 2}}) == [
        "degrees.etp: etp(2) must be 1 or equal to tp(4)"
    ]


def test_world_size_implied_by_degrees_without_auto() -> None:
    config = load_config({"degrees": {"dp_shard": 4, "tp": 2}})
    assert config.resolved_world_size == 8 and config.pending_checks == ()


def test_given_world_size_must_agree() -> None:
    assert errors({"world_size": 8}, world_size=16) == [
        "world_size: the config says 8, but the world size is 16"
    ]
    assert load_config({"degrees": {"tp": 2}}, world_size=16).resolved_degrees["dp_shard"] == 8


def test_models_are_frozen_hashable_and_fingerprinted() -> None:
    first = load_config({"world_size": 8, "degrees": {"tp": 2}})
    second = MeshConfig.model_validate({"degrees": {"tp": 2, "dp_shard": -1}, "world_size": 8})
    assert first == second and hash(first) == hash(second)
    assert first.fingerprint == second.fingerprint
    assert len({first, second}) == 1
    other = load_config({"world_size": 8, "degrees": {"tp": 4}})
    assert other.fingerprint != first.fingerprint
    with pytest.raises(Exception, match="frozen"):
        first.world_size = 16  # type: ignore[misc]


def test_fingerprint_is_of_the_resolved_config() -> None:
    auto = load_config({"world_size": 8, "degrees": {"tp": 2}})
    spelled_out = load_config(
        {"world_size": 8, "degrees": {"tp": 2, "dp_shard": 4}, "derived": {"fsdp": "dp_shard * cp"}}
    )
    assert auto.fingerprint == spelled_out.fingerprint and auto == spelled_out


@pytest.mark.parametrize(
    "change",
    [
        {"gpus_per_node": 8},
        {"runtime": {"device": "cpu"}},
        {"runtime": {"backend": "gloo"}},
        {"runtime": {"timeout_s": 60}},
        {"inside_node": {"tp": 2}, "gpus_per_node": 2},
        {"derived": {"fsdp": "dp_shard"}},
        {"domains": {"dense": ["pp", "dp_replicate", "tp", "fsdp"]}},
    ],
    ids=lambda change: ",".join(change),
)
def test_every_part_of_the_resolved_config_changes_the_fingerprint(change: dict[str, Any]) -> None:
    base = {"world_size": 8, "degrees": {"tp": 2}}
    plain = load_config(base)
    changed = load_config({**base, **change})
    assert changed.fingerprint != plain.fingerprint and changed != plain
    assert changed.fingerprint == load_config({**base, **change}).fingerprint


def test_gpus_per_node_values_have_different_fingerprints() -> None:
    on_4 = load_config({"world_size": 8, "gpus_per_node": 4, "degrees": {"tp": 2}})
    on_8 = load_config({"world_size": 8, "gpus_per_node": 8, "degrees": {"tp": 2}})
    assert on_4.fingerprint != on_8.fingerprint


def test_with_world_size_keeps_dp_shard_a_default() -> None:
    config = load_config({"degrees": {"tp": 3}})
    with pytest.raises(ValidationError) as caught:
        config.with_world_size(8)
    assert [(error["loc"], error["msg"]) for error in caught.value.errors()] == [
        (
            ("degrees", "tp"),
            "tp(3) leaves no whole number of ranks for dp_shard (-1 by default): world_size 8 is "
            "not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3; tp could be one of 1, "
            "2, 4, 8 (the divisors of 8)",
        )
    ]
    assert caught.value.title == "MeshConfig"
    assert load_config({}).with_world_size(8).resolved_degrees["dp_shard"] == 8
    with pytest.raises(ValidationError) as caught:
        load_config({"world_size": 8}).with_world_size(16)
    assert [(e["type"], e["loc"], e["msg"]) for e in caught.value.errors()] == [
        ("world_size_conflict", ("world_size",), "the config says 8, but the world size is 16")
    ]
    resized = load_config({"degrees": {"tp": 2}}).with_world_size(8)
    assert resized.degrees.explicit == {"tp"}
    assert resized.with_world_size(8).degrees.explicit == {"tp"}
    # A config that makes another factor -1 keeps dp_shard's default of 1.
    assert load_config({"degrees": {"tp": -1}}).with_world_size(8).resolved_degrees["tp"] == 8


def test_pending_checks_are_the_rules_that_wait_for_the_world_size() -> None:
    domains = (
        "domains.dataloading: product of dims == world_size",
        "domains.dense: product of dims == world_size",
        "domains.sparse: product of dims == world_size",
        "domains.loss: product of dims == world_size",
        "domains: shared dims denote the same rank groups",
    )
    fill_tp, fill_dp_shard = (
        "degrees.tp: fill -1 from world_size",
        "degrees.dp_shard: fill -1 from world_size",
    )
    borrow = "degrees.ep: ep * etp divides dp_shard * cp * tp"
    assert load_config({"degrees": {"tp": -1}}).pending_checks == (fill_tp, *domains)
    assert load_config({"degrees": {"tp": -1, "etp": 2}}).pending_checks == (
        fill_tp,
        "degrees.etp: etp is 1 or tp",
        borrow,
        *domains,
    )
    assert load_config({"degrees": {"tp": 8}}).pending_checks == (fill_dp_shard, *domains)
    assert load_config({"degrees": {"tp": 2, "etp": 2}}).pending_checks == (
        fill_dp_shard,
        borrow,
        *domains,
    )


def test_three_autos_are_all_named() -> None:
    message = "only one degree may be -1 (fill the remaining ranks), but pp and cp and tp all are"
    assert errors({"degrees": {"pp": -1, "tp": -1, "cp": -1}}) == [
        f"degrees.cp: {message}",
        f"degrees.tp: {message}",
    ]


def test_every_domain_whose_product_is_wrong_is_reported() -> None:
    assert errors({"world_size": 16, "degrees": {"cp": 2}, "derived": {"fsdp": "dp_shard"}}) == [
        "domains.dense: pp(1) * dp_replicate(1) * fsdp(8) * tp(1) = 8 != world_size 16 (default domain)"
    ]
    domains = {"a": ["pp", "tp"], "b": ["pp", "cp"], "c": ["dp_shard", "cp", "tp"]}
    assert errors({"world_size": 16, "degrees": {"cp": 2, "tp": 2}, "domains": domains}) == [
        "domains.a: pp(1) * tp(2) = 2 != world_size 16",
        "domains.b: pp(1) * cp(2) = 2 != world_size 16",
    ]


def test_world_size_up_to_the_most_torch_can_number() -> None:
    largest = 2**31 - 1
    assert load_config({"world_size": largest}).resolved_degrees["dp_shard"] == largest
    assert errors({"world_size": largest + 1}) == [
        "world_size: 2147483648 is larger than 2147483647, the most ranks torch can number"
    ]
    assert load_config({"degrees": {"dp_shard": largest}}).resolved_world_size == largest
    assert errors({"degrees": {"dp_shard": 2**16, "tp": 2**15}}) == [
        "degrees: pp(1) * dp_replicate(1) * dp_shard(65536) * cp(1) * tp(32768) = 2147483648 "
        "is more ranks than torch can number (2147483647)",
        "derived.efsdp: dp_shard(65536) * cp(1) * tp(32768) / (ep(1) * etp(1)) = 2147483648; "
        "a dim size must be <= 2147483647",
    ]
    assert load_config({"world_size": 8, "derived": {"x": "2147483647"}}).dim_sizes["x"] == largest
    assert errors({"world_size": 8, "derived": {"x": "2147483648"}}) == [
        "derived.x: 2147483648 = 2147483648; a dim size must be <= 2147483647"
    ]
    assert errors({"world_size": 8, "derived": {"x": "0"}}) == [
        "derived.x: 0 = 0; a dim size must be >= 1"
    ]


def test_a_redefined_default_may_use_other_defaults() -> None:
    config = load_config(
        {"world_size": 8, "degrees": {"dp_shard": 4, "tp": 2}, "derived": {"batch": "fsdp * 1"}}
    )
    assert config.dim_sizes["batch"] == 4


def test_messages_stay_short_and_name_their_limits() -> None:
    long_formula = "tp * " * 200 + "+"
    (line,) = errors({"derived": {"x": long_formula}})
    assert (
        line
        == "derived.x: 'tp * tp * tp * tp * tp * tp * tp * tp * tp * tp * tp * tp...': formula longer than 500 characters"
    )
    assert errors({"derived": {"x" * 70: "tp"}}) == [
        "derived.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx: invalid key: "
        "'xxxxxxxxxxxxxxxxxxxx...' is longer than 64 characters; give a shorter name"
    ]
    assert errors({"derived": {"x": " * ".join(["2147483647"] * 3)}}) == [
        "derived.x: 2147483647 * 2147483647 * 2147483647 = 9903520300447984150353281023; a dim size must be <= 2147483647"
    ]
    assert errors({"runtime": {"device": "CUDA"}}) == [
        "runtime.device: expected 'auto', 'cuda' or 'cpu', got the string 'CUDA' (did you mean 'cuda'?)"
    ]


def test_a_forgotten_key_option_is_pointed_out() -> None:
    assert errors({"parallelism": {"world_size": 8}})[0] == (
        "parallelism: unknown key 'parallelism'; allowed: world_size, gpus_per_node, degrees, order, "
        "inside_node, levels, inside, derived, domains, runtime, training (to check the meshconf block under it, pass --key parallelism)"
    )
