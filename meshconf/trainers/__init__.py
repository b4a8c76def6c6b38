"""What meshconf knows of a trainer that it both converts from and hands meshes to, one
module per trainer, read by ``meshconf convert --from`` (:mod:`meshconf.features.convert`) and
by :mod:`meshconf.compat` alike: its size names and the meshconf degree each one is, its dims
and the dims it flattens, and the layouts it refuses, each refusal worded once.

Layer 2, beside ``model``. May import only the standard library and ``meshconf.core``: no
pydantic, no YAML, no files, no torch. A trainer that only one side serves keeps what it knows
there: Megatron-LM's in ``features.convert``, transformers', NeMo AutoModel's and d9d's in
``compat``.
"""
