"""OmegaConf: ``${oc.env:...}`` values become integers where the field is an integer, from a
file, an override or a DictConfig; interpolation, dot-list overrides and Hydra's prefixes
resolve before validation.

.ci/run runs this file and tests/test_loading.py a second time against omegaconf 2.4 (the dev
install has 2.3, which hydra-core 1.3 requires).
"""

from __future__ import annotations

from pathlib import Path

import omegaconf
import pytest
from omegaconf import OmegaConf

from meshconf import ConfigError, SourceError, load_config


def _lines(source: object, overrides: tuple[str, ...] = (), **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(source, overrides, **kwargs)  # type: ignore[arg-type]
    return [diagnostic.render() for diagnostic in caught.value.diagnostics]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("MESH_WORLD", "64")
    monkeypatch.setenv("MESH_TP", "8")
    monkeypatch.setenv("MESH_BAD", "eight")
    return monkeypatch


def test_the_omegaconf_under_test_is_supported() -> None:
    assert omegaconf.__version__.startswith(("2.3.", "2.4."))


def test_environment_values_become_integers_in_a_file(tmp_path: Path, env: object) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "world_size: ${oc.env:MESH_WORLD}\n"
        "gpus_per_node: ${oc.env:MESH_GPUS,8}\n"
        "degrees:\n  tp: ${oc.env:MESH_TP}\n  pp: ${oc.decode:${oc.env:MESH_TP}}\n"
        "runtime: {timeout_s: '${oc.env:MESH_WORLD}'}\n"
    )
    config = load_config(path)
    assert config.resolved_world_size == 64
    assert config.gpus_per_node == 8
    assert config.resolved_degrees["tp"] == 8 and config.resolved_degrees["pp"] == 8
    assert config.runtime.timeout_s == 64


def test_written_strings_stay_strings(tmp_path: Path, env: object) -> None:
    """Only values that came out of an interpolation are read as integers: a quoted "8" in the
    file is still refused, with the reason."""
    path = tmp_path / "exp.yaml"
    path.write_text("world_size: ${oc.env:MESH_WORLD}\ndegrees:\n  tp: '8'\n")
    assert _lines(path) == [
        f"{path}:3:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), "
        "got the string '8' (a quoted number is a string; write the integer you mean, unquoted)"
    ]


def test_a_string_named_by_a_plain_interpolation_stays_a_string() -> None:
    node = OmegaConf.create({"size": "8", "mesh": {"world_size": "${size}"}})
    assert _lines(node, key="mesh") == [
        "mesh.world_size: expected an integer >= 1, got the string '8' (resolved from ${size})"
    ]
    assert load_config({"size": 8, "mesh": {"world_size": "${size}"}}, key="mesh")


def test_non_integer_environment_values_are_refused_with_their_source(
    tmp_path: Path, env: pytest.MonkeyPatch
) -> None:
    env.setenv("MESH_LEADING_ZERO", "08")
    path = tmp_path / "exp.yaml"
    path.write_text("world_size: ${oc.env:MESH_LEADING_ZERO}\ndegrees:\n  tp: ${oc.env:MESH_BAD}\n")
    assert _lines(path) == [
        f"{path}:1:1: world_size: expected an integer >= 1, got the string '08' "
        "(resolved from ${oc.env:MESH_LEADING_ZERO})",
        f"{path}:3:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), "
        "got the string 'eight' (resolved from ${oc.env:MESH_BAD})",
    ]


def test_string_fields_keep_environment_strings(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("MESH_INNER", "tp")
    path = tmp_path / "exp.yaml"
    path.write_text(
        "world_size: ${oc.env:MESH_WORLD}\nderived:\n  scale: ${oc.env:MESH_TP}\n"
        "domains:\n  dense: [pp, dp_replicate, fsdp, '${oc.env:MESH_INNER}']\n"
    )
    config = load_config(path)
    assert config.derived == {"scale": "8"}
    assert config.effective_domains == {"dense": ("pp", "dp_replicate", "fsdp", "tp")}


def test_environment_values_in_overrides(tmp_path: Path, env: object) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("world_size: 64\n")
    config = load_config(path, ["degrees.tp=${oc.env:MESH_TP}", "++degrees.pp=2"])
    assert config.resolved_degrees["tp"] == 8 and config.resolved_degrees["pp"] == 2


def test_environment_values_in_a_dictconfig(env: object) -> None:
    node = OmegaConf.create(
        {"run": {"mesh": {"world_size": "${oc.env:MESH_WORLD}", "degrees": {"tp": 4}}}}
    )
    assert load_config(node, key="run.mesh").resolved_world_size == 64
    assert load_config(node.run.mesh).resolved_world_size == 64
    assert load_config(node, ["run.mesh.degrees.tp=${oc.env:MESH_TP}"], key="run.mesh")


def test_dictconfig_errors_carry_the_full_key(env: object) -> None:
    node = OmegaConf.create({"run": {"mesh": {"world_size": 8, "degrees": {"tp": 3}}}})
    assert _lines(node, key="run.mesh") == [
        "run.mesh.degrees.tp: tp(3) leaves no whole number of ranks for dp_shard (-1 by "
        "default): world_size 8 is not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3; "
        "tp could be one of 1, 2, 4, 8 (the divisors of 8)"
    ]


def test_hydra_prefixes_on_a_dictconfig(env: object) -> None:
    node = OmegaConf.create({"world_size": 16, "degrees": {"tp": 2}})
    config = load_config(node, ["~degrees.tp", "+degrees.cp=4", "++degrees.pp=2"])
    assert config.resolved_degrees == {
        "pp": 2,
        "dp_replicate": 1,
        "dp_shard": 2,
        "cp": 4,
        "tp": 1,
        "ep": 1,
        "etp": 1,
    }
    with pytest.raises(SourceError, match=r"degrees.tp already exists; use degrees.tp=\.\.\."):
        load_config(node, ["+degrees.tp=4"])
    assert OmegaConf.to_container(node) == {"world_size": 16, "degrees": {"tp": 2}}
