"""The configuration models and their rules: field types, formula rules, ``MeshConfig``, schema.

Layer 2. May import ``meshconf.core``, the standard library and pydantic; never YAML,
OmegaConf, files or torch.
"""
