"""Drop-ins for the mesh APIs of other training frameworks, backed by meshconf.

``torchtitan`` serves torchtitan 0.3's ``ParallelDims``, ``torchtitan_v0_2`` torchtitan 0.2's,
and ``d9d`` d9d 0.24's ``DeviceMeshParameters`` (with ``d9d_context`` for its context).

Beside the layers: may import ``core``, ``model``, ``sources`` and, lazily, ``runtime`` (and so
torch). Never imported by meshconf itself.
"""
