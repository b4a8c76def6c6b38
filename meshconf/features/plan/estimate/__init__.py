"""Estimates for a layout and a model, in pure Python (no torch): per-rank memory
(:mod:`.memory`, :mod:`.activations`), communication per dim (:mod:`.communication`) and
step time (:mod:`.step`), from a model's weights (:mod:`.architecture`, :mod:`.presets`,
:mod:`.model_file`) and the training settings (:mod:`.step_inputs`). Formulas and sources:
docs/plan.md, "How the estimates are made".
"""
