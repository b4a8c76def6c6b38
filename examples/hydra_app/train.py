"""A Hydra app whose mesh comes from the `parallelism` config group.

    python examples/hydra_app/train.py
    python examples/hydra_app/train.py parallelism=moe_64gpu parallelism.degrees.tp=2
    python examples/hydra_app/train.py --multirun parallelism=llama3_8b_8gpu,moe_64gpu

It prints the validated mesh. A training script would pass the config on to
`meshconf.DistributedContext(mesh_config)` under torchrun and ask it for meshes.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from meshconf.integrations.hydra import instantiate, register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    mesh_config = instantiate(cfg.parallelism)
    degrees = " ".join(f"{name}={size}" for name, size in mesh_config.resolved_degrees.items())
    dense = mesh_config.layout("dense")
    dims = ", ".join(f"{dim.name}={dim.size}" for dim in dense.dims)
    print(f"{cfg.experiment}: world_size {mesh_config.resolved_world_size}, {degrees}")
    print(f"  dense [{dims}], fingerprint {mesh_config.fingerprint[:12]}")


if __name__ == "__main__":
    main()
