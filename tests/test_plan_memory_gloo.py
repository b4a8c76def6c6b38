"""The estimator's model-state memory against a real run: on 8 gloo processes, a small
Llama-shaped model parallelized as docs/runtime.md advises (tensor parallelism over ``tp``,
FSDP2 over ``fsdp``, HSDP over ``dp_replicate`` and ``fsdp``), and a small mixture of experts
(experts over ``ep``, FSDP2 over ``efsdp``), takes one AdamW step; then the
bytes of every rank's local parameter, gradient and optimizer-state shards equal the
estimator's figures exactly. The model's dims divide every shard count, so FSDP2 pads
nothing; the estimator's padding rule (``ceil(rows / n)`` rows per rank) is checked against
an uneven split in test_uneven_rows_pad_like_fsdp2."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed import run_ranks
from llama_like import TINY, TINY_MOE, LlamaLike, tensor_parallel_plan
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from meshconf import DistributedContext, load_config
from meshconf.features.plan.estimate.memory import estimate_memory
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

FP32 = Training(param_dtype="fp32", grad_dtype="fp32", seq_len=16, micro_batch=2)


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _state_bytes(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer
) -> dict[str, int]:
    """The bytes of this rank's shards of parameters, gradients and optimizer state."""
    return {
        "params": sum(_local_bytes(p) for p in params),
        "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            _local_bytes(value) for state in optimizer.state.values() for value in state.values()
        ),
    }


def _measure(rank: int, environ: dict[str, str], degrees: dict[str, int]) -> None:
    config = load_config({"world_size": 8, "degrees": degrees})
    with DistributedContext(config, environ=environ) as ctx:
        torch.manual_seed(0)
        model = LlamaLike(TINY)
        if config.dim_sizes["tp"] > 1:
            top, block = tensor_parallel_plan()
            tp_mesh = ctx.get_mesh("tp")
            for layer in model.layers:
                parallelize_module(layer, tp_mesh, block)
            parallelize_module(model, tp_mesh, top)
        dp_dims = ["dp_replicate", "fsdp"] if ctx.get_optional_mesh("dp_replicate") else ["fsdp"]
        dp_mesh = ctx.get_mesh(dp_dims)
        for layer in model.layers:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, TINY.vocab, (FP32.micro_batch, FP32.seq_len))
        logits = model(tokens)
        logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        optimizer.step()

        params = list(model.parameters())
        measured = _state_bytes(params, optimizer)
        expected = estimate_memory(TINY, Parallelism.of(config.resolved_degrees), FP32)
        assert len(params) == 2 * 9 + 3
        assert measured == {
            "params": expected.params,
            "grads": expected.grads,
            "optimizer": expected.optimizer,
        }, (rank, degrees, measured, expected)


LAYOUTS: list[dict[str, Any]] = [
    {"dp_shard": 8},
    {"dp_shard": 4, "tp": 2},
    {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
    {"dp_replicate": 2, "dp_shard": 4},
]


# 8 forked processes each build meshes and run a step on 2 shared cores
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "degrees", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items())
)
def test_model_state_per_rank_equals_the_estimate(degrees: dict[str, int]) -> None:
    run_ranks(_measure, 8, degrees)


def _measure_moe(rank: int, environ: dict[str, str], degrees: dict[str, int]) -> None:
    """Experts split over ep (each rank builds only its own), then FSDP2 over efsdp (HSDP
    over dp_replicate and efsdp); the rest FSDP2 over fsdp. Tokens go to the rank's own
    experts: the parameters and gradients are those of a routed step."""
    config = load_config({"world_size": 8, "degrees": degrees})
    assert TINY_MOE.experts is not None
    with DistributedContext(config, environ=environ) as ctx:
        ep = config.dim_sizes["ep"]
        count = TINY_MOE.experts.routed // ep
        first = ctx.coordinate("sparse")["ep"] * count
        torch.manual_seed(0)
        model = LlamaLike(TINY_MOE, first, count)
        replicate = ctx.get_optional_mesh("dp_replicate") is not None
        dense_mesh = ctx.get_mesh(["dp_replicate", "fsdp"] if replicate else ["fsdp"])
        expert_mesh = ctx.get_mesh(["dp_replicate", "efsdp"] if replicate else ["efsdp"])
        for layer in model.layers:
            if layer.moe is not None:
                fully_shard(layer.moe.experts, mesh=expert_mesh)
            fully_shard(layer, mesh=dense_mesh)
        fully_shard(model, mesh=dense_mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tokens = torch.randint(0, TINY_MOE.vocab, (FP32.micro_batch, FP32.seq_len))
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        optimizer.step()

        params = list(model.parameters())
        measured = _state_bytes(params, optimizer)
        expected = estimate_memory(TINY_MOE, Parallelism.of(config.resolved_degrees), FP32)
        assert measured == {
            "params": expected.params,
            "grads": expected.grads,
            "optimizer": expected.optimizer,
        }, (rank, degrees, measured, expected)


MOE_LAYOUTS: list[dict[str, Any]] = [
    {"dp_shard": 8, "ep": 4},
    {"dp_shard": 8, "ep": 2},
    {"dp_replicate": 2, "dp_shard": 4, "ep": 2},
]


# 8 forked processes each build meshes and run a step on 2 shared cores
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "degrees", MOE_LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items())
)
def test_mixture_of_experts_state_per_rank_equals_the_estimate(degrees: dict[str, int]) -> None:
    run_ranks(_measure_moe, 8, degrees)


def _uneven(rank: int, environ: dict[str, str]) -> None:
    config = load_config({"world_size": 8, "degrees": {"dp_shard": 8}})
    with DistributedContext(config, environ=environ):
        from meshconf.features.plan.estimate.architecture import Weight
        from meshconf.features.plan.estimate.sizing import local_shard

        linear = torch.nn.Linear(7, 13, bias=False)  # 13 rows over 8 ranks
        fully_shard(linear)
        weight = linear.weight
        assert isinstance(weight, DTensor)
        # FSDP2 gives rank r rows [2r, 2r + 2) of 13: 2 rows to ranks 0-5, 1 to rank 6, 0 to 7;
        # each rank allocates the padded 2 rows, which is the estimator's figure.
        rows = weight.to_local().shape[0]
        assert rows == max(0, min(2, 13 - 2 * rank))
        padded = local_shard([Weight("w", 13, 7, "none")], Parallelism(dp_shard=8)).elements
        assert padded == 2 * 7


@pytest.mark.timeout(300)  # 8 forked processes on 2 shared cores
def test_uneven_rows_pad_like_fsdp2() -> None:
    run_ranks(_uneven, 8)
