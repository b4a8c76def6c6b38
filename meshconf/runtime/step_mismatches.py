"""Where the estimate's settings differ from what a measured training step ran
(:mod:`meshconf.runtime.step_memory` observes it), each difference said with the option that
sets it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshconf.features.plan.estimate.step_inputs import Training


@dataclass(frozen=True)
class Observed:
    """What the build ran, as the estimate names it, where the measurement could see it
    (None where not): the sequences its model was called with (``(micro-batch, tokens)``,
    read off the first argument of more than one dimension of each call), the dtype its
    model computed in (that of its output) and its gradients' dtype, and the parameter
    elements the rank stores (the tracker's bytes over the parameters' element size)."""

    calls: frozenset[tuple[int, int]]
    compute_dtype: str | None
    grad_dtype: str | None
    parameter_elements: int | None


@dataclass(frozen=True)
class Mismatch:
    """A setting of the estimate that is not what the build ran: the setting's name in the
    estimate, the build's value and the estimate's, and the sentence that says so."""

    setting: str
    build: int | str
    estimate: int | str
    message: str


#: What each setting that differs says.
_SAID = {
    "micro_batch": "the build's micro-batches hold {build} sequences, the estimate's {estimate}",
    "seq_len": "the build's sequences hold {build} tokens, the estimate's {estimate}",
    "param_dtype": "the build computes in {build}, the estimate in {estimate}",
    "grad_dtype": "the build's gradients are {build}, the estimate's {estimate}",
}


def mismatches(
    observed: Observed,
    training: Training,
    parameter_elements: int,
    options: Mapping[str, str],
    cp: int = 1,
) -> list[Mismatch]:
    """Where the estimate's settings (``training``, and the ``parameter_elements`` it counts
    on this rank) differ from what the build ran; ``options`` holds the option that sets
    each. A sequence split over ``cp`` ranks may reach the model as a rank's share."""
    found: list[Mismatch] = []

    def differ(setting: str, build: int | str, estimate: int | str) -> None:
        said = _SAID[setting].format(
            build=f"{build:,}" if isinstance(build, int) else build,
            estimate=f"{estimate:,}" if isinstance(estimate, int) else estimate,
        )
        found.append(Mismatch(setting, build, estimate, f"{said} ({options[setting]} {build})"))

    elements, wanted = observed.parameter_elements, parameter_elements
    if elements is not None and abs(elements - wanted) > 0.02 * max(wanted, 1):
        found.append(
            Mismatch(
                "model",
                elements,
                wanted,
                f"the build stores {elements:,} parameter elements on this rank, the estimate "
                f"{wanted:,}: estimate the model the build makes ({options['model']} or "
                f"{options['model_file']})",
            )
        )
    if observed.calls:
        batches = {batch for batch, _ in observed.calls}
        tokens = {length for _, length in observed.calls}
        seq_len = training.seq_len
        if training.micro_batch not in batches:
            differ("micro_batch", min(batches), training.micro_batch)
        if not tokens & {seq_len, seq_len // cp}:
            differ("seq_len", max(tokens), seq_len)
    if observed.compute_dtype not in (None, training.param_dtype):
        differ("param_dtype", observed.compute_dtype, training.param_dtype)
    if observed.grad_dtype not in (None, training.grad_dtype):
        differ("grad_dtype", observed.grad_dtype, training.grad_dtype)
    return found
