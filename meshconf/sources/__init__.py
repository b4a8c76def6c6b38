"""Reading input: YAML with positions, OmegaConf interpolation, overrides, ``load_config``;
and the memory the host leaves this process.

Layer 3. May import ``meshconf.core``, ``meshconf.model``, PyYAML and OmegaConf; never torch.
"""
