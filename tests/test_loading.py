"""Loading from YAML, mappings and OmegaConf: positions, overrides, --key, hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshconf import ConfigError, SourceError, load_config
from meshconf.sources.overrides import Override, parse_override

CONFIG = """\
world_size: 8
degrees:
  dp_replicate: 2
  dp_shard: 2
  cp: 1
  tp: 3
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def lines(source: object, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(source, **kwargs)  # type: ignore[arg-type]
    return [diagnostic.render() for diagnostic in caught.value.diagnostics]


def test_spec_example_error_is_located(tmp_path: Path) -> None:
    path = write(tmp_path, CONFIG)
    assert lines(path) == [
        f"{path}:6:3: degrees.tp: pp(1) * dp_replicate(2) * dp_shard(2) * cp(1) * tp(3) = 12 "
        "!= world_size 8"
    ]


def test_list_items_and_nested_keys_are_located(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "world_size: 8\ndegrees: {tp: 2}\ndomains:\n  dense: [pp, fsdpp, tp]\n  other:\n    - tp\n    - 3\n",
    )
    # Formula rules run once every field has the right type, so only the type error shows.
    assert lines(path) == [f"{path}:7:7: domains.other[1]: expected a name, got the integer 3"]
    path.write_text("world_size: 8\ndegrees: {tp: 2}\ndomains:\n  dense: [pp, fsdpp, tp]\n")
    assert lines(path) == [
        f"{path}:4:15: domains.dense[1]: unknown dim 'fsdpp' (did you mean 'fsdp'?); dims are "
        "the degrees and the derived dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp, batch, "
        "fsdp, loss, efsdp",
    ]


def test_a_default_minus_one_that_cannot_fill_is_reported_on_the_degree_that_does_not_fit(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "world_size: 12\ndegrees:\n  tp: 8\n")
    assert lines(path) == [
        f"{path}:3:3: degrees.tp: tp(8) leaves no whole number of ranks for dp_shard (-1 by "
        "default): world_size 12 is not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(8) = "
        "8; tp could be one of 1, 2, 3, 4, 6, 12 (the divisors of 12)"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "degrees:\n  tp: yes\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string 'yes' (YAML 1.1 reads it as a boolean; write the integer you mean, unquoted)",
        ),
        (
            "degrees:\n  tp: 010\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string '010' (a leading zero: YAML 1.1 reads it as octal, YAML 1.2 as decimal; write the integer you mean, unquoted)",
        ),
        (
            "degrees:\n  tp: 1:00\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string '1:00' (YAML 1.1 reads it as a base-60 number; write the integer you mean, unquoted)",
        ),
        (
            "degrees:\n  tp: 1_000\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string '1_000' (YAML 1.1 reads '_' in numbers as nothing; write the integer you mean, unquoted)",
        ),
        (
            "degrees:\n  tp: 8.0\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the float 8.0",
        ),
        (
            "degrees:\n  tp: 1e3\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the float 1000.0",
        ),
        (
            "degrees:\n  tp: '8'\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string '8' (a quoted number is a string; write the integer you mean, unquoted)",
        ),
        (
            "degrees:\n  tp: true\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the boolean true",
        ),
        (
            "degrees:\n  tp: 2001-12-14\n",
            "2:3: degrees.tp: expected an integer >= 1 or -1 (fill the remaining ranks), got the string '2001-12-14'",
        ),
        ("world_size: " + "9" * 40 + "\n", "1:13: integer with more than 30 digits"),
        (
            "world_size: 99999999999999999999\n",
            "1:1: world_size: 99999999999999999999 is larger than 2147483647, the most ranks torch can number",
        ),
        ("degrees:\n  tp: 2\n  tp: 4\n", "3:3: degrees.tp: duplicate key (first given at line 2)"),
        (
            "- 1\n- 2\n",
            "1:1: expected a mapping of meshconf keys; the config is a list, not a mapping",
        ),
        ("", "expected a mapping of meshconf keys; the config is empty"),
        (
            "a: 1\n---\nb: 2\n",
            "2:1: YAML syntax: expected a single document in the stream, but found another document",
        ),
        ("? [a]\n: 1\n", "1:3: a key must be a plain name, not a list or mapping"),
        ("a: &x [*x]\n", "1:4: an alias refers to a node that contains it"),
        (
            "degrees: !!python/object:os.system {}\n",
            "1:10: unknown tag !!python/object:os.system; meshconf configs hold plain data only",
        ),
    ],
)
def test_hostile_and_trap_input(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    rendered = lines(path)
    prefix = f"{path}:" if expected[0].isdigit() else f"{path}: "
    assert rendered == [prefix + expected]


@pytest.mark.parametrize(
    ("text", "position"),
    [("degrees: [\n", "2:1"), ("a: b: c\n", "1:5"), ("tp: 'open\n", "2:1")],
)
def test_syntax_errors_are_located_whichever_parser_reads_them(
    tmp_path: Path, text: str, position: str
) -> None:
    # After the prefix, the words are the parser's: libyaml's and PyYAML's pure-Python
    # parser say the same thing differently.
    path = write(tmp_path, text)
    (rendered,) = lines(path)
    assert rendered.startswith(f"{path}:{position}: YAML syntax: ")


def test_alias_bomb_fails_fast(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = write(tmp_path, "\n".join(levels) + "\n")
    assert lines(path) == [f"{path}:5:5: expands to more than 100000 nodes through aliases"]


def test_huge_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "# " + "x" * (5 * 1024 * 1024) + "\n")
    assert lines(path) == [
        f"{path}: 5242883 bytes, more than the 4 MiB a config may have; this is not a mesh config"
    ]


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"world_size: 8\n\xff\xfe\n")
    assert lines(path) == [f"{path}:2:1: not UTF-8 text"]


def test_missing_file_and_directory_are_source_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"nope\.yaml: cannot read: No such file or directory"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(SourceError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(SourceError, match="cannot load a config from the integer 3"):
        load_config(3)


def test_merge_keys_work_and_are_not_duplicates(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "base: &base\n  tp: 8\n  pp: 2\nparallelism:\n  world_size: 64\n  degrees:\n    <<: *base\n    pp: 4\n",
    )
    config = load_config(path, key="parallelism")
    assert config.resolved_degrees["pp"] == 4 and config.resolved_degrees["tp"] == 8


def test_key_selects_a_block_and_paths_keep_the_prefix(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "model: {dim: 4096}\nparallelism:\n  world_size: 8\n  degrees:\n    tp: 3\n    dp_shard: 2\n",
    )
    assert lines(path, key="parallelism") == [
        f"{path}:5:5: parallelism.degrees.tp: pp(1) * dp_replicate(1) * dp_shard(2) * "
        "cp(1) * tp(3) = 6 != world_size 8"
    ]
    with pytest.raises(SourceError) as caught:
        load_config(path, key="paralelism")
    assert (
        str(caught.value)
        == f"{path}: --key paralelism: no key 'paralelism' (did you mean 'parallelism'?)"
    )


def test_an_override_of_a_meshconf_key_outside_the_block_sets_it_in_the_block(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "model: {dim: 8}\nparallelism:\n  world_size: 8\n  degrees: {tp: 2}\n")
    assert load_config(path, ["degrees.tp=4"], key="parallelism").resolved_degrees["tp"] == 4
    # Its messages name the key in the file's terms, and the override as written.
    assert lines(path, overrides=["degrees.tp=3"], key="parallelism") == [
        "override 'degrees.tp=3': parallelism.degrees.tp: tp(3) leaves no whole number of ranks "
        "for dp_shard (-1 by default): world_size 8 is not divisible by pp(1) * "
        "dp_replicate(1) * cp(1) * tp(3) = 3; tp could be one of 1, 2, 4, 8 (the divisors of 8)"
    ]


def test_plain_override_outside_the_block_must_exist(tmp_path: Path) -> None:
    path = write(tmp_path, "model: {dim: 8}\nparallelism:\n  world_size: 8\n  degrees: {tp: 2}\n")
    with pytest.raises(SourceError) as caught:
        load_config(path, ["modle.dim=4"], key="parallelism")
    assert str(caught.value) == (
        f"override 'modle.dim=4': modle.dim is not in {path} and lies outside the --key "
        "parallelism block; did you mean parallelism.modle.dim=...? (+modle.dim=... adds a "
        "key outside the block)"
    )
    assert (
        load_config(path, ["model.dim=16", "+extra=1"], key="parallelism").resolved_world_size == 8
    )
    assert (
        load_config(path, ["parallelism.degrees.cp=2"], key="parallelism").resolved_degrees["cp"]
        == 2
    )


def test_errors_on_keys_an_override_created_name_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, "world_size: 8\n")
    assert lines(path, overrides=["foo.bar=3"]) == [
        "override 'foo.bar=3': foo: unknown key 'foo'; allowed: world_size, gpus_per_node, "
        "degrees, order, inside_node, levels, inside, derived, domains, runtime, training"
    ]


def test_overrides_apply_before_validation_and_are_named_in_errors(tmp_path: Path) -> None:
    path = write(tmp_path, CONFIG)
    assert load_config(path, ["degrees.tp=2"]).resolved_degrees["tp"] == 2
    assert lines(path, overrides=["degrees.tp=5"]) == [
        "override 'degrees.tp=5': degrees.tp: pp(1) * dp_replicate(2) * dp_shard(2) * cp(1) * "
        "tp(5) = 20 != world_size 8"
    ]
    assert lines(path, overrides=["degrees.tp=yes"])[0].startswith(
        "override 'degrees.tp=yes': degrees.tp: expected an integer"
    )
    config = load_config(
        path, ["~degrees.tp", "++degrees.cp=2", "domains.dense=[pp, dp_replicate, fsdp]"]
    )
    assert config.resolved_degrees["cp"] == 2 and config.layout("dense").shape == (1, 2, 4)


def test_override_grammar_errors(tmp_path: Path) -> None:
    path = write(tmp_path, CONFIG)
    with pytest.raises(SourceError, match=r"override 'degrees.tp': expected key=value"):
        load_config(path, ["degrees.tp"])
    with pytest.raises(SourceError, match=r"degrees.tp already exists; use degrees.tp=\.\.\."):
        load_config(path, ["+degrees.tp=2"])
    with pytest.raises(SourceError, match=r"override '~degrees.pp': degrees.pp does not exist"):
        load_config(path, ["~degrees.pp"])
    with pytest.raises(SourceError, match=r"override 'a..b=1': 'a..b' is not a key path"):
        load_config(path, ["a..b=1"])


def test_delete_with_a_value_deletes_only_that_value(tmp_path: Path) -> None:
    path = write(tmp_path, CONFIG)
    with pytest.raises(SourceError) as caught:
        load_config(path, ["~degrees.tp=4"])
    assert str(caught.value) == "override '~degrees.tp=4': degrees.tp is 3, not 4"
    with pytest.raises(SourceError) as caught:
        load_config(path, ["~degrees.cp=1", "~degrees.dp_shard=1"])
    assert str(caught.value) == "override '~degrees.dp_shard=1': degrees.dp_shard is 2, not 1"
    config = load_config(path, ["~degrees.tp=3", "~degrees.cp=1", "++degrees.pp=2"])
    assert config.degrees.model_fields_set == {"pp", "dp_replicate", "dp_shard"}
    assert config.resolved_degrees["tp"] == 1


def test_delete_reaches_top_level_keys_and_list_items(tmp_path: Path) -> None:
    path = write(
        tmp_path, "world_size: 8\ngpus_per_node: 4\ndomains:\n  dense: [pp, tp, fsdp, cp]\n"
    )
    config = load_config(path, ["~gpus_per_node=4", "~domains.dense[3]=cp"])
    assert config.gpus_per_node is None
    assert config.effective_domains["dense"] == ("pp", "tp", "fsdp")
    with pytest.raises(SourceError) as caught:
        load_config(path, ["~domains.dense[1]=fsdp"])
    assert (
        str(caught.value)
        == "override '~domains.dense[1]=fsdp': domains.dense[1] is 'tp', not 'fsdp'"
    )


def test_a_mapping_override_replaces_the_mapping_and_null_keys_exist() -> None:
    replaced = load_config(
        {"world_size": 8, "degrees": {"dp_replicate": 2, "tp": 2}}, ["degrees={tp: 8}"]
    )
    assert replaced.resolved_degrees["dp_replicate"] == 1 and replaced.resolved_degrees["tp"] == 8
    with pytest.raises(SourceError) as caught:
        load_config({"world_size": 8, "gpus_per_node": None}, ["+gpus_per_node=8"])
    assert str(caught.value) == (
        "override '+gpus_per_node=8': gpus_per_node already exists; use gpus_per_node=... or "
        "++gpus_per_node=... to change it"
    )
    assert load_config({"world_size": 8, "gpus_per_node": None}, ["~gpus_per_node"]).world_size == 8


def test_an_override_value_that_is_not_yaml_is_named() -> None:
    # After the prefix, the words are the parser's: libyaml's and PyYAML's pure-Python
    # parser say the same thing differently.
    with pytest.raises(SourceError) as caught:
        load_config({"world_size": 8}, ["degrees.tp=[1,"])
    assert str(caught.value).startswith("override 'degrees.tp=[1,': YAML syntax: ")


def test_parsed_overrides_keep_their_action_path_and_value() -> None:
    assert parse_override("~domains.dense[2]=fsdp") == Override(
        "~domains.dense[2]=fsdp", "delete", ("domains", "dense", 2), "fsdp", True
    )
    assert parse_override("~degrees.tp") == Override(
        "~degrees.tp", "delete", ("degrees", "tp"), None, False
    )
    assert parse_override("++degrees.cp=2") == Override(
        "++degrees.cp=2", "force", ("degrees", "cp"), 2, True
    )
    assert parse_override("+gpus_per_node=8") == Override(
        "+gpus_per_node=8", "add", ("gpus_per_node",), 8, True
    )
    assert parse_override("~domains.dense.2") == Override(
        "~domains.dense.2", "delete", ("domains", "dense", 2), None, False
    )
    assert parse_override("domains.dense=[pp, tp]") == Override(
        "domains.dense=[pp, tp]", "set", ("domains", "dense"), ["pp", "tp"], True
    )


def test_interpolation_resolves_through_omegaconf(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cluster: {nodes: 4, gpus: 8}\nmesh:\n  world_size: 32\n  gpus_per_node: ${cluster.gpus}\n  degrees: {tp: '${cluster.gpus}'}\n",
    )
    config = load_config(path, key="mesh")
    assert config.gpus_per_node == 8 and config.resolved_degrees["tp"] == 8
    broken = write(tmp_path, "world_size: ${nope}\n", "broken.yaml")
    assert lines(broken) == [
        f"{broken}:1:1: world_size: cannot resolve: Interpolation key 'nope' not found"
    ]


def test_mapping_and_dictconfig_sources() -> None:
    from omegaconf import OmegaConf

    data = {"world_size": 16, "degrees": {"tp": 4}}
    assert load_config(data).resolved_degrees["dp_shard"] == 4
    assert data == {"world_size": 16, "degrees": {"tp": 4}}
    node = OmegaConf.create({"size": 16, "mesh": {"world_size": "${size}", "degrees": {"tp": 4}}})
    assert load_config(node, key="mesh").resolved_world_size == 16
    assert load_config(node.mesh).resolved_world_size == 16


@pytest.mark.slow  # starts a Python process
def test_pure_python_yaml_fallback_behaves_the_same(tmp_path: Path) -> None:
    """Without libyaml, PyYAML's pure-Python parser gives the same results and positions."""
    import subprocess
    import sys

    good = write(tmp_path, "world_size: 8\ndegrees: {tp: 2}\n", "good.yaml")
    duplicate = write(tmp_path, "degrees:\n  tp: 2\n  tp: 4\n", "dup.yaml")
    deep = write(tmp_path, "a: " + "[" * 100_000 + "]" * 100_000 + "\n", "deep.yaml")
    code = f"""
import sys
sys.modules["yaml._yaml"] = None  # hide libyaml
import yaml
from meshconf import ConfigError, load_config
assert not yaml.__with_libyaml__
print(load_config({str(good)!r}).resolved_world_size)
for path in ({str(duplicate)!r}, {str(deep)!r}):
    try:
        load_config(path)
    except ConfigError as error:
        print(error)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "8",
        f"{duplicate}:3:3: degrees.tp: duplicate key (first given at line 2)",
        f"{deep}:1:67: nested deeper than 64 levels",
    ]
