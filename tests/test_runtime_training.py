"""FSDP2 and tensor parallelism on meshconf's meshes: one training step on 8 gloo processes
gives the parameters of a single-process reference step."""

from __future__ import annotations

from typing import Any

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
    rank: int, environ: dict[str, str], layout: dict[str, Any], use_tp: bool
) -> None:
    config = load_config({"world_size": 8, **layout})
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
    run_ranks(_train_one_step, 8, {"degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2}}, True)


def test_fsdp_1d_over_the_whole_world_matches_a_single_process_step() -> None:
    run_ranks(_train_one_step, 8, {"degrees": {"dp_shard": 8}}, False)


def test_hierarchical_hsdp_with_replicas_inside_nodes_matches_a_single_process_step() -> None:
    """Two nodes of 4: the two replicas and tp inside each node, the FSDP shards across
    nodes. The HSDP mesh's rows are ranks {0, 4}, {1, 5}, ...: not row-major."""
    layout = {
        "gpus_per_node": 4,
        "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
        "inside_node": {"dp_replicate": 2, "tp": 2},
    }
    run_ranks(_train_one_step, 8, layout, True, local_world_size=4)


def _tutorial_script(rank: int, environ: dict[str, str], script: str, config: str) -> None:
    import contextlib
    import io
    import os
    import runpy
    import sys
    import warnings

    os.environ.update(environ)
    sys.argv = [script, config]
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        runpy.run_path(script, run_name="__main__")
    assert [str(warning.message) for warning in caught] == []
    assert printed.getvalue().splitlines() == (
        [
            "step 0: mean loss 0.0555",
            "step 1: mean loss 0.0317",
            "step 2: mean loss 0.0272",
        ]
        if rank == 0
        else []
    )


def test_the_tutorial_s_script_with_tensor_parallelism_warns_of_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/tutorial.md's train.py, run with tp 2 (and FSDP over the other 2 ranks), prints
    the losses it prints without tp, and no warning of torch's."""
    import re
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "tutorial.md").read_text()
    found = re.search(r"\$ cat > train.py <<'EOF'\n(.*?)\nEOF\n", page, re.DOTALL)
    assert found is not None
    script = tmp_path / "train.py"
    script.write_text(found[1] + "\n")
    config = tmp_path / "tp2.yaml"
    config.write_text("world_size: 4\ndegrees: {tp: 2}\n")
    run_ranks(_tutorial_script, 4, str(script), str(config))
