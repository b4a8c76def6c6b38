"""The ``training`` block of a config converted from Megatron-LM's settings: the ZeRO stage
of its distributed optimizer, fp8 parameter gathers, the pipeline split's weights, the
settings of :data:`~.megatron_input.TRAINING_SETTINGS` and activation recomputation, where
the estimate's modes say the same as Megatron's.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshconf.core.errors import describe_value
from meshconf.features.convert.common import Draft, boolean_problem
from meshconf.features.convert.megatron_input import (
    SPLIT_WEIGHT_SETTINGS,
    TRAINING_SETTINGS,
    Setting,
    integer_setting,
)


def training_block(draft: Draft, settings: Mapping[str, Setting]) -> None:
    """The config's ``training`` block from Megatron's settings: the ZeRO stage its
    distributed optimizer gives, the pipeline split's weights (:data:`SPLIT_WEIGHT_SETTINGS`),
    and each of :data:`TRAINING_SETTINGS` given."""
    optimizer = settings.get("use_distributed_optimizer")
    problem = None if optimizer is None else boolean_problem(optimizer.value)
    if optimizer is not None and problem is not None:
        draft.fail(optimizer.key, problem)
    distributed = optimizer is not None and optimizer.value is True
    draft.training["zero_stage"] = 1 if distributed else 0
    if optimizer is not None:
        draft.origins[("training", "zero_stage")] = optimizer.key
    fp8 = settings.get("fp8_param_gather")
    if fp8 is not None:
        # validated with the config, and a problem reported at Megatron's key
        draft.training["fp8_param_gather"] = fp8.value
        draft.origins[("training", "fp8_param_gather")] = fp8.key
    for name, key in SPLIT_WEIGHT_SETTINGS.items():
        switch = settings.get(name)
        problem = None if switch is None else boolean_problem(switch.value)
        if switch is not None and problem is not None:
            draft.fail(switch.key, problem)
        elif switch is not None and switch.value is True:
            draft.training[key] = 1
            draft.origins[("training", key)] = switch.key
    for name, key in TRAINING_SETTINGS.items():
        setting = settings.get(name)
        # NeMo writes null for a setting it leaves to Megatron's default
        if setting is None or setting.value is None:
            continue
        value = integer_setting(draft, setting)
        if value is None:
            continue
        draft.training[key] = value
        draft.origins[("training", key)] = setting.key
        if key == "virtual_stages":
            draft.training["pp_schedule"] = "interleaved"
    granularity = settings.get("recompute_granularity")
    if granularity is not None and granularity.value is not None:
        _recomputation(draft, settings, granularity)


def _recomputation(draft: Draft, settings: Mapping[str, Setting], granularity: Setting) -> None:
    """``training.activation_checkpointing`` from Megatron's recomputation, where the
    estimate's modes say the same: each block recomputed whole, the first blocks of each
    chunk (``block``, with ``checkpoint_first``), or Megatron's selective recomputation, which
    keeps what no recomputation keeps under flash attention."""
    key = ("training", "activation_checkpointing")
    if granularity.value == "selective":
        draft.training["activation_checkpointing"] = "none"
        draft.origins[key] = granularity.key
        draft.notes.append(
            "--recompute-granularity selective recomputes the core attention, which the flash "
            "attention kernel does not keep anyway: training.activation_checkpointing: none "
            "(meshconf's selective is torchtitan's per-op policy)."
        )
        return
    if granularity.value != "full":
        draft.fail(
            granularity.key, f"expected full or selective, got {describe_value(granularity.value)}"
        )
        return
    method = settings.get("recompute_method")
    layers = settings.get("recompute_num_layers")
    count = None if layers is None or layers.value is None else integer_setting(draft, layers)
    if method is not None and method.value == "uniform" and count == 1:
        draft.training["activation_checkpointing"] = "full"
        draft.origins[key] = granularity.key
        return
    if method is not None and method.value == "block" and layers is not None and count:
        # the first recompute_num_layers blocks of each model chunk
        draft.training["activation_checkpointing"] = "full"
        draft.origins[key] = granularity.key
        # validated with the config, and a problem reported at Megatron's key
        draft.training["checkpoint_first"] = count
        draft.origins[("training", "checkpoint_first")] = layers.key
        return
    how = "" if method is None else f" --recompute-method {method.value}"
    how += "" if layers is None else f" --recompute-num-layers {layers.value}"
    draft.notes.append(
        f"--recompute-granularity full{how} is not converted: the estimate recomputes blocks "
        "one at a time (--recompute-method uniform --recompute-num-layers 1, or block), not in "
        "groups; give --activation-checkpointing to plan and show."
    )
