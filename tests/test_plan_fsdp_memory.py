"""FSDP's unsharded working set in the estimate against torch's FSDPMemTracker.

``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` follows every tensor of an
FSDP2 model by kind (sharded and unsharded parameters and gradients, all-gather and
reduce-scatter buffers, activations). It runs here the way torchtitan's memory estimation
does: under ``FakeTensorMode`` and torch's fake process group, so the 4-way FSDP of a small
Llama-shaped model costs no memory and no communication. With ``reshard_after_forward``
False (torchtitan's default under a pipeline), every block's parameters stay gathered from
its forward pass to its backward pass: the peak of the unsharded parameters is the whole
stage, which the estimate's ``gathers`` term counts exactly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from distributed import in_child
from llama_like import LlamaLike
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention
from meshconf.features.plan.estimate.memory import estimate_memory
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

ARCH = Architecture("small", 4, 256, 704, 512, GroupedQueryAttention(4, 2, 64))
FSDP = 4


def _unsharded_peak(reshard_after_forward: bool) -> int:
    """Peak bytes of unsharded parameters over one forward and backward pass."""
    dist.init_process_group("fake", rank=0, world_size=FSDP, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (FSDP,))
        with FakeTensorMode():
            model = LlamaLike(ARCH)
            for layer in model.layers:
                fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
            optimizer = torch.optim.AdamW(model.parameters())
            tokens = torch.randint(0, ARCH.vocab, (2, 64))
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((tokens,))
            with tracker:
                model(tokens).float().sum().backward()
            (peak,) = tracker.get_tracker_snapshot("peak").values()
    finally:
        dist.destroy_process_group()
    return int(next(value for key, value in peak.items() if str(key).endswith("UNSHARDED_PARAM")))


def _check_kept_gathered() -> None:
    measured = _unsharded_peak(reshard_after_forward=False)
    training = Training(
        param_dtype="fp32", grad_dtype="fp32", seq_len=64, micro_batch=2,
        reshard_after_forward="never",
    )  # fmt: skip
    gathers = estimate_memory(ARCH, Parallelism(dp_shard=FSDP), training).gathers
    largest_block_grad = (gathers - measured) // 4
    # never, without a pipeline: the stage's parameters, and one block's gradient at a time
    assert measured == 4 * ARCH.parameter_count()
    assert gathers == measured + 4 * largest_block_grad
    assert 0 < largest_block_grad < ARCH.parameter_count() // ARCH.layers


def test_parameters_kept_gathered_are_the_whole_stage() -> None:
    # In a forked child: the test process never holds a default process group.
    in_child(_check_kept_gathered)
