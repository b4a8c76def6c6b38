"""The estimator's activation memory against torch's ``MemTracker`` on CPU, under
``FakeTensorMode``, with each block of a small Llama-shaped model wrapped as torchtitan
wraps it (tests/measure_builds.py) for ``none``, ``selective`` (torchtitan's per-op policy)
and ``full``:

- what a block stores, the growth of the tracked activations between two blocks' ends of
  forward, equals the estimate exactly;
- the activations at the peak of the last block's backward pass (what every block stored,
  the recomputed tensors and the gradients in flight) are within 5% of the estimate.

The loss's share is measured in tests/test_plan_loss_memory.py.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import replace

import pytest
import torch
from llama_like import LlamaLike
from measure_builds import checkpointed, cpu_norm_extra, tracked_step
from routed_moe import RoutedMoE

from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
)
from meshconf.features.plan.estimate.memory import estimate_memory
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training, recomputed_blocks

ARCH = Architecture("small", 4, 128, 352, 512, GroupedQueryAttention(4, 2, 32))
SEQ, BATCH = 128, 2


def _model(
    arch: Architecture, mode: str, fp8: bool = False, wrapped: list[bool] | None = None
) -> LlamaLike:
    """The model, its blocks wrapped for ``mode`` (``full`` only those ``wrapped`` says);
    with experts, routed as torchtitan routes them (tests/routed_moe.py) and the router's
    product recomputed, as torchtitan's policy recomputes it; with ``fp8``, the blocks'
    linear layers trained in fp8 by torchao."""
    if arch.experts is None:
        model = LlamaLike(arch)
        if fp8:
            from torchao.float8 import convert_to_float8_training

            convert_to_float8_training(model, module_filter_fn=lambda _, fqn: fqn != "output")
        return checkpointed(model, mode, wrapped=wrapped)
    model = LlamaLike(arch, 0, arch.experts.routed)
    for layer in model.layers:
        if layer.moe is not None:
            layer.moe = RoutedMoE(arch)
    return checkpointed(model, mode, frozenset({(arch.hidden, arch.experts.routed)}))


@functools.cache
def _tracked(
    mode: str,
    arch: Architecture = ARCH,
    fp8: bool = False,
    wrapped: tuple[bool, ...] | None = None,
) -> tuple[list[int], int]:
    """The tracked activations at each block's end of forward, and at the peak of the last
    block's backward pass, in bytes; the run of one model is tracked once, for the tests of
    what its blocks store and of its peak alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # real tensors for experts: the meta kernel of the grouped products takes bf16 only
    with FakeTensorMode() if arch.experts is None else contextlib.nullcontext():
        torch.manual_seed(0)
        model = _model(arch, mode, fp8, None if wrapped is None else list(wrapped))
        tokens = torch.randint(0, arch.vocab, (BATCH, SEQ))
        ends, last_backward = tracked_step(model, tokens, "LlamaLike.layers")
    assert len(ends) == arch.layers
    return ends, last_backward


MODES = ["none", "selective", "full"]
#: the same model with a mixture of experts from its second block on
MOE_ARCH = Architecture(
    "small-moe", 4, 128, 352, 512, GroupedQueryAttention(4, 2, 32), Experts(8, 2, 64, 1, 1)
)
#: the same model with Qwen3's norms of each query and key head
QK_NORM_ARCH = Architecture(
    "small-qk-norm", 4, 128, 352, 512, GroupedQueryAttention(4, 2, 32, True)
)
CASES = [(arch, mode) for arch in (ARCH, MOE_ARCH, QK_NORM_ARCH) for mode in MODES]


@pytest.mark.parametrize(("arch", "mode"), CASES, ids=[f"{a.name}-{m}" for a, m in CASES])
def test_what_a_block_stores_is_the_estimate_exactly(arch: Architecture, mode: str) -> None:
    ends, _ = _tracked(mode, arch)
    kind = arch.kind(arch.layers - 1)
    expected = activations.block(arch, kind, mode)  # type: ignore[arg-type]
    offsets = 0
    if mode == "none":
        expected += cpu_norm_extra(arch)
        # the grouped products also keep the experts' int32 offsets, a few bytes a block
        offsets = 4 * arch.experts.routed if arch.experts else 0
    tokens = SEQ * BATCH
    assert [later - earlier for earlier, later in itertools.pairwise(ends)] == [
        expected.bytes(tokens, 1, 4) + offsets
    ] * (arch.layers - 1)


@pytest.mark.parametrize(("arch", "mode"), CASES, ids=[f"{a.name}-{m}" for a, m in CASES])
def test_the_last_blocks_backward_peak_is_within_5_percent(arch: Architecture, mode: str) -> None:
    _, measured = _tracked(mode, arch)
    tokens = SEQ * BATCH
    kind = arch.kind(arch.layers - 1)
    stored = activations.block(arch, kind, mode)  # type: ignore[arg-type]
    working = activations.backward_working_set(arch, kind, mode)  # type: ignore[arg-type]
    # every norm of the stored blocks (none) or of the recomputed one runs on CPU
    norms = arch.layers if mode == "none" else 1
    estimated = arch.layers * stored.bytes(tokens, 1, 4) + working.bytes(tokens, 1, 4)
    estimated += norms * cpu_norm_extra(arch).bytes(tokens, 1, 4)
    print(f"{mode}: estimated {estimated} measured {measured} ratio {estimated / measured:.3f}")
    assert estimated == pytest.approx(measured, rel=0.05)


def test_fp8_linear_layers_store_what_bf16_ones_do() -> None:
    """torchao's float8 training (what --fp8-param-gather estimates) keeps each product's
    input in its own dtype for the backward pass and casts it again there, so a block stores
    what it stores without fp8; the casts add one product's fp8 copies at a time."""
    ends, last_backward = _tracked("none")
    fp8_ends, fp8_last_backward = _tracked("none", fp8=True)
    assert fp8_ends == ends
    assert last_backward <= fp8_last_backward <= 1.05 * last_backward


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize(("tp", "ep"), [(1, 1), (2, 1), (8, 1), (1, 8), (8, 8)])
def test_a_block_at_its_backward_pass_holds_the_same_in_every_mode(
    preset: str, tp: int, ep: int
) -> None:
    """Checkpointing trades what a block stores for what its backward pass recomputes: the
    less a mode stores, the more the backward pass holds, and at that point every mode holds
    what ``none`` keeps and the gradients in flight; ``selective`` under tp also the row-wise
    products' partial sums and reduce-scatters it kept, which ``none`` does not keep."""
    arch = PRESETS[preset]
    for kind in ("dense", "moe") if arch.experts else ("dense",):
        stored, held = {}, {}
        for mode in ("none", "selective", "full"):
            stored[mode] = activations.block(arch, kind, mode, tp > 1, ep > 1).bytes(8192, tp, 2)
            working = activations.backward_working_set(arch, kind, mode, tp > 1, ep > 1)
            held[mode] = stored[mode] + working.bytes(8192, tp, 2)
        assert stored["full"] < stored["selective"] < stored["none"]
        assert held["full"] == held["none"]
        if tp == 1:
            assert held["selective"] == held["none"]
        else:
            assert held["selective"] >= held["none"]


@pytest.mark.parametrize(
    ("rule", "wrapped"),
    [
        ({"checkpoint_every": 2}, [False, True, False, True]),
        ({"checkpoint_every": 3}, [False, False, True, False]),
        ({"checkpoint_first": 1}, [True, False, False, False]),
        ({"checkpoint_first": 3}, [True, True, True, False]),
    ],
)
def test_some_blocks_recomputed_are_the_estimate(rule: dict[str, int], wrapped: list[bool]) -> None:
    """torchtitan's layer-wise selective checkpointing (``selective_ac_option = "N"``,
    ``--checkpoint-every N``: every N-th block wrapped) and Megatron-LM's ``--recompute-method
    block`` (``--checkpoint-first N``: the first N of a chunk): the blocks recomputed store
    what ``full`` stores, the others what ``none`` does, exactly, and the estimate picks the
    same blocks; the last block's backward peak is within 5%."""
    ends, measured = _tracked("full", ARCH, wrapped=tuple(wrapped))
    tokens = SEQ * BATCH
    training = Training(checkpointing="full", **rule)  # type: ignore[arg-type]
    full = activations.block(ARCH, "dense", "full").bytes(tokens, 1, 4)
    kept = (activations.block(ARCH, "dense", "none") + cpu_norm_extra(ARCH)).bytes(tokens, 1, 4)
    if training.checkpoint_every is not None:
        # counted across the rank's blocks: chunks of one block each say which
        one_each = ((1, 0),) * ARCH.layers
        per_block = recomputed_blocks(one_each, "full", training.checkpoint_every, None)
        assert [dense == 1 for dense, _ in per_block] == wrapped
    else:
        # the first of the chunk
        chunk = ((ARCH.layers, 0),)
        first = wrapped.count(True)
        assert recomputed_blocks(chunk, "full", None, training.checkpoint_first) == ((first, 0),)
        assert wrapped == [True] * first + [False] * (ARCH.layers - first)
    stored = [full if whole else kept for whole in wrapped]
    assert [later - earlier for earlier, later in itertools.pairwise(ends)] == stored[1:]
    # the estimate of the whole rank stores the same, less the CPU norms' copies
    memory = estimate_memory(
        ARCH, Parallelism(), replace(training, seq_len=SEQ, micro_batch=BATCH, param_dtype="fp32")
    )
    norms = wrapped.count(False) * cpu_norm_extra(ARCH).bytes(tokens, 1, 4)
    assert memory.activations - memory.block_backward - memory.output_head == sum(stored) - norms
    # the last block's backward pass: what every block stored, and its own working set (with
    # its norms' CPU copies, when it is recomputed)
    last = "full" if wrapped[-1] else "none"
    working = activations.backward_working_set(ARCH, "dense", last).bytes(tokens, 1, 4)
    working += cpu_norm_extra(ARCH).bytes(tokens, 1, 4) if wrapped[-1] else 0
    estimated = sum(stored) + working
    print(f"{rule}: estimated {estimated} measured {measured} ratio {estimated / measured:.3f}")
    assert estimated == pytest.approx(measured, rel=0.05)
