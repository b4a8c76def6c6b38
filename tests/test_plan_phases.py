"""Where in a step a rank's memory peaks under FSDP (``Memory.phase``): in a block's backward
pass, at the loss's, when FSDP gathers the final norm and the output again for the norm's
backward pass, or in the embedding's. tests/test_measure.py measures the output phase with
torch's ``FSDPMemTracker``; here, which phase wins and what each holds, in bytes worked out
from the model's shapes."""

from __future__ import annotations

from meshconf.features.plan.estimate.memory import estimate_memory, rank_memory
from meshconf.features.plan.estimate.pipeline import rank_stages
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.features.plan.estimate.step_inputs import Parallelism, Training

LLAMA = PRESETS["llama3-8b"]
#: Llama 3 8B's final norm and output, and its embedding, in elements (FSDP over 8 pads
#: neither: 4096 and 128,256 rows are multiples of 8)
OUTPUT = 4096 + 128_256 * 4096
EMBEDDING = 128_256 * 4096
P, G = 2, 4  # bf16 parameters, fp32 gradients


def test_a_long_sequence_peaks_at_the_loss_with_the_output_gathered() -> None:
    memory = estimate_memory(LLAMA, Parallelism(dp_shard=8), Training(seq_len=8192))
    assert memory.phase == "loss"
    assert memory.gathers == OUTPUT * P
    assert memory.block_backward == 0 < memory.output_head


def test_a_short_sequence_peaks_when_the_output_is_gathered_again() -> None:
    memory = estimate_memory(LLAMA, Parallelism(dp_shard=8), Training(seq_len=1024))
    assert memory.phase == "output"
    # the group gathered, its all-gather buffer, the output's gradient to reduce-scatter
    assert memory.gathers == OUTPUT * (2 * P + G)
    assert memory.output_head == memory.block_backward == 0


def test_the_first_stage_peaks_in_the_embedding_s_backward_pass() -> None:
    # each block gathered on its own, a pipeline stage of 2 blocks: the embedding outweighs
    # a block, with the stored tensors freed
    training = Training(seq_len=256, reshard_after_forward="always", global_batch_tokens=256 * 8)
    par = Parallelism(pp=16, dp_shard=8)
    first = rank_stages(LLAMA, par.pp, 1, (None, None))[0]
    memory = rank_memory(LLAMA, par, training, first)
    assert (memory.phase, memory.pp_rank) == ("embedding", 0)
    assert memory.gathers == EMBEDDING * (2 * P + G)
    assert memory.activations == memory.in_flight == 0


def test_without_fsdp_the_phases_share_the_blocks_gathers() -> None:
    # ZeRO 1 gathers nothing during the step: the loss's peak is its activations
    memory = estimate_memory(LLAMA, Parallelism(dp_shard=8), Training(zero_stage=1))
    assert (memory.phase, memory.gathers) == ("loss", 0)


def test_the_explanation_says_what_the_output_phase_holds(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "plan", "--world-size", "8", "--model", "llama3-8b", "--dp-shard", "8",
        "--seq-len", "1024", "--explain", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    gathers = next(line for line in lines if line.startswith("  gathers"))
    assert gathers.endswith(
        "the final norm and the output gathered again for the norm's backward pass, their "
        "all-gather buffer, and the output's gradient in its reduce-scatter buffer"
    )
    activations = next(line for line in lines if line.startswith("  activations"))
    assert activations.endswith("in flight, at the final norm's backward pass")
