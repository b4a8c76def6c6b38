"""transformers 5 with meshconf's sizes: launch with `torchrun --nproc-per-node 8 train.py
MODEL` on 8 GPUs.

`distributed_config` refuses what transformers' own meshes cannot hold (context parallelism,
tensor-parallel experts, a rank order of the config's own), and gives transformers the sizes
whose dense and expert meshes hold meshconf's dense and sparse groups.
"""

import sys
from pathlib import Path

from transformers import AutoModelForCausalLM

from meshconf import load_config
from meshconf.compat.transformers import distributed_config

config = load_config(Path(__file__).with_name("mesh.yaml"))
model = AutoModelForCausalLM.from_pretrained(
    sys.argv[1], distributed_config=distributed_config(config)
)
print(model.config.name_or_path, "loaded over", config.resolved_world_size, "ranks")
