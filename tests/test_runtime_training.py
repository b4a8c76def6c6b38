"""FSDP2 and tensor parallelism on meshconf's meshes: one training step on 8 gloo processes
gives the parameters of a single-process reference step."""

from __future__ import annotations

import torch
from distributed import run_ranks
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from meshconf import DistributedContext, load_config

GLOBAL_BATCH = 16


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16, bias=False)
        self.down = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, 8, generator=generator), torch.randn(
        GLOBAL_BATCH, 8, generator=generator
    )


def reference_step() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = MLP()
    inputs, targets = batch()
    nn.functional.mse_loss(model(inputs), targets).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return {name: param.detach() for name, param in model.named_parameters()}


def _train_one_step(
    rank: int, environ: dict[str, str], degrees: dict[str, int], use_tp: bool
) -> None:
    config = load_config({"world_size": 8, "degrees": degrees})
    with DistributedContext(config, environ=environ) as ctx:
        torch.manual_seed(0)
        model = MLP()
        if use_tp:
            tp_mesh = ctx.get_mesh("tp")
            parallelize_module(model, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        dp_dims = ["dp_replicate", "fsdp"] if ctx.get_optional_mesh("dp_replicate") else ["fsdp"]
        fully_shard(model, mesh=ctx.get_mesh(dp_dims))
        # Each data-parallel rank reads its slice of the global batch (tp ranks share one).
        batch_mesh_size = ctx.config.dim_sizes["batch"]
        index = ctx.coordinate("dataloading")["batch"]
        size = GLOBAL_BATCH // batch_mesh_size
        inputs, targets = batch()
        rows = slice(index * size, (index + 1) * size)
        nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        expected = reference_step()
        for name, param in model.named_parameters():
            full = param.full_tensor()  # type: ignore[attr-defined]
            assert torch.allclose(full, expected[name], atol=1e-6), (
                name,
                (full - expected[name]).abs().max(),
            )


def test_hsdp_2d_with_tensor_parallel_matches_a_single_process_step() -> None:
    run_ranks(_train_one_step, 8, {"dp_replicate": 2, "dp_shard": 2, "tp": 2}, True)


def test_fsdp_1d_over_the_whole_world_matches_a_single_process_step() -> None:
    run_ranks(_train_one_step, 8, {"dp_shard": 8}, False)
