"""``meshconf measure``: the user's own build function, run for one rank under fake tensors
and torch's fake process group (which simulates the world: nothing communicates), measured
by torch's memory trackers, beside the estimate for the same shapes.

Each run is a ``meshconf measure`` command, run from the tests folder so that ``--build
measure_builds:...`` imports tests/measure_builds.py: in a child forked from a server that
imported torch and the build module once (tests/forkserver.py), as a subprocess would run it
but for the imports; the build that cannot be imported runs in a fresh process. The
tolerances are those
docs/estimate.md states: the model state (parameters, optimizer) exactly; FSDP's gathered
working set within 15%, the activations within 10% and the peak within 5% of the estimate.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import forkserver
import pytest
from measure_builds import (
    ARCH,
    BATCH,
    LARGE_VOCABULARY,
    LARGE_VOCABULARY_FILE,
    MODEL_FILE,
    SEQ,
    cpu_norm_extra,
)

from meshconf.features.plan.estimate.gpu_overheads import allocator_reserve

HERE = Path(__file__).parent
TRAINING = [
    "--seq-len", "64", "--micro-batch", "2", "--param-dtype", "fp32", "--grad-dtype", "fp32",
    "--activation-checkpointing", "none",
]  # fmt: skip


def _line_of(module: str, text: str) -> int:
    """The number of the line of tests/``module`` that holds ``text``, which an error must
    name."""
    lines = (HERE / module).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


RAISING_LINE = _line_of("measure_builds.py", "raise ValueError")
#: 512-way FSDP, the world the memory tests measure rank 77 of
W512 = "world_size: 512\ndegrees: {dp_shard: -1}\n"


_SERVER: list[Path] = []


@pytest.fixture(autouse=True)
def _server(torch_server: Path) -> Iterator[None]:
    """The fork server this module's ``meshconf measure`` commands run in."""
    _SERVER.append(torch_server)
    yield
    _SERVER.remove(torch_server)


def _measure(
    tmp_path: Path, config: str, build: str, *options: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mesh.yaml").write_text(config)
    (tmp_path / "small.yaml").write_text(MODEL_FILE)
    command = ["meshconf", "measure", str(tmp_path / "mesh.yaml")]
    command += ["--build", f"measure_builds:{build}", *options]
    return forkserver.run(_SERVER[0], command, cwd=HERE, env=dict(os.environ))


_REPORTS: dict[tuple[str, ...], dict[str, Any]] = {}


def _report(tmp_path: Path, config: str, build: str, *options: str) -> dict[str, Any]:
    """The JSON report of a measurement with the small model's file; the same measurement
    asked for again (by another test) is read once."""
    key = (config, build, *options)
    if key not in _REPORTS:
        done = _measure(
            tmp_path, config, build, "--model-file", str(tmp_path / "small.yaml"), *TRAINING,
            "--format", "json", *options,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        _REPORTS[key] = json.loads(done.stdout)
        # the options give the estimate what the build runs, so the two are compared
        assert _REPORTS[key]["mismatches"] == []
    return _REPORTS[key]


def _close(measured: int, estimated: int, tolerance: float) -> bool:
    return abs(measured - estimated) <= tolerance * estimated


def test_fsdp_at_a_large_world_matches_the_estimate_term_by_term(tmp_path: Path) -> None:
    report = _report(tmp_path, W512, "fsdp", "--rank", "77")
    measured, estimate = report["measured_bytes"], report["estimate_bytes"]
    assert (report["rank"], report["world_size"], report["tracker"]) == (77, 512, "FSDPMemTracker")
    assert measured["params"] == estimate["params"]
    assert measured["optimizer"] == estimate["optimizer"]
    # at the peak (the backward pass) the sharded gradients are only partly there
    assert 0 < measured["grads"] <= estimate["grads"]
    # the block run, the next prefetched, the previous block's gradient in its reduce-scatter
    # buffer, under torchtitan's FSDP groups
    assert measured["gathers"] == estimate["gathers"]
    # The estimate adds one block's gradients in flight to what every block stores; at the
    # peak, at the start of the last block's backward pass, they are not there yet.
    assert 0.85 * estimate["activations"] <= measured["activations"] <= estimate["activations"]
    assert 0.93 * estimate["total"] <= measured["peak"] <= estimate["total"]
    assert measured["other"] == 0


@pytest.mark.parametrize(
    ("build", "mode"), [("fsdp_selective", "selective"), ("fsdp_full", "full")]
)
def test_checkpointed_blocks_at_a_large_world_match_the_estimate(
    tmp_path: Path, build: str, mode: str
) -> None:
    report = _report(
        tmp_path, W512, build, "--rank", "77",
        "--activation-checkpointing", mode,
    )  # fmt: skip
    measured, estimate = report["measured_bytes"], report["estimate_bytes"]
    assert measured["params"] == estimate["params"]
    assert measured["gathers"] == estimate["gathers"]
    # The peak falls in a block's backward pass. There the block's norms, recomputed, keep
    # on CPU the normalized input as well (tests/test_plan_activations.py).
    cpu_norms = cpu_norm_extra(ARCH).bytes(SEQ * BATCH, 1, 4)
    activations, peak = measured["activations"] - cpu_norms, measured["peak"] - cpu_norms
    assert _close(activations, estimate["activations"], 0.15)
    assert _close(peak, estimate["total"], 0.05)


def test_a_large_vocabulary_peaks_when_fsdp_gathers_the_output_again(tmp_path: Path) -> None:
    """torchtitan's FSDP groups keep the final norm and the output gathered through the
    loss's backward pass, and FSDP2 gathers them again for the norm's: with a vocabulary
    large beside the blocks, that is the peak (measure_builds.fsdp_large_vocabulary, in
    torchtitan's bf16 mixed precision)."""
    (tmp_path / "large.yaml").write_text(LARGE_VOCABULARY_FILE)
    report = _report(
        tmp_path, W512, "fsdp_large_vocabulary",
        "--rank", "77", "--model-file", str(tmp_path / "large.yaml"), "--micro-batch", "1",
        "--param-dtype", "bf16",
    )  # fmt: skip
    measured, estimate = report["measured_bytes"], report["estimate_bytes"]
    assert report["estimate"]["memory_peak_phase"] == "output"
    # the output in bf16 and its all-gather buffer, its gradient in fp32 in its
    # reduce-scatter buffer; the estimate pads the final norm's 256 weights to 512 in each
    output = LARGE_VOCABULARY.vocab * LARGE_VOCABULARY.hidden
    assert 0 <= estimate["gathers"] - measured["gathers"] <= 256 * (2 + 2 + 4)
    assert estimate["gathers"] == (output + 512) * (2 + 2 + 4)
    # what the CPU's composite norms keep beyond CUDA's fused ones: an fp32 copy of the
    # input and of its normalization, per norm (8 in the blocks, the final one)
    cpu_norms = 9 * 2 * SEQ * LARGE_VOCABULARY.hidden * 4
    assert _close(measured["peak"] - cpu_norms, estimate["total"], 0.05)


def test_fp8_gathers_shrink_by_what_the_estimate_says(tmp_path: Path) -> None:
    """torchao's float8 training with FSDP's fp8 all-gather (measure_builds.fsdp_fp8), as
    torchtitan's enable_fsdp_float8_all_gather runs it."""
    plain = _report(tmp_path, W512, "fsdp", "--rank", "77")
    fp8 = _report(tmp_path, W512, "fsdp_fp8", "--rank", "77", "--fp8-param-gather")
    saved = plain["measured_bytes"]["gathers"] - fp8["measured_bytes"]["gathers"]
    estimated = plain["estimate_bytes"]["gathers"] - fp8["estimate_bytes"]["gathers"]

    # The block being run and the one prefetched hold their linear weights (wq, wk, wv, wo,
    # w1, w3, w2; each dim 0 padded to a multiple of 512) in 1 byte instead of 4; the norms
    # and the fp32 gradient stay as they were.
    def padded(rows: int) -> int:
        return -(-rows // 512) * 512

    heads, kv = 4 * 64, 2 * 64
    rows = [(heads, 256), (kv, 256), (kv, 256), (256, heads), (704, 256), (704, 256), (256, 704)]
    assert estimated == 2 * (4 - 1) * sum(padded(out) * into for out, into in rows)
    # besides, each gathered fp8 weight carries its fp32 scale (a few bytes)
    assert 0 <= estimated - saved <= 2 * len(rows) * 8
    measured, estimate = fp8["measured_bytes"], fp8["estimate_bytes"]
    assert measured["params"] == estimate["params"]
    assert measured["gathers"] == estimate["gathers"] + (estimated - saved)
    # as without fp8, one block's gradients in flight are not there yet at the peak
    assert 0.92 * estimate["total"] <= measured["peak"] <= estimate["total"]


def test_tensor_parallel_model_state_matches_the_estimate(tmp_path: Path) -> None:
    report = _report(tmp_path, "world_size: 2\ndegrees: {tp: 2}\n", "tensor_parallel")
    measured, estimate = report["measured_bytes"], report["estimate_bytes"]
    assert report["tracker"] == "MemTracker"
    assert measured["params"] == estimate["params"]
    # at the peak (the backward pass) the gradients are only partly there
    assert 0 < measured["grads"] <= estimate["grads"]
    assert measured["gathers"] == estimate["gathers"] == 0


def test_the_text_report_sets_each_term_beside_its_estimate(tmp_path: Path) -> None:
    done = _measure(
        tmp_path, "world_size: 8\ndegrees: {dp_shard: 8}\n", "fsdp",
        "--model-file", str(tmp_path / "small.yaml"), *TRAINING,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(
        "rank 0 of 8: measure_builds:fsdp, the second of two training steps under fake"
    )
    assert lines[0].endswith("'s FSDPMemTracker")
    assert lines[2].split() == ["term", "MiB", "at", "the", "peak", "estimate"]
    assert [line.split()[0] for line in lines[3:-1]] == [
        "params", "grads", "optimizer", "gathers", "activations", "peak",
    ]  # fmt: skip
    assert lines[3].split()[1:] == ["1.532", "1.532"]
    assert lines[-1] == (
        "not on CPU: the estimate's runtime term (945.399 MiB: the CUDA context, NCCL's "
        "buffers, the allocator's reserve) comes on top on a GPU"
    )


@pytest.mark.parametrize(
    ("build", "code", "message"),
    [
        (
            "raises",
            1,
            "the build function raised ValueError: no checkpoint at /data/ckpt "
            f"(measure_builds.py:{RAISING_LINE})",
        ),
        (
            "returns_a_model",
            1,
            "the build function returned LlamaLike, not a "
            "meshconf.runtime.TrainingStep(model, optimizer, forward_backward)",
        ),
        ("no_such_function", 2, "--build: module 'measure_builds' has no function "
         "'no_such_function'"),
        ("exits", 1, "the build function exited (SystemExit 3)"),
        ("step_exits", 1, "forward_backward exited (SystemExit 0)"),
        ("step_raises_unprintable", 1, "forward_backward raised _Unprintable: _Unprintable "
         "(measure_builds.py:{line})"),
        ("returns_wrong_fields", 1, "the build function's TrainingStep: model is a str, not a "
         "torch.nn.modules.module.Module; optimizer is a NoneType, not a torch.optim.optimizer."
         "Optimizer; forward_backward is a int, not callable"),
    ],
)  # fmt: skip
def test_a_failing_build_is_one_located_line(
    tmp_path: Path, build: str, code: int, message: str
) -> None:
    done = _measure(tmp_path, "world_size: 8\ndegrees: {dp_shard: 8}\n", build)
    assert (done.returncode, done.stdout) == (code, "")
    line = _line_of("measure_builds.py", "raise _Unprintable")
    assert done.stderr == f"meshconf: error: {message.format(line=line)}\n"


def test_a_step_that_raises_names_the_line_of_the_users_code(tmp_path: Path) -> None:
    done = _measure(tmp_path, "world_size: 8\ndegrees: {dp_shard: 8}\n", "step_raises")
    assert done.returncode == 1
    assert done.stderr.startswith("meshconf: error: forward_backward raised RuntimeError: ")
    # the embedding of the model's forward pass gets the float tokens
    assert done.stderr.endswith(
        f"(llama_like.py:{_line_of('llama_like.py', 'self.embedding(tokens)')})\n"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("measure_builds", "--build: expected MODULE:FUNCTION (mypackage.train:build), got "
         "'measure_builds'"),
        ("no_such_module:build", "--build: module 'no_such_module' could not be imported: "
         "ModuleNotFoundError: No module named 'no_such_module'\n"),
    ],
)  # fmt: skip
def test_a_build_that_cannot_be_loaded_is_a_usage_error(
    tmp_path: Path, spec: str, message: str
) -> None:
    (tmp_path / "mesh.yaml").write_text("world_size: 8\ndegrees: {dp_shard: 8}\n")
    command = ["meshconf", "measure", str(tmp_path / "mesh.yaml"), "--build", spec]
    done = forkserver.run(_SERVER[0], command, cwd=HERE, env=dict(os.environ))
    assert done.returncode == 2
    assert done.stderr.startswith(f"meshconf: error: {message}")
    assert done.stderr.count("\n") == 1


def test_a_module_that_exits_while_imported_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "leaving.py").write_text("import sys\nsys.exit('not today')\n")
    (tmp_path / "mesh.yaml").write_text("world_size: 8\ndegrees: {dp_shard: 8}\n")
    command = ["meshconf", "measure", "mesh.yaml", "--build", "leaving:build"]
    done = forkserver.run(_SERVER[0], command, cwd=tmp_path, env=dict(os.environ))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "meshconf: error: --build: module 'leaving' exited while it was imported (SystemExit "
        "'not today')\n"
    )


def test_an_estimate_of_another_run_is_named_and_not_set_beside_the_measurement(
    tmp_path: Path,
) -> None:
    """The user's build runs the small model on sequences of 64 in fp32; an estimate of
    another model, or of the default settings, is not compared with it."""
    config = "world_size: 8\ndegrees: {dp_shard: 8}\n"
    other = _measure(tmp_path, config, "fsdp", "--model", "llama3-8b")
    assert other.returncode == 0, other.stderr
    lines = other.stdout.splitlines()
    assert lines[2].startswith("not comparable: the build stores ")
    assert lines[2].endswith(
        " parameter elements on this rank, the estimate 1,003,782,656: estimate the model the "
        "build makes (--model or --model-file)"
    )
    assert lines[3:6] == [
        "not comparable: the build's micro-batches hold 2 sequences, the estimate's 1 "
        "(--micro-batch 2)",
        "not comparable: the build's sequences hold 64 tokens, the estimate's 8,192 (--seq-len 64)",
        "not comparable: the build computes in fp32, the estimate in bf16 (--param-dtype fp32)",
    ]
    assert lines[6] == "term         MiB at the peak"  # no estimate column
    assert lines[-1].startswith("the estimate (") and lines[-1].endswith(
        "MiB) is left out: it is for another run than the build's; give the options above to "
        "compare them"
    )
    defaults = _measure(
        tmp_path, config, "fsdp", "--model-file", str(tmp_path / "small.yaml"), "--format", "json"
    )
    report = json.loads(defaults.stdout)
    assert [item["setting"] for item in report["mismatches"]] == [
        "micro_batch",
        "seq_len",
        "param_dtype",
    ]
    assert report["mismatches"][1] == {
        "setting": "seq_len",
        "build": 64,
        "estimate": 8192,
        "message": "the build's sequences hold 64 tokens, the estimate's 8,192 (--seq-len 64)",
    }


def test_a_small_model_s_figures_are_exact(tmp_path: Path) -> None:
    config = "world_size: 8\ndegrees: {dp_shard: 8}\n"
    done = _measure(
        tmp_path, config, "fsdp", "--model-file", str(tmp_path / "small.yaml"), *TRAINING
    )
    assert "model small (3,213,568 parameters); seq 64" in done.stdout.splitlines()[1]
    report = _report(tmp_path, config, "fsdp")
    memory = report["estimate"]["memory_bytes"]
    # beside the tracker, the step's tensors: the estimate's total without its runtime term
    state = {term: size for term, size in memory.items() if not term.startswith("total")}
    del state["runtime"]
    assert {**state, "total": memory["total_without_runtime"]} == report["estimate_bytes"]
    # the CUDA context, NCCL's buffers of fsdp's communicator of 8, and the allocator's
    # reserve above the step's tensors at the published ratio
    reserve = allocator_reserve(memory["total_without_runtime"])
    assert memory["runtime"] == 300 * 10**6 + 688 * 10**6 + reserve
    assert memory["params"] > 0 and report["estimate"]["memory_gib"]["params"] == 0.0
