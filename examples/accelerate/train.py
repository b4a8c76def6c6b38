"""accelerate with meshconf's mesh: launch with `torchrun --nproc-per-node 8 --nnodes 2 ...`
(accelerate refuses a CPU-only run with a ParallelismConfig, so this needs the GPUs).

`parallelism_config` refuses, before any mesh exists, what accelerate cannot run (pipeline or
expert parallelism, tp beside pure replication, FSDP2 with nothing to shard), and presets a
mesh that meshconf built from `mesh.yaml`, so accelerate creates no process group of its own.
"""

from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

from meshconf.compat.accelerate import parallelism_config
from meshconf.runtime import DistributedContext

context = DistributedContext.from_yaml(Path(__file__).with_name("mesh.yaml"))
accelerator = Accelerator(
    parallelism_config=parallelism_config(context, fsdp2=True),
    fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2),
)
mesh = accelerator.torch_device_mesh
assert mesh is not None and mesh["dp_shard_cp"].size() == 4
model = accelerator.prepare(torch.nn.Linear(64, 64))
accelerator.print(f"dims {mesh.mesh_dim_names}; FSDP over {mesh['dp_shard_cp'].size()} ranks")
context.close()
