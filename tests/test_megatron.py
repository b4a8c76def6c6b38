"""``convert --from megatron`` against Megatron-Core itself: for many configurations, the
groups of Megatron's ``RankGenerator`` (pure Python, no CUDA, no process group) equal, rank
by rank, the groups of the converted meshconf config's dims."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from megatron_code import RankGenerator

from meshconf.core.layout import DomainLayout
from meshconf.features.convert import ConversionError, convert_megatron
from meshconf.features.convert.megatron_grid import DEFAULT_ORDER, TP_PP_DP_ORDER
from meshconf.features.convert.megatron_input import read_command_line
from meshconf.sources.loading import load_config

ORDERS = ["-".join(names) for names in itertools.permutations(("tp", "cp", "ep", "dp", "pp"))]
#: Orders without ep, which Megatron completes with ep outermost, and refuses when ep > 1.
SHORT_ORDERS = ["-".join(names) for names in itertools.permutations(("tp", "cp", "dp", "pp"))]


def megatron_groups(
    tp: int, pp: int, cp: int, ep: int, etp: int, instances: int, world: int, order: str
) -> dict[str, list[list[int]]] | None:
    """Megatron's groups as initialize_model_parallel builds them, or None where its own
    start-up checks refuse the configuration."""
    dp = world // (tp * pp * cp)
    expert_dp = world // (etp * ep * pp)
    try:
        dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
        expert = RankGenerator(tp=etp, ep=ep, dp=expert_dp, pp=pp, cp=1, order=order)
    except RuntimeError:  # a size above 1 that the order leaves out
        return None
    if not (order.endswith("pp") or pp == 1 or expert_dp == dp):
        return None
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        return None
    if dp % instances or expert_dp % instances:
        return None
    groups = {
        "tp": dense.get_ranks("tp"),
        "cp": dense.get_ranks("cp"),
        "pp": dense.get_ranks("pp"),
        "dp": dense.get_ranks("dp"),
        "dp-cp": dense.get_ranks("dp-cp"),
        "ep": expert.get_ranks("ep"),
        "expert-tp": expert.get_ranks("tp"),
        "expert-dp": expert.get_ranks("dp"),
    }
    if instances > 1:
        intra = dp * cp // instances
        groups["intra-dp-cp"] = [
            ranks[start : start + intra]
            for ranks in groups["dp-cp"]
            for start in range(0, len(ranks), intra)
        ]
        groups["inter-dp-cp"] = [
            ranks[offset::intra] for ranks in groups["dp-cp"] for offset in range(intra)
        ]
        expert_intra = expert_dp // instances
        groups["intra-expert-dp"] = [
            ranks[start : start + expert_intra]
            for ranks in groups["expert-dp"]
            for start in range(0, len(ranks), expert_intra)
        ]
    return groups


#: The meshconf dims that hold each Megatron group.
MESHCONF_DIMS = {
    "tp": ("dense", ("tp",)),
    "cp": ("dataloading", ("cp",)),
    "pp": ("dense", ("pp",)),
    "dp": ("dataloading", ("batch",)),
    "dp-cp": ("loss", ("loss",)),
    "ep": ("sparse", ("ep",)),
    "expert-tp": ("sparse", ("etp",)),
    "expert-dp": ("sparse", ("dp_replicate", "efsdp")),
    "intra-dp-cp": ("dense", ("fsdp",)),
    "inter-dp-cp": ("dense", ("dp_replicate",)),
    "intra-expert-dp": ("sparse", ("efsdp",)),
}


def command_line(
    tp: int, pp: int, cp: int, ep: int, etp: int, instances: int, world: int, order: str
) -> str:
    return (
        f"torchrun --nproc-per-node {8 if world % 8 == 0 else world} --nnodes "
        f"{world // 8 if world % 8 == 0 else 1} "
        f"pretrain_gpt.py --tensor-model-parallel-size {tp} --pipeline-model-parallel-size "
        f"{pp} --context-parallel-size {cp} --expert-model-parallel-size {ep} "
        f"--expert-tensor-parallel-size {etp} --num-distributed-optimizer-instances "
        f"{instances} --use-distributed-optimizer --order {order}"
    )


def assert_same_groups(layouts: dict[str, DomainLayout], groups: dict[str, list[list[int]]]) -> int:
    """Every rank's group of every kind is Megatron's; returns how many were compared."""
    compared = 0
    for kind, megatron in groups.items():
        domain, dims = MESHCONF_DIMS[kind]
        layout = layouts[domain]
        for ranks in megatron:
            expected = sorted(ranks)
            for rank in ranks:
                assert sorted(layout.group(rank, dims).ranks()) == expected, (kind, rank)
                compared += 1
    return compared


def check(tp: int, pp: int, cp: int, ep: int, etp: int, instances: int, dp: int, order: str) -> str:
    """'refused' where Megatron refuses, 'inexpressible' where meshconf says it cannot hold
    Megatron's groups, 'equal' where it converts and every group is Megatron's."""
    world = tp * pp * cp * dp
    groups = megatron_groups(tp, pp, cp, ep, etp, instances, world, order)
    settings_ = read_command_line(command_line(tp, pp, cp, ep, etp, instances, world, order))
    if groups is None:
        with pytest.raises(ConversionError):
            convert_megatron(settings_)
        return "refused"
    try:
        conversion = convert_megatron(settings_)
    except ConversionError as error:
        (problem,) = error.problems
        assert "meshconf cannot express Megatron's" in problem.message, problem.message
        return "inexpressible"
    config = load_config(conversion.data)
    assert config.resolved_world_size == world
    assert assert_same_groups(config.layouts, groups) == world * len(groups)
    return "equal"


@st.composite
def megatron_configs(draw: st.DrawFn) -> tuple[Any, ...]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 6, 8, 16, 32]))
    instances = draw(st.sampled_from([d for d in (1, 2, 4) if dp % d == 0]))
    etp = draw(st.sampled_from([1, tp]))
    lender = dp * cp * tp // etp
    ep = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if lender % d == 0]))
    order = draw(st.sampled_from([DEFAULT_ORDER, TP_PP_DP_ORDER, *ORDERS, *SHORT_ORDERS]))
    return tp, pp, cp, ep, etp, instances, dp, order


# 300 configurations compared rank by rank, some of 16,384 ranks: about 30 s on one core.
@pytest.mark.slow  # a long generated sweep: the quick loop leaves it out
@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(megatron_configs())
def test_converted_groups_are_megatrons_rank_by_rank(config: tuple[Any, ...]) -> None:
    outcome = check(*config)
    order = config[-1]
    # Every order with tp innermost, then cp, then ep converts; the two that Megatron-LM's
    # command line offers are among them.
    if order.startswith("tp-cp-ep-"):
        assert outcome != "inexpressible", config


@pytest.mark.parametrize("order", [DEFAULT_ORDER, TP_PP_DP_ORDER])
def test_large_worlds_are_megatrons_rank_by_rank(order: str) -> None:
    """4,096 ranks: tp 8, pp 8, cp 2, dp 32 with 2 optimizer instances, ep 16; and 2,048
    with ep 8 and expert tp 8 (default order) or 1,024 with 4 instances (pipelines inside
    data parallelism, where Megatron needs ep * expert tp = tp * cp)."""
    assert check(8, 8, 2, 16, 1, 2, 32, order) == "equal"
    if order == DEFAULT_ORDER:
        assert check(8, 4, 1, 8, 8, 1, 64, order) == "equal"
    else:
        assert check(4, 8, 2, 8, 1, 4, 16, order) == "equal"


def test_every_order_megatron_accepts_is_equal_or_refused_by_name() -> None:
    """All 120 orders of tp 2, cp 2, ep 2, dp 4, pp 2, with expert tp 1 and 2 and one or
    two optimizer instances: each converts to Megatron's groups or is refused naming the
    group meshconf cannot hold; every order that starts tp-cp-ep converts."""
    outcomes: dict[str, list[tuple[str, int, int]]] = {}
    for order in ORDERS:
        for etp, instances in itertools.product((1, 2), (1, 2)):
            outcome = check(2, 2, 2, 2, etp, instances, 4, order)
            outcomes.setdefault(outcome, []).append((order, etp, instances))
            if order.startswith("tp-cp-ep-"):
                assert outcome != "inexpressible", (order, etp, instances)
    tally = {outcome: len(cases) for outcome, cases in outcomes.items()}
    assert tally == {"equal": 95, "refused": 272, "inexpressible": 113}, tally


def test_ep_outside_expert_dp_is_written_as_a_sparse_domain() -> None:
    """tp-cp-dp-ep-pp: Megatron's expert grid varies expert dp before ep, so the converted
    config lists ep before efsdp in the sparse domain, and its groups are Megatron's."""
    settings_ = read_command_line(command_line(2, 1, 1, 4, 2, 1, 16, "tp-cp-dp-ep-pp"))
    conversion = convert_megatron(settings_)
    assert conversion.data["domains"]["sparse"] == ["pp", "dp_replicate", "ep", "efsdp", "etp"]
    groups = megatron_groups(2, 1, 1, 4, 2, 1, 16, "tp-cp-dp-ep-pp")
    assert groups is not None
    layouts = load_config(conversion.data).layouts
    assert assert_same_groups(layouts, groups) == 16 * len(groups)
    assert layouts["sparse"].group(0, "ep").ranks() == [0, 4, 8, 12]
