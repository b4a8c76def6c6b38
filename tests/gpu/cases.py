"""The GPU cases, one per process: ``python tests/gpu/cases.py NAME`` prints ``ok`` (and, for
``build_timing``, the timings) or fails with a traceback.

Each case runs in a fresh process because CUDA and NCCL start threads that a later fork of
the test process must not inherit, and because a CUDA context cannot be shared with forked
children.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from meshconf import DistributedContext, load_config
from meshconf.runtime import all_reduce

ONE_GPU = {"world_size": 1, "runtime": {"device": "cuda"}}


def nccl_default_group() -> None:
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        assert (ctx.device, ctx.backend) == (torch.device("cuda", 0), "nccl")
        assert dist.get_backend() == "nccl"
        world = ctx.world_mesh
        total = all_reduce(torch.ones(3, device="cuda"), "sum", world)
        assert total.device.type == "cuda" and total.tolist() == [1.0, 1.0, 1.0]
        ctx.wait_world()


def every_domain_on_cuda() -> None:
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        for domain, mesh in ctx.build_all().items():
            assert mesh.device_type == "cuda", domain
            assert mesh.mesh_dim_names == ctx.config.layout(domain).dim_names
        fsdp = ctx.get_mesh("fsdp")
        assert fsdp.device_type == "cuda" and fsdp.size() == 1
        assert dist.get_backend(fsdp.get_group()) == "nccl"


def _step(model: nn.Module, inputs: torch.Tensor) -> None:
    nn.functional.mse_loss(model(inputs), torch.zeros_like(inputs)).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()


def fsdp2_step() -> None:
    torch.manual_seed(0)
    reference = nn.Linear(8, 8, device="cuda")
    sharded = nn.Linear(8, 8, device="cuda")
    sharded.load_state_dict(reference.state_dict())
    inputs = torch.randn(4, 8, device="cuda")
    _step(reference, inputs)
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        mesh = ctx.mesh_for("dense")["fsdp"]
        assert dist.get_backend(mesh.get_group()) == "nccl"  # a real group at size 1
        fully_shard(sharded, mesh=mesh)
        _step(sharded, inputs)
        for name, param in sharded.named_parameters():
            full = param.full_tensor()  # type: ignore[attr-defined]
            expected = dict(reference.named_parameters())[name]
            assert torch.allclose(full, expected, atol=1e-6), name


def dtensor_on_tp_of_one() -> None:
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        tp = ctx.mesh_for("dense")["tp"]
        assert tp.size() == 1 and tp.device_type == "cuda"
        local = torch.arange(12.0, device="cuda").reshape(3, 4)
        sharded = distribute_tensor(local, tp, [Shard(0)])
        product = (sharded @ sharded.T).redistribute(tp, [Replicate()])
        assert torch.equal(product.full_tensor(), local @ local.T)


def simulate_65536() -> None:
    config = load_config({"degrees": {"pp": 4, "tp": 8, "ep": 8}})
    ctx = DistributedContext.simulate(config, rank=40_003, world_size=65_536, device_type="cuda")
    try:
        assert ctx.mismatched_groups() == []
        assert all(mesh.device_type == "cuda" for mesh in ctx.build_all().values())
    finally:
        ctx.close()


def build_timing() -> None:
    start = time.perf_counter()
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        built = time.perf_counter() - start
        print(f"one GPU: construction with every domain built {built:.3f} s", flush=True)
    config = load_config({"degrees": {"pp": 4, "tp": 8, "ep": 8}})
    start = time.perf_counter()
    ctx = DistributedContext.simulate(config, rank=40_003, world_size=65_536, device_type="cuda")
    print(f"simulated 65,536 ranks on cuda: {time.perf_counter() - start:.3f} s", flush=True)
    ctx.close()
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    print(f"CUDA {torch.version.cuda}; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")


def runtime_terms() -> None:
    """What the estimate's runtime term takes from published figures, measured on this GPU:
    the memory in use once the CUDA context exists (the process alone on the GPU), and what a
    communicator's first collective takes beside torch's allocator (a single-rank one here:
    NCCL #2363 publishes 512 MiB for one on B300)."""
    from meshconf.features.plan.estimate.gpu_overheads import CUDA_CONTEXT_BYTES

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    context = total - free
    print(
        f"CUDA context: {context / 2**20:.0f} MiB in use after it starts (the estimate's "
        f"published figure: {CUDA_CONTEXT_BYTES / 2**20:.0f} MiB)",
        flush=True,
    )
    with DistributedContext(load_config(ONE_GPU), environ={}) as ctx:
        before, _ = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        all_reduce(torch.ones(1, device="cuda"), "sum", ctx.world_mesh)
        torch.cuda.synchronize()
        after, _ = torch.cuda.mem_get_info()
        nccl = before - after - (torch.cuda.memory_reserved() - reserved)
        print(f"NCCL: {nccl / 2**20:.0f} MiB for a single-rank communicator", flush=True)
    assert context > 0 and nccl >= 0


CASES = {
    case.__name__: case
    for case in (
        nccl_default_group,
        every_domain_on_cuda,
        fsdp2_step,
        dtensor_on_tp_of_one,
        simulate_65536,
        build_timing,
        runtime_terms,
    )
}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print("ok")
