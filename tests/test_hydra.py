"""The Hydra integration, on the example app in examples/hydra_app: composing with the typed
schema node, overrides, instantiation to a validated MeshConfig, errors as meshconf's own
messages, and a multirun of the real app in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import hydra
import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, InstantiationException
from omegaconf import DictConfig

from meshconf import ConfigError, InsideNode, MeshConfig
from meshconf.integrations.hydra import (
    SCHEMA_NAME,
    DegreesNode,
    HydraConfigError,
    InsideNodeNode,
    MeshConfigNode,
    RuntimeNode,
    TrainingNode,
    instantiate,
    register_configs,
)
from meshconf.model.training import TrainingOptions

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "hydra_app"


@pytest.fixture
def composer() -> Iterator[object]:
    register_configs()
    with initialize_config_dir(config_dir=str(APP / "conf"), version_base="1.3"):
        yield lambda *overrides: compose("config", overrides=list(overrides))


def test_default_option_composes_and_instantiates(composer) -> None:
    cfg: DictConfig = composer()
    config = instantiate(cfg.parallelism)
    assert isinstance(config, MeshConfig)
    assert config.resolved_degrees == {
        "pp": 1,
        "dp_replicate": 1,
        "dp_shard": 8,
        "cp": 1,
        "tp": 1,
        "ep": 1,
        "etp": 1,
    }
    assert config.gpus_per_node == 8


def test_hydra_instantiate_returns_the_validated_model(composer) -> None:
    cfg = composer("parallelism=moe_64gpu")
    config = hydra.utils.instantiate(cfg.parallelism)
    assert isinstance(config, MeshConfig)
    assert config.resolved_world_size == 64
    assert config.resolved_degrees["dp_shard"] == 8


def test_second_option_and_overrides(composer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "128")
    cfg = composer("parallelism=moe_64gpu", "parallelism.degrees.tp=2")
    config = instantiate(cfg.parallelism)
    assert config.resolved_world_size == 128
    assert config.resolved_degrees == {
        "pp": 8,
        "dp_replicate": 1,
        "dp_shard": 8,
        "cp": 1,
        "tp": 2,
        "ep": 8,
        "etp": 1,
    }
    assert [dim.name for dim in config.layout("sparse").dims] == [
        "pp",
        "dp_replicate",
        "efsdp",
        "ep",
        "etp",
    ]


def test_unset_fields_keep_meshconf_defaults(composer) -> None:
    """dp_shard defaults to 1 when another world factor is -1; a fixed default in the schema
    node would have made it -1 and the config invalid."""
    cfg = composer("parallelism.degrees.dp_shard=null", "parallelism.degrees.tp=-1")
    config = instantiate(cfg.parallelism)
    assert config.resolved_degrees["tp"] == 8
    assert config.resolved_degrees["dp_shard"] == 1
    assert config.degrees.explicit == {"tp"}


def test_wrong_type_is_refused_while_composing(composer) -> None:
    with pytest.raises(ConfigCompositionException) as raised:
        composer("parallelism.degrees.tp=abc")
    cause = str(raised.value.__cause__)
    assert "Value 'abc' of type 'str' could not be converted to Integer" in cause
    assert "full_key: parallelism.degrees.tp" in cause


def test_unknown_key_is_refused_while_composing(composer) -> None:
    with pytest.raises(ConfigCompositionException) as raised:
        composer("parallelism.degrees.tpp=2")
    assert "Key 'tpp' not in 'DegreesNode'" in str(raised.value.__cause__)


def test_rule_errors_are_meshconf_messages_at_the_full_key(composer) -> None:
    cfg = composer("parallelism.degrees.tp=3")
    with pytest.raises(ConfigError) as raised:
        instantiate(cfg.parallelism)
    assert isinstance(raised.value, HydraConfigError)
    assert str(raised.value) == (
        "parallelism.degrees.dp_shard: -1 cannot fill the remaining ranks: world_size 8 is "
        "not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3"
    )
    assert raised.value.diagnostics[0].path == ("parallelism", "degrees", "dp_shard")


def test_hydra_instantiate_quotes_the_meshconf_message(composer) -> None:
    cfg = composer("parallelism.degrees.tp=3")
    with pytest.raises(InstantiationException) as raised:
        hydra.utils.instantiate(cfg.parallelism)
    assert str(raised.value).splitlines() == [
        "Error in call to target 'meshconf.integrations.hydra.build_config':",
        "degrees.dp_shard: -1 cannot fill the remaining ranks: world_size 8 is not divisible "
        "by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3",
        "full_key: parallelism",
    ]
    assert isinstance(raised.value.__cause__, ConfigError)


def test_schema_node_is_listed_under_its_internal_name(composer) -> None:
    from hydra.core.config_store import ConfigStore

    assert f"{SCHEMA_NAME}.yaml" in ConfigStore.instance().list("parallelism")


def test_schema_node_has_the_models_keys() -> None:
    """The node must follow the models: a key added to MeshConfig is a key Hydra accepts."""
    assert set(MeshConfigNode.__dataclass_fields__) == {"_target_", *MeshConfig.model_fields}
    degrees = MeshConfig.model_fields["degrees"].annotation
    runtime = MeshConfig.model_fields["runtime"].annotation
    assert degrees is not None and runtime is not None
    assert set(DegreesNode.__dataclass_fields__) == set(degrees.model_fields)
    assert set(RuntimeNode.__dataclass_fields__) == set(runtime.model_fields)
    assert set(InsideNodeNode.__dataclass_fields__) == set(InsideNode.model_fields)
    # in the models' order, as the Hydra schema lists them
    assert list(TrainingNode.__dataclass_fields__) == list(TrainingOptions.model_fields)


def test_inside_node_left_unset_means_plain_row_major(composer) -> None:
    config = instantiate(composer().parallelism)
    assert config.inside_node is None


def test_inside_node_from_the_command_line(composer) -> None:
    """Two nodes of 4: tp 2 and dp_shard 2 inside each node, dp_shard 2 across."""
    cfg = composer(
        "parallelism.gpus_per_node=4",
        "parallelism.degrees.tp=2",
        "parallelism.inside_node.tp=2",
        "parallelism.inside_node.dp_shard=2",
    )
    config = instantiate(cfg.parallelism)
    assert config.inside_node is not None and config.inside_node.explicit == {"tp", "dp_shard"}
    assert config.layout("dense").placement("fsdp", 4) == "mixed"
    cfg = composer("parallelism.gpus_per_node=4", "parallelism.inside_node.dp_shard=2")
    with pytest.raises(HydraConfigError) as raised:
        instantiate(cfg.parallelism)
    assert str(raised.value) == (
        "parallelism.inside_node: dp_shard(2): 2 ranks per node != gpus_per_node 4; the parts "
        "inside a node must fill it exactly (a world factor left out has 1 inside)"
    )


def _run_app(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "WORLD_SIZE"}
    return subprocess.run(
        [sys.executable, str(APP / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow  # runs the Hydra app in its own process
def test_the_app_writes_nothing_where_it_runs(tmp_path: Path) -> None:
    """No outputs/ folder, log file or .hydra/ folder is left in the folder the app runs in
    (the repository root, when the docs' commands run)."""
    result = _run_app("parallelism.degrees.tp=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("hydra-demo: world_size 8, pp=1 dp_replicate=1 dp_shard=4")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # runs the Hydra app in its own process
def test_app_multirun_over_options_and_overrides(tmp_path: Path) -> None:
    result = _run_app(
        "--multirun",
        "parallelism=llama3_8b_8gpu,moe_64gpu",
        "parallelism.degrees.tp=1,2",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    summaries = [line for line in result.stdout.splitlines() if line.startswith("hydra-demo")]
    assert summaries == [
        "hydra-demo: world_size 8, pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1 ep=1 etp=1",
        "hydra-demo: world_size 8, pp=1 dp_replicate=1 dp_shard=4 cp=1 tp=2 ep=1 etp=1",
        "hydra-demo: world_size 64, pp=8 dp_replicate=1 dp_shard=8 cp=1 tp=1 ep=8 etp=1",
        "hydra-demo: world_size 64, pp=8 dp_replicate=1 dp_shard=4 cp=1 tp=2 ep=8 etp=1",
    ]
    # One folder per job under the sweep folder, and nothing else where the app ran.
    assert [path.name for path in tmp_path.iterdir()] == ["multirun"]
    jobs = sorted(path.name for path in (tmp_path / "multirun").iterdir())
    assert jobs == ["0", "1", "2", "3", "multirun.yaml"]


@pytest.mark.slow  # runs the Hydra app in its own process
def test_app_reports_an_invalid_mesh_without_a_traceback(tmp_path: Path) -> None:
    result = _run_app("parallelism.degrees.tp=3", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[:2] == [
        "Error executing job with overrides: ['parallelism.degrees.tp=3']",
        "parallelism.degrees.dp_shard: -1 cannot fill the remaining ranks: world_size 8 is "
        "not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3",
    ]


@pytest.fixture
def plain_composer(tmp_path: Path) -> Iterator[object]:
    """An app whose `parallelism` options leave the schema node out of their defaults, so
    the composed node has no _target_."""
    conf = tmp_path / "conf"
    (conf / "parallelism").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - parallelism: plain\n  - _self_\n")
    (conf / "parallelism" / "plain.yaml").write_text("world_size: 8\ndegrees: {tp: 2}\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda *overrides: compose("config", overrides=list(overrides))


def test_a_node_without_target_is_validated(plain_composer) -> None:
    cfg = plain_composer()
    assert "_target_" not in cfg.parallelism
    config = instantiate(cfg.parallelism)
    assert isinstance(config, MeshConfig)
    assert config.resolved_degrees["dp_shard"] == 4
    with pytest.raises(HydraConfigError) as raised:
        instantiate(plain_composer("parallelism.degrees.tp=3").parallelism)
    assert str(raised.value) == (
        "parallelism.degrees.tp: tp(3) leaves no whole number of ranks for dp_shard (-1 by "
        "default): world_size 8 is not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3; "
        "tp could be one of 1, 2, 4, 8 (the divisors of 8)"
    )
    with pytest.raises(HydraConfigError) as raised:
        instantiate(plain_composer("+parallelism.degrees.tpp=2").parallelism)
    assert str(raised.value).startswith("parallelism.degrees.tpp: unknown key")
    assert isinstance(instantiate({"world_size": 4, "degrees": {"tp": 4}}), MeshConfig)


def test_another_target_is_refused(plain_composer) -> None:
    cfg = plain_composer("+parallelism._target_=builtins.dict")
    with pytest.raises(HydraConfigError) as raised:
        instantiate(cfg.parallelism)
    assert str(raised.value) == (
        "parallelism._target_: 'builtins.dict' is not meshconf's "
        "'meshconf.integrations.hydra.build_config'; list _meshconf_schema in the option's "
        "defaults, or leave _target_ out"
    )


def test_an_unset_environment_variable_is_one_error_at_its_key(
    composer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = composer("parallelism=moe_64gpu", "parallelism.world_size=${oc.env:MESHCONF_UNSET}")
    with pytest.raises(HydraConfigError) as raised:
        instantiate(cfg.parallelism)
    assert str(raised.value) == (
        "parallelism.world_size: cannot resolve: KeyError raised while resolving interpolation: "
        "\"Environment variable 'MESHCONF_UNSET' not found\""
    )
    assert raised.value.diagnostics[0].path == ("parallelism", "world_size")


@pytest.mark.slow  # runs the Hydra app in its own process
def test_app_reports_an_unset_environment_variable_in_one_line(tmp_path: Path) -> None:
    override = "parallelism.world_size=${oc.env:MESHCONF_UNSET}"
    result = _run_app(override, f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"Error executing job with overrides: ['{override}']",
        "parallelism.world_size: cannot resolve: KeyError raised while resolving interpolation: "
        "\"Environment variable 'MESHCONF_UNSET' not found\"",
        "",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ]


def test_levels_and_inside_from_the_command_line(composer) -> None:
    """Nodes of 2 in NVLink domains of 4; bad levels are meshconf's messages at their key."""
    cfg = composer(
        "parallelism.gpus_per_node=2",
        "parallelism.levels=[{name:nvlink,size:4,bandwidth_gb_s:900}]",
        "parallelism.degrees.pp=2",
        "+parallelism.inside.nvlink=[pp]",
    )
    config = instantiate(cfg.parallelism)
    assert [(level.name, level.size) for level in config.topology] == [("node", 2), ("nvlink", 4)]
    # Two stages are two ranks: kept in the domain, they land in one node of 2.
    assert config.layout("dense").group(0, "pp").ranks() == [0, 1]
    assert config.layout("dense").group(0, "fsdp").ranks() == [0, 2, 4, 6]
    cfg = composer("parallelism.levels=[{name:nvlink,size:12}]")
    with pytest.raises(HydraConfigError) as raised:
        instantiate(cfg.parallelism)
    assert str(raised.value) == (
        "parallelism.levels[0].size: one nvlink domain of 12 GPUs must hold whole units of the "
        "level below (one node of 8 GPUs): 12 is not a multiple of 8; make it one, such as 8 "
        "or 16"
    )


def test_the_training_block_from_the_command_line(composer) -> None:
    """An unset block is no block; a bad value is meshconf's message at its key."""
    assert instantiate(composer().parallelism).training is None
    cfg = composer("parallelism.training.zero_stage=1", "parallelism.training.moe_max_nodes=4")
    training = instantiate(cfg.parallelism).training
    assert training is not None
    assert training.estimate_settings() == {"zero_stage": 1, "moe_max_nodes": 4}
    cfg = composer("parallelism.training.pp_schedule=interleaved")
    with pytest.raises(HydraConfigError) as raised:
        instantiate(cfg.parallelism)
    assert str(raised.value) == (
        "parallelism.training.virtual_stages: pp_schedule interleaved needs virtual_stages >= 2"
    )
