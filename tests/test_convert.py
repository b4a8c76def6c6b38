"""``meshconf convert``: torchtitan's [parallelism] and KempnerForge's [distributed] tables as
meshconf configs, with every semantic difference explained, and every error located."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import REPO

import meshconf
from meshconf.features.convert import BY_NAME, KEMPNERFORGE, TORCHTITAN, Conversion
from meshconf.features.convert.draft import ConversionError

KEMPNERFORGE_EXAMPLE = "examples/migration/kempnerforge_moe_32gpu.toml"
TORCHTITAN_EXAMPLE = "examples/migration/torchtitan_llama3_70b.toml"


def convert(source: str, table: object, **sizes: int | None) -> Conversion:
    """The conversion ``meshconf convert --from SOURCE`` makes of a table as read."""
    return BY_NAME[source].convert(table, **sizes)


KEMPNERFORGE_OUTPUT = """\
# yaml-language-server: $schema=schemas/meshconf.schema.json
# Converted by meshconf convert from the [distributed] table of
# examples/migration/kempnerforge_moe_32gpu.toml (KempnerForge). What differs from
# KempnerForge:
#
# - world_size is not in the TOML: KempnerForge takes it from the launcher. 32 comes from
#   --world-size; at start-up meshconf checks that the launcher's world size agrees.
#
# - KempnerForge counts ep as a world factor: dp_replicate * dp_shard * tp * pp * cp * ep is
#   its world size. meshconf's experts borrow their ranks from dp_shard * cp * tp instead,
#   so dp_shard is KempnerForge's dp_shard times ep: 4 * 2 = 8.
#
# - The sparse domain [pp, dp_replicate, efsdp, ep, etp] has the rank groups of
#   KempnerForge's mesh [pp, dp_replicate, dp_shard, ep, tp]: efsdp is KempnerForge's
#   dp_shard, and etp, set to tp (4), is its tp. With etp 1, each ep group would sit inside
#   one tp group instead.
#
# - The data split changes. KempnerForge's data-parallel ranks are dp_replicate * dp_shard:
#   the 2 ranks of an ep group read the same samples. In meshconf those ranks are
#   data-parallel ranks too: batch (dp_replicate * dp_shard) is 2 times KempnerForge's
#   data-parallel size, and the dense layers shard over fsdp, 2 times KempnerForge's
#   dp_shard. Divide the per-rank batch by 2 to keep the global batch, or take the sampler's
#   rank and size from the sparse domain's dp_replicate and efsdp to keep KempnerForge's
#   split.
#
# - nccl_timeout_sec = 1800 is runtime.timeout_s. KempnerForge gives it to
#   init_process_group, for the default group; meshconf gives it to the default group and to
#   every group it creates.

world_size: 32
gpus_per_node: 8

degrees:
  pp: 1
  dp_replicate: 1
  dp_shard: 8        # KempnerForge's dp_shard 4 * ep 2
  cp: 1
  tp: 4
  ep: 2
  etp: 4             # = tp, for KempnerForge's expert groups

runtime:
  timeout_s: 1800    # KempnerForge's nccl_timeout_sec
"""

TORCHTITAN_OUTPUT = """\
# yaml-language-server: $schema=schemas/meshconf.schema.json
# Converted by meshconf convert from the [parallelism] and [activation_checkpoint] tables of
# examples/migration/torchtitan_llama3_70b.toml (torchtitan). What differs from torchtitan:
#
# - world_size is not in the TOML: torchtitan takes it from the launcher. 64 comes from
#   --world-size; at start-up meshconf checks that the launcher's world size agrees.
#
# - Not converted, as they are not mesh settings (keep them in the torchtitan job config):
#   enable_async_tensor_parallel, pipeline_parallel_microbatch_size.

world_size: 64
gpus_per_node: 8

degrees:
  pp: 2
  dp_replicate: 1
  dp_shard: -1
  cp: 1
  tp: 8
  ep: 1
  etp: 1

training:
  activation_checkpointing: full
  reshard_after_forward: default
  pp_schedule: interleaved
  virtual_stages: 2  # torchtitan's default for Interleaved1F1B
  embedding_as_layers: 1  # torchtitan's default pipeline_parallel_first_stage_less_layers
  output_as_layers: 1  # torchtitan's default pipeline_parallel_last_stage_less_layers
"""

WORLD_FROM_OPTION = (
    "world_size is not in the TOML: {tool} takes it from the launcher. {world} comes from "
    "--world-size; at start-up meshconf checks that the launcher's world size agrees."
)
WORLD_FROM_DEGREES = (
    "world_size is not in the TOML: {tool} takes it from the launcher. With no degree at -1, "
    "meshconf takes the product of the degrees, {world}, and checks at start-up that the "
    "launcher's world size agrees."
)
WORLD_AT_LAUNCH = (
    "world_size is not in the TOML: {tool} takes it from the launcher. So does this config: "
    "meshconf fills the -1 degree from the launcher's world size at start-up. `meshconf "
    "validate FILE --world-size N` runs the checks that wait for it."
)
EP_WORLD_FACTOR = (
    "KempnerForge counts ep as a world factor: dp_replicate * dp_shard * tp * pp * cp * ep is "
    "its world size. meshconf's experts borrow their ranks from dp_shard * cp * tp instead, so "
)
GROUPS = (
    "The sparse domain [pp, dp_replicate, efsdp, ep, etp] has the rank groups of KempnerForge's "
    "mesh [pp, dp_replicate, dp_shard, ep, tp]: efsdp is KempnerForge's dp_shard"
)


def data_split(ep: int) -> str:
    return (
        f"The data split changes. KempnerForge's data-parallel ranks are dp_replicate * "
        f"dp_shard: the {ep} ranks of an ep group read the same samples. In meshconf those ranks "
        f"are data-parallel ranks too: batch (dp_replicate * dp_shard) is {ep} times "
        f"KempnerForge's data-parallel size, and the dense layers shard over fsdp, {ep} times "
        f"KempnerForge's dp_shard. Divide the per-rank batch by {ep} to keep the global batch, "
        "or take the sampler's rank and size from the sparse domain's dp_replicate and efsdp to "
        "keep KempnerForge's split."
    )


def write(tmp_path: Path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# The examples, end to end.


def test_kempnerforge_example_exact_output(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("convert", KEMPNERFORGE_EXAMPLE, "--world-size", "32", "--gpus-per-node", "8")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == KEMPNERFORGE_OUTPUT


def test_torchtitan_example_exact_output(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("convert", TORCHTITAN_EXAMPLE, "--world-size", "64", "--gpus-per-node", "8")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == TORCHTITAN_OUTPUT


@pytest.mark.parametrize(
    ("path", "source", "world_size", "output"),
    [
        (KEMPNERFORGE_EXAMPLE, "kempnerforge", "32", KEMPNERFORGE_OUTPUT),
        (TORCHTITAN_EXAMPLE, "torchtitan", "64", TORCHTITAN_OUTPUT),
    ],
)
def test_from_names_the_source_the_table_implies(  # type: ignore[no-untyped-def]
    run_cli, path: str, source: str, world_size: str, output: str
) -> None:
    args = ("convert", path, "--from", source, "--world-size", world_size, "--gpus-per-node", "8")
    assert run_cli(*args).stdout == output


def test_converted_kempnerforge_example_has_the_hand_ported_layouts(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path
) -> None:
    out = tmp_path / "kf.yaml"
    args = ("--world-size", "32", "--gpus-per-node", "8", "--out", str(out))
    result = run_cli("convert", KEMPNERFORGE_EXAMPLE, *args)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{out}: written\n", "")
    converted = meshconf.load_config(out)
    ported = meshconf.load_config(REPO / "examples/migration/from_kempnerforge.yaml")
    assert converted.layouts == ported.layouts
    assert converted.runtime == ported.runtime


@pytest.mark.parametrize(
    ("path", "args", "world_size"),
    [
        (KEMPNERFORGE_EXAMPLE, (), 32),
        (KEMPNERFORGE_EXAMPLE, ("--world-size", "32", "--gpus-per-node", "8"), 32),
        (TORCHTITAN_EXAMPLE, (), 64),
        (TORCHTITAN_EXAMPLE, ("--world-size", "64"), 64),
    ],
)
def test_the_converted_yaml_validates(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, path: str, args: tuple[str, ...], world_size: int
) -> None:
    out = tmp_path / "out.yaml"
    assert run_cli("convert", path, *args, "--out", str(out)).returncode == 0
    config = meshconf.load_config(out, world_size=world_size)
    assert config.resolved_world_size == world_size
    result = run_cli("validate", str(out), "--world-size", str(world_size))
    assert result.stdout == f"{out}: ok (world_size {world_size}, checked with --world-size)\n"


def test_the_schema_modeline_is_relative_to_the_output(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = str(REPO / TORCHTITAN_EXAMPLE)
    result = run_cli("convert", source, "--out", "configs/parallel/job.yaml", cwd=tmp_path)
    assert result.stdout == "configs/parallel/job.yaml: written\n"
    written = (tmp_path / "configs/parallel/job.yaml").read_text()
    assert written.splitlines()[0] == (
        "# yaml-language-server: $schema=../../schemas/meshconf.schema.json"
    )
    printed = run_cli("convert", source, cwd=tmp_path).stdout
    assert printed.splitlines()[0] == "# yaml-language-server: $schema=schemas/meshconf.schema.json"
    assert printed.splitlines()[1:] == written.splitlines()[1:]


# The notes: one per semantic difference, each where it applies.


def test_world_size_notes() -> None:
    assert convert(TORCHTITAN, {}, world_size=16).notes == (
        WORLD_FROM_OPTION.format(tool="torchtitan", world=16),
    )
    assert convert(TORCHTITAN, {"data_parallel_shard_degree": 2}).notes == (
        WORLD_FROM_DEGREES.format(tool="torchtitan", world=2),
    )
    assert convert(TORCHTITAN, {}).notes == (WORLD_AT_LAUNCH.format(tool="torchtitan"),)
    assert convert(KEMPNERFORGE, {"tp": 2}).notes == (WORLD_AT_LAUNCH.format(tool="KempnerForge"),)
    assert convert(KEMPNERFORGE, {"dp_shard": 3}).notes == (
        WORLD_FROM_DEGREES.format(tool="KempnerForge", world=3),
    )
    assert convert(KEMPNERFORGE, {}, world_size=5).notes == (
        WORLD_FROM_OPTION.format(tool="KempnerForge", world=5),
    )
    assert "world_size" not in convert(TORCHTITAN, {}).data
    assert convert(TORCHTITAN, {}, world_size=16, gpus_per_node=8).data["gpus_per_node"] == 8


@pytest.mark.parametrize("etp", [2, 4])
def test_torchtitan_etp_without_experts_is_written_as_1(etp: int) -> None:
    table = {"tensor_parallel_degree": 4, "expert_tensor_parallel_degree": etp}
    conversion = convert(TORCHTITAN, table, world_size=8)
    assert conversion.data["degrees"]["etp"] == 1
    assert conversion.comments == {"degrees.etp": f"was {etp}: torchtitan ignores it while ep is 1"}
    assert conversion.notes[1:] == (
        f"expert_tensor_parallel_degree = {etp} is written as etp: 1. torchtitan ignores it "
        "while expert_parallel_degree is 1, but meshconf checks etp even without experts: it "
        "must be 1 or tp.",
    )


def test_torchtitan_etp_with_experts_is_kept() -> None:
    table = {"tensor_parallel_degree": 4, "expert_parallel_degree": 2}
    conversion = convert(TORCHTITAN, table | {"expert_tensor_parallel_degree": 4}, world_size=8)
    assert conversion.data["degrees"] == {
        "pp": 1, "dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 4, "ep": 2, "etp": 4
    }  # fmt: skip
    assert (conversion.comments, len(conversion.notes)) == ({}, 1)


@pytest.mark.parametrize(
    ("table", "training"),
    [
        ({"fsdp_reshard_after_forward": "never"},
         {"reshard_after_forward": "never", "pp_schedule": "1f1b"}),
        ({"pipeline_parallel_schedule": "DualPipeV"},
         {"pp_schedule": "dualpipev", "ep_overlap": True}),
        # torch's get_schedule_class ignores case
        ({"pipeline_parallel_schedule": "dualpipev"},
         {"pp_schedule": "dualpipev", "ep_overlap": True}),
        ({"pipeline_parallel_schedule": "DualPipeV",
          "pipeline_parallel_expert_parallel_overlap": False}, {"pp_schedule": "dualpipev"}),
        ({"pipeline_parallel_schedule": "ZBVZeroBubble"}, {"pp_schedule": "zbv"}),
        ({"pipeline_parallel_schedule": "Interleaved1F1B"},
         {"pp_schedule": "interleaved", "virtual_stages": 2}),
        ({"pipeline_parallel_schedule": "interleaved1f1b"},
         {"pp_schedule": "interleaved", "virtual_stages": 2}),
    ],
)  # fmt: skip
def test_torchtitan_training_settings_become_the_training_block(
    table: dict[str, object], training: dict[str, object]
) -> None:
    """The resharding policy is the training block's; DualPipeV overlaps the experts' traffic
    when torchtitan's switch (on by default) is on, with pipeline and expert parallelism; the
    schedules the estimate models are written with their model chunks per rank, and with pp
    the embedding and output count as a layer each in the split, as torchtitan's defaults
    say."""
    degrees = {"pipeline_parallel_degree": 2, "expert_parallel_degree": 2}
    conversion = convert(TORCHTITAN, degrees | table, world_size=8)
    split = {"embedding_as_layers": 1, "output_as_layers": 1}
    assert conversion.data.get("training") == training | split


def test_a_bad_torchtitan_resharding_policy_is_reported_at_its_key() -> None:
    with pytest.raises(ConversionError) as raised:
        convert(TORCHTITAN, {"fsdp_reshard_after_forward": "sometimes"}, world_size=8)
    ((key, message),) = [(problem.key, problem.message) for problem in raised.value.problems]
    assert key == "fsdp_reshard_after_forward"
    assert message.startswith("expected 'default', 'always' or 'never', got the string 'sometimes'")


def test_torchtitan_fields_that_are_not_mesh_settings_are_listed_in_field_order() -> None:
    table = {
        "pipeline_parallel_schedule": "1F1B",
        "expert_parallel_comm_backend": "deepep",
        "data_parallel_shard_degree": 2,
        "module_fqns_per_model_part": [["tok_embeddings"], ["output"]],
        "disable_loss_parallel": True,
    }
    assert convert(TORCHTITAN, table).notes[1:] == (
        "Not converted, as they are not mesh settings (keep them in the torchtitan job config): "
        "disable_loss_parallel, module_fqns_per_model_part, expert_parallel_comm_backend.",
    )


@pytest.mark.parametrize(
    ("source", "tool"), [("torchtitan", "torchtitan"), ("kempnerforge", "KempnerForge")]
)
def test_a_file_without_the_table_converts_the_defaults(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, source: str, tool: str
) -> None:
    write(tmp_path, "[job]\ndescription = 'no parallelism'\n")
    result = run_cli("convert", "job.toml", "--from", source, cwd=tmp_path)
    table = "parallelism" if source == "torchtitan" else "distributed"
    assert result.returncode == 0
    assert f"# - The file has no [{table}] table: every setting is {tool}'s default.\n" in (
        result.stdout
    )
    degrees = (
        "degrees:\n  pp: 1\n  dp_replicate: 1\n  dp_shard: -1\n  cp: 1\n  tp: 1\n  ep: 1\n"
        "  etp: 1\n"
    )
    # torchtitan's default checkpointing recomputes one block in 2
    training = (
        "\ntraining:\n  activation_checkpointing: full\n"
        '  checkpoint_every: 2  # torchtitan\'s default selective_ac_option = "2"\n'
    )
    assert result.stdout.endswith(degrees + (training if source == "torchtitan" else ""))


def test_kempnerforge_ep_multiplies_dp_shard_and_etp_follows_tp() -> None:
    conversion = convert(KEMPNERFORGE, {"dp_shard": 4, "ep": 2, "tp": 4}, world_size=32)
    assert conversion.data["degrees"] == {
        "pp": 1, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 4, "ep": 2, "etp": 4
    }  # fmt: skip
    assert conversion.comments == {
        "degrees.dp_shard": "KempnerForge's dp_shard 4 * ep 2",
        "degrees.etp": "= tp, for KempnerForge's expert groups",
    }
    assert conversion.notes[1:] == (
        EP_WORLD_FACTOR + "dp_shard is KempnerForge's dp_shard times ep: 4 * 2 = 8.",
        GROUPS + ", and etp, set to tp (4), is its tp. With etp 1, each ep group would sit "
        "inside one tp group instead.",
        data_split(2),
    )


def test_kempnerforge_dp_shard_minus_1_stays_minus_1() -> None:
    conversion = convert(KEMPNERFORGE, {"ep": 4}, world_size=8)
    assert conversion.data["degrees"]["dp_shard"] == -1
    assert conversion.data["degrees"]["etp"] == 1
    assert conversion.comments == {"degrees.dp_shard": "fills in as KempnerForge's dp_shard * ep"}
    assert conversion.notes[1:] == (
        EP_WORLD_FACTOR + "-1 stays -1: meshconf fills it with world_size / (pp * dp_replicate "
        "* cp * tp), which is KempnerForge's dp_shard times ep.",
        GROUPS + ".",
        data_split(4),
    )
    assert meshconf.load_config(conversion.data).resolved_degrees["dp_shard"] == 8


def test_kempnerforge_without_experts_changes_nothing() -> None:
    table = {"dp_shard": 2, "dp_replicate": 2, "tp": 2, "pp": 2}
    conversion = convert(KEMPNERFORGE, table)
    assert conversion.data["degrees"] == {
        "pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "ep": 1, "etp": 1
    }  # fmt: skip
    assert (conversion.comments, len(conversion.notes)) == ({}, 1)


def test_kempnerforge_cp() -> None:
    conversion = convert(KEMPNERFORGE, {"dp_shard": 2, "cp": 2, "ep": 2}, world_size=8)
    assert conversion.data["degrees"]["dp_shard"] == 4
    assert conversion.notes[1:] == (
        EP_WORLD_FACTOR + "dp_shard is KempnerForge's dp_shard times ep: 2 * 2 = 4.",
        data_split(2),
        "cp = 2: KempnerForge counts it in its world size, but has no mesh dim for it and "
        "applies no context parallelism. In meshconf, cp has its own groups in the dataloading "
        "domain and is part of fsdp, loss and efsdp.",
    )


def test_kempnerforge_runtime_and_pp_schedule() -> None:
    table = {"pp": 2, "pp_schedule": "interleaved_1f1b", "nccl_timeout_sec": 600}
    conversion = convert(KEMPNERFORGE, table | {"backend": "cpu:gloo,cuda:nccl"})
    assert conversion.data["runtime"] == {"timeout_s": 600, "backend": "auto"}
    assert conversion.comments == {
        "runtime.timeout_s": "KempnerForge's nccl_timeout_sec",
        "runtime.backend": "KempnerForge's backend 'cpu:gloo,cuda:nccl'",
    }
    assert conversion.notes[1:] == (
        "nccl_timeout_sec = 600 is runtime.timeout_s. KempnerForge gives it to "
        "init_process_group, for the default group; meshconf gives it to the default group and "
        "to every group it creates.",
        "backend = 'cpu:gloo,cuda:nccl' is runtime.backend: auto. KempnerForge's string gives "
        "every group two backends, gloo for CPU tensors and nccl for CUDA tensors; meshconf "
        "gives each group one, nccl on GPUs and gloo on CPU.",
        "pp_schedule is not converted: it is not a mesh setting; keep it in the training config.",
    )


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_kempnerforge_single_backend(backend: str) -> None:
    conversion = convert(KEMPNERFORGE, {"backend": backend})
    assert conversion.data["runtime"] == {"backend": backend}
    assert conversion.notes[1:] == (f"backend = '{backend}' is runtime.backend: {backend}.",)


def test_comments_sit_beside_their_keys(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write(tmp_path, "[distributed]\nep = 2\nbackend = 'nccl'\n")
    result = run_cli("convert", "job.toml", "--world-size", "4", cwd=tmp_path)
    assert result.stdout.endswith(
        "world_size: 4\n\ndegrees:\n  pp: 1\n  dp_replicate: 1\n"
        "  dp_shard: -1       # fills in as KempnerForge's dp_shard * ep\n"
        "  cp: 1\n  tp: 1\n  ep: 2\n  etp: 1\n\n"
        "runtime:\n  backend: nccl      # KempnerForge's backend 'nccl'\n"
    )


# Errors: every message, exactly, with its exit code.

INVALID = [
    # torchtitan
    (
        "[parallelism]\ntensor_paralel_degree = 2\nwarp_speed = 9\n",
        (),
        "job.toml: [parallelism].tensor_paralel_degree: not a field of torchtitan 0.2.1's "
        "Parallelism (did you mean 'tensor_parallel_degree'?)\n"
        "job.toml: [parallelism].warp_speed: not a field of torchtitan 0.2.1's Parallelism\n",
    ),
    (
        "[parallelism]\nexpert_parallel_degree = '4'\ncontext_parallel_degree = 'two'\n"
        "pipeline_parallel_degree = 2.0\ntensor_parallel_degree = true\n",
        (),
        "job.toml: [parallelism].expert_parallel_degree: expected an integer >= 1, got the "
        "string '4' (a quoted number is a string; write the integer unquoted)\n"
        "job.toml: [parallelism].context_parallel_degree: expected an integer >= 1, got the "
        "string 'two'\n"
        "job.toml: [parallelism].pipeline_parallel_degree: expected an integer >= 1, got the "
        "float 2.0\n"
        "job.toml: [parallelism].tensor_parallel_degree: expected an integer >= 1, got the "
        "boolean true\n",
    ),
    (
        "[parallelism]\ndata_parallel_shard_degree = 0\ntensor_parallel_degree = -1\n"
        "data_parallel_replicate_degree = -2\n",
        (),
        "job.toml: [parallelism].data_parallel_shard_degree: expected an integer >= 1 or -1 "
        "(fill the remaining ranks), got 0\n"
        "job.toml: [parallelism].tensor_parallel_degree: expected an integer >= 1, got -1: only "
        "data_parallel_shard_degree may be -1\n"
        "job.toml: [parallelism].data_parallel_replicate_degree: expected an integer >= 1, got "
        "-2\n",
    ),
    (
        "[parallelism]\ntensor_parallel_degree = 4294967296\n",
        (),
        "job.toml: [parallelism].tensor_parallel_degree: 4294967296 is larger than 2147483647, "
        "the most ranks torch can number\n",
    ),
    (
        "[parallelism]\ntensor_parallel_degree = 4\nexpert_parallel_degree = 3\n",
        ("--world-size", "16"),
        "job.toml: [parallelism].expert_parallel_degree: ep(3) * etp(1) = 3 must divide "
        "dp_shard(4) * cp(1) * tp(4) = 16: experts borrow their ranks from those dims\n",
    ),
    (
        "[parallelism]\ntensor_parallel_degree = 4\nexpert_parallel_degree = 2\n"
        "expert_tensor_parallel_degree = 2\n",
        ("--world-size", "16"),
        "job.toml: [parallelism].expert_tensor_parallel_degree: etp(2) must be 1 or equal to "
        "tp(4)\n",
    ),
    (
        "[parallelism]\ntensor_parallel_degree = 4\n",
        ("--world-size", "10"),
        "job.toml: [parallelism].tensor_parallel_degree: tp(4) leaves no whole number of ranks "
        "for dp_shard (-1 by default): world_size 10 is not divisible by pp(1) * "
        "dp_replicate(1) * cp(1) * tp(4) = 4; tp could be one of 1, 2, 5, 10 (the divisors of "
        "10)\n",
    ),
    (
        "[parallelism]\ndata_parallel_shard_degree = 2\ntensor_parallel_degree = 2\n",
        ("--world-size", "8"),
        "job.toml: [parallelism].tensor_parallel_degree: pp(1) * dp_replicate(1) * dp_shard(2) * "
        "cp(1) * tp(2) = 4 != world_size 8\n",
    ),
    ("parallelism = 4\n", (), "job.toml: [parallelism]: expected a table, got the integer 4\n"),
    (
        "[[parallelism]]\ntensor_parallel_degree = 2\n",
        (),
        "job.toml: [parallelism]: expected a table, got a list\n",
    ),
    # KempnerForge
    (
        "[distributed]\ndp_shards = 2\n",
        (),
        "job.toml: [distributed].dp_shards: not a key of KempnerForge's [distributed] (did you "
        "mean 'dp_shard'?); its keys are dp_shard, dp_replicate, tp, pp, pp_schedule, cp, ep, "
        "nccl_timeout_sec, backend\n",
    ),
    (
        "[distributed]\nep = 0\ntp = -1\ndp_shard = 'auto'\n",
        (),
        "job.toml: [distributed].ep: expected an integer >= 1, got 0\n"
        "job.toml: [distributed].tp: expected an integer >= 1, got -1: only dp_shard may be -1\n"
        "job.toml: [distributed].dp_shard: expected an integer >= 1 or -1 (fill the remaining "
        "ranks), got the string 'auto'\n",
    ),
    (
        "[distributed]\ndp_shard = 4\ntp = 4\nep = 2\n",
        ("--world-size", "16"),
        "job.toml: [distributed]: dp_replicate(1) * dp_shard(4) * tp(4) * pp(1) * cp(1) * ep(2) = "
        "32 != world_size 16 (KempnerForge counts ep as a world factor)\n",
    ),
    (
        "[distributed]\ntp = 4\nep = 2\n",
        ("--world-size", "36"),
        "job.toml: [distributed].dp_shard: -1 cannot fill the remaining ranks: world_size 36 is "
        "not divisible by dp_replicate(1) * tp(4) * pp(1) * cp(1) * ep(2) = 8 (KempnerForge "
        "counts ep as a world factor)\n",
    ),
    (
        "[distributed]\ndp_shard = 1073741824\nep = 4\n",
        (),
        "job.toml: [distributed].dp_shard: 4294967296 is larger than 2147483647, the most ranks "
        "torch can number\n",
    ),
    (
        "[distributed]\nnccl_timeout_sec = '600'\nbackend = 'mpi'\n",
        (),
        "job.toml: [distributed].nccl_timeout_sec: expected an integer >= 1, got the string "
        "'600' (a quoted number is a string; write the integer unquoted)\n"
        "job.toml: [distributed].backend: expected one of 'cpu:gloo,cuda:nccl', "
        "'cuda:nccl,cpu:gloo', 'nccl', 'gloo', got the string 'mpi': meshconf's runtime.backend "
        "is auto, nccl or gloo\n",
    ),
    (
        "[distributed]\nnccl_timeout_sec = 4294967296\n",
        (),
        "job.toml: [distributed].nccl_timeout_sec: 4294967296 is larger than 2147483647, longer "
        "than any job should wait\n",
    ),
    (
        '[distributed]\n"dp shard" = 2\n',
        (),
        'job.toml: [distributed]."dp shard": not a key of KempnerForge\'s [distributed] (did you '
        "mean 'dp_shard'?); its keys are dp_shard, dp_replicate, tp, pp, pp_schedule, cp, ep, "
        "nccl_timeout_sec, backend\n",
    ),
    ("distributed = [1, 2]\n", (), "job.toml: [distributed]: expected a table, got a list\n"),
    # The file
    ("x = " + "[" * 2000 + "]" * 2000 + "\n", (), "job.toml: invalid TOML: nested too deeply\n"),
]


@pytest.mark.parametrize(("text", "args", "expected"), INVALID)
def test_invalid_input_exits_1(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, text: str, args: tuple[str, ...], expected: str
) -> None:
    write(tmp_path, text)
    result = run_cli("convert", "job.toml", *args, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", expected)


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("x = \n", "1:5"),
        ("[parallelism]\ntensor_parallel_degree = 2\ntensor_parallel_degree = 4\n", "3:27"),
        ("x = 'unclosed", "1:14"),
    ],
)
def test_toml_syntax_errors_are_located(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, text: str, position: str
) -> None:
    # After the prefix, the words are the TOML parser's (tomli, or tomllib from Python 3.14).
    write(tmp_path, text)
    result = run_cli("convert", "job.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(f"job.toml:{position}: invalid TOML: ")
    assert result.stderr.count("\n") == 1


def test_text_that_is_not_utf_8_exits_1(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "job.toml").write_bytes(b"[parallelism]\ntensor_parallel_degree = 2 # \xff\n")
    result = run_cli("convert", "job.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        "",
        "job.toml:2:30: invalid TOML: not UTF-8\n",
    )


USAGE = [
    (
        "[x]\n",
        ("job.toml",),
        "meshconf: error: job.toml: has neither a [parallelism] table (torchtitan) nor a [distributed] table (KempnerForge); pass --from torchtitan or --from kempnerforge (or --from megatron for Megatron-LM's arguments, --from accelerate for accelerate's arguments)",
    ),
    (
        "[parallelism]\n[distributed]\n",
        ("job.toml",),
        "meshconf: error: job.toml: has both a [parallelism] table (torchtitan) and a [distributed] table (KempnerForge); pass --from torchtitan or --from kempnerforge (or --from megatron for Megatron-LM's arguments, --from accelerate for accelerate's arguments)",
    ),
    (
        "",
        ("missing.toml",),
        "meshconf: error: missing.toml: cannot read: No such file or directory",
    ),
    ("", (".",), "meshconf: error: .: is a directory, not a file to convert"),
    (
        "[parallelism]\n",
        ("job.toml", "--out", "job.toml/out.yaml"),
        "meshconf: error: job.toml/out.yaml: cannot write: File exists",
    ),
    (
        "[parallelism]\n",
        ("job.toml", "--from", "titan"),
        "meshconf: error: --from: expected one of torchtitan, kempnerforge, megatron or accelerate, got 'titan' (did you mean 'torchtitan'?)",
    ),
    (
        "[parallelism]\n",
        ("job.toml", "--world-size", "0"),
        "meshconf: error: --world-size: expected an integer >= 1, got '0'",
    ),
    (
        "[parallelism]\n",
        ("job.toml", "--gpus-per-node", "5000"),
        "meshconf: error: --gpus-per-node: 5000 is larger than 4096, more than any node holds",
    ),
]


FROM_CHOICES = "--from torchtitan or --from kempnerforge or --from megatron or --from accelerate"
#: Files ``convert`` without --from cannot tell the source of: name, text, message.
UNRECOGNISED = [
    (
        "job.sh",
        "echo start\n",
        "meshconf: error: job.sh: cannot tell which tool's settings it holds: it looks like a "
        "script or text with no `accelerate launch` line, no torchrun or Megatron-LM training "
        f"script line, and no [parallelism] or [distributed] TOML table; pass {FROM_CHOICES}",
    ),
    (
        "mesh.yaml",
        "world_size: 8\ndegrees: {tp: 2}\n",
        "meshconf: error: mesh.yaml: cannot tell which tool's settings it holds: it looks like "
        "a meshconf config already (`meshconf validate` checks it; `--to megatron` writes it as "
        f"Megatron-LM's arguments); pass {FROM_CHOICES}",
    ),
    (
        "run.yaml",
        "name: run\nsteps: 10\n",
        "meshconf: error: run.yaml: cannot tell which tool's settings it holds: it looks like "
        f"YAML with neither accelerate's config keys nor NeMo's parallelism settings; pass "
        f"{FROM_CHOICES}",
    ),
    (
        "job.sh",
        "accelerate launch train.py\ntorchrun --nproc-per-node 8 pretrain_gpt.py\n",
        "meshconf: error: job.sh: holds both Megatron-LM's and accelerate's settings; pass "
        "--from megatron or --from accelerate",
    ),
]

#: A file of each source, and the source ``convert`` without --from recognises.
RECOGNISED = [
    ("examples/migration/accelerate/fsdp2_hsdp_tp_cp_16gpu.yaml", None, "accelerate"),
    ("examples/migration/torchtitan_llama3_70b.toml", None, "torchtitan"),
    ("examples/migration/kempnerforge_moe_32gpu.toml", None, "kempnerforge"),
    (
        "job.sh",
        "export X=1\naccelerate launch --num_processes 8 train.py\n",
        "accelerate",
    ),
    ("job", "accelerate launch --num_processes 8 train.py\n", "accelerate"),
    (
        "job.sh",
        "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2\n",
        "megatron",
    ),
    ("args.txt", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2\n", "megatron"),
    (
        "nemo.yaml",
        "trainer:\n  devices: 8\nmodel:\n  tensor_model_parallel_size: 2\n",
        "megatron",
    ),
    ("acc.yml", "distributed_type: MULTI_GPU\nnum_processes: 8\n", "accelerate"),
]


@pytest.mark.parametrize(("name", "text", "expected"), UNRECOGNISED)
def test_convert_without_from_says_what_a_file_looks_like(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, name: str, text: str, expected: str
) -> None:
    (tmp_path / name).write_text(text)
    result = run_cli("convert", name, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == expected


@pytest.mark.parametrize(("name", "text", "source"), RECOGNISED)
def test_convert_without_from_recognises_its_source(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, name: str, text: str | None, source: str
) -> None:
    path = Path(name) if text is None else tmp_path / name
    if text is not None:
        path.write_text(text)
    else:
        path = Path.cwd() / path
    found = run_cli("convert", str(path), cwd=tmp_path)
    given = run_cli("convert", "--from", source, str(path), cwd=tmp_path)
    assert found.returncode == 0, found.stdout + found.stderr
    assert found.stdout == given.stdout


@pytest.mark.parametrize(("text", "args", "expected"), USAGE)
def test_usage_errors_exit_2(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, text: str, args: tuple[str, ...], expected: str
) -> None:
    write(tmp_path, text)
    result = run_cli("convert", *args, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == expected


# KempnerForge's own rank groups, computed here without meshconf.


def kempnerforge_groups(sizes: dict[str, int]) -> dict[str, list[list[int]]]:
    """Each rank's group along each dim of a row-major mesh of ``sizes`` (outer to inner),
    as ``init_device_mesh`` lays out KempnerForge's [pp, dp_replicate, dp_shard, ep, tp]."""
    shape = list(sizes.values())
    coordinates = list(itertools.product(*(range(size) for size in shape)))
    rank_at = {coordinate: rank for rank, coordinate in enumerate(coordinates)}
    groups: dict[str, list[list[int]]] = {}
    for axis, name in enumerate(sizes):
        groups[name] = [
            [rank_at[(*c[:axis], index, *c[axis + 1 :])] for index in range(shape[axis])]
            for c in coordinates
        ]
    return groups


#: (pp, dp_replicate, dp_shard, ep, tp) in KempnerForge's terms (cp is 1: KempnerForge's mesh
#: has no cp dim), and the world size.
KEMPNERFORGE_MESHES = [
    ((1, 1, 4, 2, 4), 32),
    ((2, 1, 2, 2, 2), 16),
    ((1, 2, 2, 4, 1), 16),
    ((2, 2, 1, 2, 2), 16),
    ((1, 1, 3, 2, 1), 6),
    ((1, 2, 1, 3, 2), 12),
    ((1, 1, 1, 2, 4), 8),
    ((1, 2, -1, 2, 2), 16),
    ((2, 1, -1, 3, 1), 12),
    ((2, 1, 2, 1, 1), 4),
    ((1, 2, 2, 1, 2), 8),
]


@pytest.mark.parametrize(("degrees", "world_size"), KEMPNERFORGE_MESHES)
def test_kempnerforge_ep_and_dp_shard_groups_are_kempnerforges(
    degrees: tuple[int, int, int, int, int], world_size: int
) -> None:
    names = ("pp", "dp_replicate", "dp_shard", "ep", "tp")
    table = dict(zip(names, degrees, strict=True))
    config = meshconf.load_config(convert(KEMPNERFORGE, table, world_size=world_size).data)
    if table["dp_shard"] == -1:
        others = table["pp"] * table["dp_replicate"] * table["ep"] * table["tp"]
        table["dp_shard"] = world_size // others
    groups = kempnerforge_groups(table)
    sparse = config.layout("sparse")
    # Without experts the converter leaves etp at 1, so efsdp spans dp_shard * tp; there is no
    # expert to place, and KempnerForge's dp_shard group is meshconf's fsdp group.
    experts = table["ep"] > 1 or table["tp"] == 1
    dp_shard = sparse if experts else config.layout("dense")
    dp_shard_dim = "efsdp" if experts else "fsdp"
    for rank in range(world_size):
        assert sparse.group(rank, "ep").ranks() == groups["ep"][rank]
        assert dp_shard.group(rank, dp_shard_dim).ranks() == groups["dp_shard"][rank]
