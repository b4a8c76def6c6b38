"""Drop-ins for the mesh APIs of other training frameworks, backed by meshconf.

``torchtitan`` serves torchtitan 0.3's ``ParallelDims``, ``torchtitan_v0_2`` torchtitan 0.2's,
and ``d9d`` d9d 0.24's ``DeviceMeshParameters`` (with ``d9d_context`` for its context).
A function that hands a trainer meshes takes a ``DistributedContext``
(``accelerate.parallelism_config``, ``nemo_automodel.meshes``), and one that hands it sizes,
for the trainer to build its own groups, takes a ``MeshConfig``
(``transformers.distributed_config``, ``megatron.initialize_model_parallel``), as every
``check_config`` does.

Beside the layers: may import ``core``, ``model``, ``sources``, ``trainers`` (what a trainer
refuses, and its names) and ``features`` (Megatron-LM's arguments, checked by converting them
back), and, lazily, ``runtime`` (and so torch). Never imported by meshconf itself.
"""
