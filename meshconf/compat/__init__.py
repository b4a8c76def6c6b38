"""Drop-ins for the mesh APIs of other training frameworks, backed by meshconf.

Beside the layers: may import ``core``, ``model``, ``sources`` and, lazily, ``runtime`` (and so
torch). Never imported by meshconf itself.
"""
