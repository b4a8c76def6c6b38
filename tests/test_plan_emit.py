"""``plan --emit`` writes what the row was planned with (the model, the GPU, the sequence, the
batch and the training settings) into the config's ``training`` block, and ``show``,
``measure`` and ``plan`` of that config estimate the row again, exactly; an option given
beside such a config replaces its key with a note."""

from __future__ import annotations

import argparse
import contextlib
import io
import typing
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from hypothesis import given, settings, strategies as st

import meshconf.cli.model_options as model_options
import meshconf.cli.plan as plan_cli
import meshconf.cli.plan_report as plan_report
from meshconf.cli import build_parser
from meshconf.cli.model_options import model_request, planned_block
from meshconf.core.setting_values import GpuPreset, ModelPreset
from meshconf.core.settings import TRAINING_BOUNDS
from meshconf.features.plan.estimate.gpus import GPUS
from meshconf.features.plan.estimate.presets import PRESETS
from meshconf.model.training import TrainingOptions

RunCli = Callable[..., CompletedProcess[str]]
#: A GPU for each preset, so that every preset is planned on another GPU than the default.
GPU_OF = {
    "llama3-8b": "a100-80g",
    "llama3-70b": "h200",
    "llama3-405b": "mi325x",
    "deepseek-v3": "gb200",
    "mixtral-8x7b": "b200",
    "qwen3-30b-a3b": "h800",
}
SETTINGS = ["--seq-len", "4096", "--micro-batch", "2", "--global-batch-tokens", "2359296"]
SETTINGS += ["--mfu", "0.45", "--optimizer-dtype", "bf16"]
TINY = "name: tiny\nlayers: 4\nhidden: 256\nffn: 1024\nvocab: 1000\nattention: {heads: 8, kv_heads: 8}\n"


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``plan --emit`` printed a row of (its model, settings and estimate) and what
    ``show`` estimated, as the commands computed them, under ``plan`` and ``show``."""
    found: dict[str, Any] = {}
    emitted_yaml = plan_report.emitted_yaml
    config_estimate = model_options.config_estimate

    def emitting(plan: Any, index: int, *rest: Any) -> str:
        found["plan"] = (plan.request.model, plan.request.training, plan.best[index - 1].estimate)
        return emitted_yaml(plan, index, *rest)

    def estimating(args: argparse.Namespace, config: Any) -> Any:
        found["show"] = config_estimate(args, config)
        return found["show"]

    monkeypatch.setattr(plan_cli, "emitted_yaml", emitting)
    monkeypatch.setattr(model_options, "config_estimate", estimating)
    return found


def _estimate_lines(stdout: str) -> list[str]:
    """The lines of ``show``'s estimate: after the last blank line."""
    lines = stdout.splitlines()
    return lines[len(lines) - lines[::-1].index("") :]


def test_the_presets_are_those_a_config_may_name() -> None:
    assert typing.get_args(ModelPreset) == tuple(PRESETS)
    assert typing.get_args(GpuPreset) == tuple(GPUS)


@pytest.mark.parametrize("model", list(PRESETS))
def test_show_of_an_emitted_row_prints_the_row_s_estimate_exactly(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path, model: str
) -> None:
    gpu = GPU_OF[model]
    args = ["plan", "--world-size", "72", "--model", model, "--gpu", gpu, *SETTINGS]
    for index in ("1", "3"):
        emitted = run_cli(*args, "--emit", index)
        assert emitted.returncode == 0, emitted.stderr
        planned_model, planned_training, planned = seen["plan"]
        training = yaml.safe_load(emitted.stdout)["training"]
        assert training == {
            "model": model,
            "gpu": gpu,
            "seq_len": 4096,
            "micro_batch": 2,
            "global_batch_tokens": 2359296,
            "optimizer_dtype": "bf16",
            "mfu": 0.45,
        }
        path = tmp_path / "best.yaml"
        path.write_text(emitted.stdout)
        explained = run_cli(*args, "--explain", index)
        for again in ([], ["--model", model]):
            shown = run_cli("show", str(path), *again)
            assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
            assert seen["show"] == (planned_model, planned_training, planned)
            assert set(_estimate_lines(shown.stdout)) <= set(explained.stdout.splitlines())
        # the comment gives the row's figures as the table does
        assert (
            f"GiB per GPU ({'fits' if planned.fits else 'does NOT fit'}), step "
            in (emitted.stdout.splitlines()[2])
        )


@pytest.mark.slow
def test_the_gb200_row_of_deepseek_v3_is_shown_again_with_its_gpu_and_batch(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    """The command of a new user on 1,152 GB200 GPUs: the emitted config names gb200, seq
    4096 and the batch, and ``show`` of it, with or without ``--model``, estimates the row."""
    args = ["plan", "--world-size", "1152", "--gpu", "gb200", "--model", "deepseek-v3"]
    args += ["--seq-len", "4096", "--global-batch-tokens", "62914560", "--pp-schedule"]
    args += ["dualpipe", "--ep-overlap", "--dispatch-dtype", "fp8", "--optimizer-dtype", "bf16"]
    args += ["--zero-stage", "1", "--activation-dtype", "fp8", "--moe-max-nodes", "4"]
    emitted = run_cli(*args, "--emit", "1")
    assert emitted.returncode == 0, emitted.stderr
    assert yaml.safe_load(emitted.stdout)["training"] == {
        "model": "deepseek-v3",
        "gpu": "gb200",
        "seq_len": 4096,
        "micro_batch": 1,
        "global_batch_tokens": 62914560,
        "zero_stage": 1,
        "pp_schedule": "dualpipe",
        "moe_max_nodes": 4,
        "ep_overlap": True,
        "dispatch_dtype": "fp8",
        "activation_dtype": "fp8",
        "optimizer_dtype": "bf16",
    }
    path = tmp_path / "best.yaml"
    path.write_text(emitted.stdout)
    for again in ([], ["--model", "deepseek-v3"]):
        shown = run_cli("show", str(path), *again)
        assert (shown.returncode, shown.stderr) == (0, "")
        assert seen["show"] == seen["plan"]
        settings_line = _estimate_lines(shown.stdout)[0]
        assert "seq 4096, micro-batch 1, 62914560 tokens per step" in settings_line
        assert settings_line.endswith("gb200, 186 GiB per GPU; ZeRO stage 1; fp8 activations; "
                                      "bf16 optimizer moments")  # fmt: skip


def test_plan_of_an_emitted_config_plans_with_its_settings(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    args = ["--world-size", "64", "--gpus-per-node", "8", "--model", "mixtral-8x7b", *SETTINGS]
    emitted = run_cli("plan", *args, "--ep", "8", "--emit", "2")
    assert emitted.returncode == 0, emitted.stderr
    planned = seen["plan"]
    (tmp_path / "best.yaml").write_text(emitted.stdout)
    again = run_cli("plan", "best.yaml", "--emit", "1", cwd=tmp_path)
    assert (again.returncode, again.stderr) == (0, "")
    assert seen["plan"] == planned
    assert yaml.safe_load(again.stdout) == yaml.safe_load(emitted.stdout)


def test_an_option_beside_the_config_replaces_its_key_with_a_note(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "best.yaml").write_text(
        "world_size: 8\ngpus_per_node: 8\ntraining:\n  model: llama3-8b\n  gpu: gb200\n"
        "  seq_len: 4096\n  mfu: 0.5\n  ep_overlap: false\n  pp_schedule: gpipe\n"
    )
    shown = run_cli("show", "best.yaml", "--seq-len", "8192", "--gpu", "h200", "--mfu", "0.5",
                    "--pp-schedule", "1f1b", "--ep-overlap", cwd=tmp_path)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.splitlines() == [
        "meshconf: note: --gpu h200 replaces training.gpu gb200 of best.yaml",
        "meshconf: note: --seq-len 8192 replaces training.seq_len 4096 of best.yaml",
        "meshconf: note: --pp-schedule 1f1b replaces training.pp_schedule gpipe of best.yaml",
        "meshconf: note: --ep-overlap replaces training.ep_overlap false of best.yaml",
    ]
    _, training, _ = seen["show"]
    assert (training.gpu, training.seq_len, training.mfu) == ("h200", 8192, 0.5)
    assert (training.schedule, training.ep_overlap) == ("1f1b", True)
    assert training.gpu_memory_gib == GPUS["h200"].memory_gib
    other = run_cli("show", "best.yaml", "--model", "llama3-70b", cwd=tmp_path)
    assert other.stderr == (
        "meshconf: note: --model llama3-70b replaces training.model llama3-8b of best.yaml\n"
    )
    assert seen["show"][0] is PRESETS["llama3-70b"]


def test_the_config_s_figures_replace_its_gpu_s_and_an_option_replaces_both(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "best.yaml").write_text(
        "world_size: 8\ntraining: {model: llama3-8b, gpu: gb200, gpu_memory_gib: 150}\n"
    )
    assert run_cli("show", "best.yaml", cwd=tmp_path).returncode == 0
    training = seen["show"][1]
    assert (training.gpu_memory_gib, training.peak_tflops) == (150, GPUS["gb200"].peak_tflops)
    shown = run_cli("show", "best.yaml", "--gpu-memory-gib", "120", cwd=tmp_path)
    assert shown.stderr == (
        "meshconf: note: --gpu-memory-gib 120 replaces training.gpu_memory_gib 150 of best.yaml\n"
    )
    assert seen["show"][1].gpu_memory_gib == 120


def test_an_emitted_model_file_is_found_wherever_the_config_is_saved(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.yaml").write_text(TINY)
    args = ["plan", "--world-size", "16", "--gpus-per-node", "8", "--seq-len", "1024"]
    emitted = run_cli(*args, "--model-file", "models/tiny.yaml", "--emit", "1", cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stderr
    training = yaml.safe_load(emitted.stdout)["training"]
    # the planner does not know where the config will be saved: the file's absolute path
    assert training["model_file"] == str(tmp_path / "models" / "tiny.yaml")
    saved = tmp_path / "elsewhere" / "best.yaml"
    saved.parent.mkdir()
    saved.write_text(emitted.stdout)
    shown = run_cli("show", str(saved))
    assert (shown.returncode, shown.stderr) == (0, "")
    assert seen["show"] == seen["plan"]


def test_a_relative_model_file_of_a_config_is_read_from_the_config_s_folder(
    run_cli: RunCli, seen: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tiny.yaml").write_text(TINY)
    (tmp_path / "run" / "mesh.yaml").write_text(
        "world_size: 8\ntraining: {model_file: tiny.yaml}\n"
    )
    shown = run_cli("show", "run/mesh.yaml", cwd=tmp_path)
    assert (shown.returncode, shown.stderr) == (0, "")
    assert seen["show"][0].name == "tiny"
    emitted = run_cli("plan", "run/mesh.yaml", "--emit", "1", cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stderr
    assert yaml.safe_load(emitted.stdout)["training"]["model_file"] == str(
        tmp_path / "run" / "tiny.yaml"
    )
    # the same file given on the command line, from here: no note
    again = run_cli("show", "run/mesh.yaml", "--model-file", "run/tiny.yaml", cwd=tmp_path)
    assert (again.returncode, again.stderr) == (0, "")
    (tmp_path / "run" / "tiny.yaml").unlink()
    missing = run_cli("show", "run/mesh.yaml", cwd=tmp_path)
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == (
        "meshconf: error: training.model_file of run/mesh.yaml: run/tiny.yaml: cannot read: No "
        "such file or directory (a relative path is read from the config's folder)\n"
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("model: llama3-8B", "training.model: expected 'llama3-8b', 'llama3-70b', 'llama3-405b', "
         "'deepseek-v3', 'mixtral-8x7b' or 'qwen3-30b-a3b', got the string 'llama3-8B' (did you "
         "mean 'llama3-8b'?)"),
        ("mfu: 2", "training.mfu: 2 is more than 1: more than the peak"),
        ("gpu_memory_gib: .nan", "training.gpu_memory_gib: expected a number from 0.125 to 16384, "
         "got nan"),
        ("seq_len: 0", "training.seq_len: expected an integer >= 1, got 0"),
        ("{model: llama3-8b, model_file: m.yaml}", "training.model_file: model and model_file "
         "exclude each other: both name the model estimated"),
    ],
)  # fmt: skip
def test_a_bad_planning_key_is_one_located_line(
    run_cli: RunCli, tmp_path: Path, block: str, message: str
) -> None:
    (tmp_path / "bad.yaml").write_text(f"world_size: 8\ntraining:\n  {block}\n")
    result = run_cli("validate", "bad.yaml", cwd=tmp_path)
    column = 3 + (block.index("model_file") if block.startswith("{") else 0)
    assert (result.returncode, result.stdout) == (1, f"bad.yaml:3:{column}: {message}\n")


def test_a_config_s_gpu_places_the_plan_on_its_levels(run_cli: RunCli, tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text("world_size: 144\ntraining: {gpu: gb200}\n")
    planned = run_cli("plan", "mesh.yaml", "--emit", "1", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert planned.stderr == (
        "meshconf: note: training.gpu gb200 of mesh.yaml: levels node=4 and nvlink=72@900, as "
        "its datasheet gives them\n"
    )
    config = yaml.safe_load(planned.stdout)
    assert (config["gpus_per_node"], config["levels"]) == (
        4,
        [{"name": "nvlink", "size": 72, "bandwidth_gb_s": 900}],
    )


def test_without_a_model_the_config_s_block_is_emitted_as_it_is(
    run_cli: RunCli, tmp_path: Path
) -> None:
    (tmp_path / "mesh.yaml").write_text("world_size: 8\ntraining: {zero_stage: 1, gpu: h200}\n")
    emitted = run_cli("plan", "mesh.yaml", "--emit", "1", cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stderr
    assert yaml.safe_load(emitted.stdout)["training"] == {"gpu": "h200", "zero_stage": 1}


# --- every setting goes through the emitted block unchanged --------------------------------


def _number(name: str) -> st.SearchStrategy[str]:
    bound = TRAINING_BOUNDS[name]
    return st.floats(bound.minimum, bound.maximum).map(repr)


def _integer(name: str, top: int | None = None) -> st.SearchStrategy[str]:
    bound = TRAINING_BOUNDS[name]
    return st.integers(int(bound.minimum), top or int(bound.maximum)).map(str)


#: Options that take a value, each with its values (a setting of the estimate each).
VALUED: dict[str, st.SearchStrategy[str]] = {
    "--seq-len": _integer("seq_len"),
    "--micro-batch": _integer("micro_batch"),
    "--global-batch-tokens": _integer("global_batch_tokens"),
    "--param-dtype": st.sampled_from(["fp32", "bf16", "fp16"]),
    "--grad-dtype": st.sampled_from(["fp32", "bf16", "fp16"]),
    "--activation-checkpointing": st.sampled_from(["none", "selective", "full"]),
    "--reshard-after-forward": st.sampled_from(["default", "always", "never"]),
    "--zero-stage": st.sampled_from(["1", "2", "3"]),
    "--moe-max-nodes": _integer("moe_max_nodes"),
    "--dispatch-dtype": st.sampled_from(["fp8", "bf16"]),
    "--activation-dtype": st.sampled_from(["fp8", "fp32"]),
    "--optimizer-dtype": st.sampled_from(["fp32", "bf16"]),
    "--sequence-parallel": st.sampled_from(["dtensor", "megatron", "none"]),
    "--norm-kernel": st.sampled_from(["fused", "eager"]),
    "--gpu": st.sampled_from(list(GPUS)),
    "--gpu-memory-gib": _number("gpu_memory_gib"),
    "--intra-node-gb-s": _number("intra_node_gb_s"),
    "--inter-node-gb-s": _number("inter_node_gb_s"),
    "--peak-tflops": _number("peak_tflops"),
    "--mfu": _number("mfu"),
    "--mfu-counts": st.sampled_from(["model", "hardware"]),
    "--mfu-over": st.sampled_from(["compute", "step"]),
    "--cuda-context-gib": _number("cuda_context_gib"),
    "--nccl-communicator-gib": _number("nccl_communicator_gib"),
    "--allocator-gib": _number("allocator_gib"),
}
FLAGS = ("--ep-overlap", "--fp8-param-gather")
#: The pipeline's settings, each list valid alone.
PIPELINES = st.sampled_from(
    [
        [],
        ["--pp-schedule", "dualpipe"],
        ["--pp-schedule", "interleaved", "--virtual-stages", "4", "--microbatch-group", "8"],
        ["--pp-schedule", "1f1b", "--first-stage-layers", "0", "--last-stage-layers", "2"],
        ["--pp-schedule", "zbv", "--embedding-as-layers", "1", "--output-as-layers", "1"],
        ["--layers-per-stage", "4"],
    ]
)


@st.composite
def _words(draw: st.DrawFn, pipeline: list[str]) -> list[str]:
    """Command-line words of some model and training options, valid together, and
    ``pipeline``."""
    words: list[str] = []
    for option in draw(st.lists(st.sampled_from(list(VALUED)), unique=True, max_size=8)):
        words += [option, draw(VALUED[option])]
    return words + draw(st.lists(st.sampled_from(FLAGS), unique=True)) + pipeline


@st.composite
def _two_sources(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """The words of a config's block and of the options beside it; the pipeline's settings
    in one of them, since another schedule's would not go with them."""
    pipeline = draw(PIPELINES)
    in_config = draw(st.booleans())
    config, options = (
        draw(_words(pipeline if in_config else [])),
        draw(_words([] if in_config else pipeline)),
    )
    if draw(st.booleans()):  # the runtime term whole, which excludes its parts
        config, options = _without(config, RUNTIME_PARTS), _without(options, RUNTIME_PARTS)
        (config if draw(st.booleans()) else options).extend(
            ["--runtime-gib", draw(_number("runtime_gib"))]
        )
    return config, options


#: The options of the runtime term's parts, which --runtime-gib excludes.
RUNTIME_PARTS = ("--cuda-context-gib", "--nccl-communicator-gib", "--allocator-gib")


def _without(words: list[str], options: tuple[str, ...]) -> list[str]:
    """``words`` without each of ``options`` and its value."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in options:
            skip = True
        else:
            kept.append(word)
    return kept


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(list(PRESETS)), sources=_two_sources())
def test_show_reads_from_the_emitted_block_the_settings_plan_used(
    model: str, sources: tuple[list[str], list[str]]
) -> None:
    """Whatever a config's block and the options beside it give, the block ``plan --emit``
    writes gives ``show`` the model and every setting the plan used, and no note."""
    from_config, from_options = sources
    plan = build_parser(("plan",))
    show = build_parser(("show",))
    config_args = plan.parse_args(["plan", "--world-size", "8", "--model", model, *from_config])
    configured = model_request(config_args)
    assert not isinstance(configured, int)
    block = TrainingOptions.model_validate(planned_block(config_args, None, configured[1]))
    args = plan.parse_args(["plan", "mesh.yaml", *from_options])
    with contextlib.redirect_stderr(io.StringIO()):  # notes of the options replacing keys
        planned = model_request(args, block.estimate_settings(), "mesh.yaml")
    assert not isinstance(planned, int)
    emitted = TrainingOptions.model_validate(
        planned_block(args, block, planned[1])
    ).estimate_settings()
    notes = io.StringIO()
    with contextlib.redirect_stderr(notes):
        assert (
            model_request(show.parse_args(["show", "best.yaml"]), emitted, "best.yaml") == planned
        )
        again = show.parse_args(["show", "best.yaml", "--model", model])
        assert model_request(again, emitted, "best.yaml") == planned
    assert notes.getvalue() == ""
