"""The estimator's activation memory against a measurement on CPU.

How it is measured: every tensor autograd saves for the backward pass goes through
``torch.autograd.graph.saved_tensors_hooks``; the pack hook wraps it in a holder whose
release (when autograd frees the saved tensor after using it) is seen by a weakref
finalizer. The live bytes of the distinct storages held, parameters excluded, are followed
through one forward and backward pass, and their peak is the measured activation memory.
Full checkpointing uses torch.utils.checkpoint's reentrant form, which saves each block's
input through the same hooks and recomputes the block, with the hooks still on, during the
backward pass. The estimator must be within 25% of the peak for ``none`` and ``full``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from llama_like import LlamaLike
from torch.utils.checkpoint import checkpoint

from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.memory import estimate_memory
from meshconf.features.plan.estimate.training import Parallelism, Training

ARCH = Architecture("small", 4, 128, 352, 512, GroupedQueryAttention(4, 2, 32))
SEQ, BATCH = 128, 2


class _Holder:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedBytes:
    """Live bytes of the distinct storages autograd holds for backward, and their peak."""

    def __init__(self, excluded: set[int]) -> None:
        self._excluded = excluded
        self._users: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def pack(self, tensor: torch.Tensor) -> _Holder:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        holder = _Holder(tensor)
        if key in self._excluded or storage.nbytes() == 0:
            return holder
        if self._users.get(key, 0) == 0:
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._users[key] = self._users.get(key, 0) + 1
        weakref.finalize(holder, self._release, key)
        return holder

    def _release(self, key: int) -> None:
        self._users[key] -= 1
        if self._users[key] == 0:
            self.live -= self._sizes.pop(key)

    @staticmethod
    def unpack(holder: _Holder) -> torch.Tensor:
        return holder.tensor

    @contextmanager
    def hooks(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield


def _measured_peak(full: bool) -> int:
    torch.manual_seed(0)
    model = LlamaLike(ARCH)
    excluded = {param.untyped_storage().data_ptr() for param in model.parameters()}
    tracker = SavedBytes(excluded)
    tokens = torch.randint(0, ARCH.vocab, (BATCH, SEQ))
    with tracker.hooks():
        x = model.embedding(tokens)
        for layer in model.layers:
            x = checkpoint(layer, x, use_reentrant=True) if full else layer(x)
        logits = model.output(model.norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        loss.backward()
    assert tracker.live == 0  # every saved tensor was released
    return tracker.peak


@pytest.mark.parametrize("mode", ["none", "full"])
def test_activation_estimate_is_within_25_percent_of_the_measured_peak(mode: str) -> None:
    training = Training(
        seq_len=SEQ,
        micro_batch=BATCH,
        param_dtype="fp32",
        checkpointing=mode,  # type: ignore[arg-type]
    )
    estimated = estimate_memory(ARCH, Parallelism(), training).activations
    measured = _measured_peak(full=mode == "full")
    print(f"{mode}: estimated {estimated} measured {measured} ratio {estimated / measured:.3f}")
    assert estimated == pytest.approx(measured, rel=0.25)
