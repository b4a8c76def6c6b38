"""Integrations with other tools (Hydra); each is imported only by its users.

Beside the layers: may import ``core``, ``model`` and ``sources``, and the tool it integrates.
Never imported by meshconf itself.
"""
