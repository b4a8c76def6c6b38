"""Mixture-of-experts dispatch in the estimate: node-limited routing and fp8 dispatch, as
DeepSeek-V3 trains (its report, sections 2.1.2 and 3.2.2: each token goes to experts on at
most 4 nodes, one copy per node over InfiniBand, then to its experts over NVLink; tokens are
dispatched in fp8 and combined in bf16), and DualPipe's overlap of that traffic with
compute (section 3.2.1)."""

from __future__ import annotations

import pytest

from meshconf.features.plan.estimate.communication import traffic
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step import estimate
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

DEEPSEEK = PRESETS["deepseek-v3"]
PAR = Parallelism(pp=16, dp_shard=128, ep=64)
CROSSES = {"ep": 1}


def test_fp8_dispatch_sends_three_quarters_of_bf16() -> None:
    """Dispatch in 1 byte a value, combine in 2: 3 bytes where bf16 both ways send 4."""
    bf16 = traffic(DEEPSEEK, PAR, Training(), CROSSES)["ep"]
    fp8 = traffic(DEEPSEEK, PAR, Training(dispatch_dtype="fp8"), CROSSES)["ep"]
    assert fp8.bytes == pytest.approx(bf16.bytes * 3 / 4, rel=1e-9)


def test_node_limited_routing_sends_one_copy_per_node_and_forwards_over_nvlink() -> None:
    training = Training(intra_node_gb_s=450, inter_node_gb_s=50, moe_max_nodes=4)
    unlimited = traffic(DEEPSEEK, PAR, Training(intra_node_gb_s=450, inter_node_gb_s=50), CROSSES)
    limited = traffic(DEEPSEEK, PAR, training, CROSSES)
    sent = unlimited["ep"].bytes
    assert limited["ep"].bytes == sent
    # top-8 experts on at most 4 nodes: half the copies cross, all of them ride NVLink
    assert unlimited["ep"].seconds == pytest.approx(sent * 8 / 400e9)
    assert limited["ep"].seconds == pytest.approx(sent * 8 * (0.5 / 400e9 + 1 / 3600e9))
    assert limited["ep"].seconds < unlimited["ep"].seconds / 1.5


def test_a_limit_changes_nothing_for_groups_inside_a_node() -> None:
    inside = {"ep": 0}
    limited = traffic(DEEPSEEK, PAR, Training(moe_max_nodes=4), inside)["ep"]
    assert limited == traffic(DEEPSEEK, PAR, Training(), inside)["ep"]


def test_overlapped_dispatch_waits_only_for_what_compute_does_not_cover() -> None:
    """With ep_overlap (DualPipe), the experts' dispatch and combine join FSDP's traffic
    under the compute: the step waits for it only where it outlasts the compute."""
    settings = {
        "seq_len": 4096, "global_batch_tokens": 62914560, "zero_stage": 1, "moe_max_nodes": 4,
        "dispatch_dtype": "fp8",
    }  # fmt: skip
    waiting = estimate(DEEPSEEK, PAR, Training(**settings), CROSSES)  # type: ignore[arg-type]
    hidden = estimate(DEEPSEEK, PAR, Training(**settings, ep_overlap=True), CROSSES)  # type: ignore[arg-type]
    ep = waiting.traffic["ep"].seconds
    assert hidden.traffic == waiting.traffic
    assert waiting.exposed_seconds - hidden.exposed_seconds == pytest.approx(ep, rel=1e-9)
    overlapped = sum(waiting.traffic[name].seconds for name in ("fsdp", "efsdp"))
    assert hidden.compute_seconds > ep + overlapped
    assert waiting.step_seconds - hidden.step_seconds == pytest.approx(
        ep * (1 + waiting.bubble_fraction), rel=1e-9
    )
