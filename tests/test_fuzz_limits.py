"""The exact message at each limit the fuzz suites probe, and the error family.

tests/test_fuzz.py and tests/test_fuzz_api.py check that no generated input escapes the
limits; these tests pin down what a user reads at each one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import meshconf
from meshconf import ConfigError, MeshconfError, SourceError, load_config
from meshconf.core.errors import MAX_PROBLEMS, Diagnostic
from meshconf.core.formulas import FormulaError
from meshconf.core.layout import LayoutError
from meshconf.core.messages import shorten
from meshconf.features.plan.request import PlanError, Request, assignment_count
from meshconf.sources.overrides import InterpolationError
from meshconf.sources.yaml_reader import YamlError


def lines(tmp_path: Path, text: str, *overrides: str) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    prefix = f"{path}"
    return [d.render().replace(prefix, "c.yaml") for d in caught.value.diagnostics]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "degrees:\n  tp: !!int abc\n",
            "c.yaml:2:7: !!int needs an integer such as 8, 0x10 or 0o10, got 'abc'",
        ),
        (
            "degrees:\n  tp: !!int 0b10\n",
            "c.yaml:2:7: !!int needs an integer such as 8, 0x10 or 0o10, got '0b10'",
        ),
        (
            "degrees:\n  tp: !!float abc\n",
            "c.yaml:2:7: !!float needs a number such as 1.5, 2e3 or .inf, got 'abc'",
        ),
        ("degrees:\n  tp: !!bool maybe\n", "c.yaml:2:7: !!bool needs true or false, got 'maybe'"),
        (
            "degrees:\n  tp: !!timestamp garbage\n",
            "c.yaml:2:7: !!timestamp is not supported; no meshconf key holds a date",
        ),
        ("!!int abc: 1\n", "c.yaml:1:1: !!int needs an integer such as 8, 0x10 or 0o10, got 'abc'"),
        (
            "domains:\n  d: !!set {tp, dp_shard, pp}\n",
            "c.yaml:2:6: a !!set has no order, and where order matters the layout would depend on the hash seed; write a list such as [pp, tp]",
        ),
        (
            "a: ${world_size}\nworld_size: 8\n? null\n: 3\n",
            "c.yaml:3:3: a key must be a name, not null",
        ),
        ("world_size: 8\x00\n", "c.yaml:1:14: character U+0000 is not allowed in YAML"),
        ("world_size: 8 \ufffe\n", "c.yaml:1:15: character U+FFFE is not allowed in YAML"),
        (
            "world_size: " + "${oc.select:" * 3000 + "x" + ",1}" * 3000 + "\nx: 8\n",
            "c.yaml:1:1: world_size: interpolations nested deeper than 16",
        ),
        (
            "world_size: 8\nc0: 8\n" + "".join(f"c{i}: ${{c{i - 1}}}\n" for i in range(1, 100)),
            "c.yaml:35:1: c33: more than 32 ${...} references in a chain (this value names a value that names a value ...)",
        ),
    ],
)
def test_one_located_line(tmp_path: Path, text: str, expected: str) -> None:
    assert lines(tmp_path, text) == [expected]


def test_interpolation_bomb_in_a_file_and_in_overrides(tmp_path: Path) -> None:
    bomb = ["a0: xxxxxxxx"] + [
        f"a{level}: [" + ", ".join([f'"${{a{level - 1}}}"'] * 10) + "]" for level in range(1, 9)
    ]
    assert lines(tmp_path, "world_size: 8\n" + "\n".join(bomb) + "\n") == [
        "c.yaml:6:1: a4: resolving takes more than 2000 ${...} evaluations (a value is resolved again wherever it is named)"
    ]
    overrides = ["++" + line.replace(": ", "=", 1) for line in bomb]
    assert lines(tmp_path, "world_size: 8\n", *overrides) == [
        f"override '{overrides[4]}': a4: resolving takes more than 2000 ${{...}} evaluations (a value is resolved again wherever it is named)"
    ]


def test_an_override_nesting_interpolations_too_deep_is_refused_before_omegaconf_parses_it(
    tmp_path: Path,
) -> None:
    """OmegaConf parses an override's value when it sets it, and recurses without bound."""
    nested = "${oc.select:" * 3000 + "x" + ",1}" * 3000
    for override in (f"++deep={nested}", f"world_size={nested}"):
        found = lines(tmp_path, "world_size: 8\n", override)
        (line,) = found
        assert line.startswith(
            f"c.yaml:1:1: interpolations nested deeper than 16 (with overrides: {override[:40]}"
        ), line


def test_override_key_paths_deeper_than_configs_nest() -> None:
    key = ".".join(["a"] * 5000)
    with pytest.raises(SourceError) as caught:
        load_config({"world_size": 8}, [f"++{key}=1"])
    assert str(caught.value) == (
        f"override {shorten(f'++{key}=1')!r}: a key path of 5000 parts; configs nest at most 64"
    )


def test_environment_integer_past_30_digits_stays_a_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESHCONF_WORLD", "1" * 100_000)
    assert lines(tmp_path, "world_size: ${oc.env:MESHCONF_WORLD}\n") == [
        "c.yaml:1:1: world_size: expected an integer >= 1, got the string "
        "'1111111111111111111111111111111111111...' (resolved from ${oc.env:MESHCONF_WORLD})"
    ]


def test_problems_are_capped_with_a_count(tmp_path: Path) -> None:
    formulas = "".join(f"  x{i}: unknown{i} * tp\n" for i in range(3000))
    found = lines(tmp_path, "world_size: 8\nderived:\n" + formulas)
    assert len(found) == MAX_PROBLEMS + 1
    assert found[0] == (
        "c.yaml:3:3: derived.x0: 'unknown0 * tp' uses unknown name 'unknown0'; a formula may use "
        "the degrees and the derived dims defined before it: pp, dp_replicate, dp_shard, cp, tp, "
        "ep, etp, batch, fsdp, loss, efsdp"
    )
    assert found[-1] == "c.yaml: 2950 more problems not shown (at most 50 are reported per config)"


def test_unknown_dims_list_twenty_names(tmp_path: Path) -> None:
    derived = "".join(f"  y{i}: tp\n" for i in range(30))
    found = lines(tmp_path, f"world_size: 8\nderived:\n{derived}domains:\n  d: [zz]\n")
    assert found == [
        "c.yaml:34:7: domains.d[0]: unknown dim 'zz'; dims are the degrees and the derived dims: "
        "pp, dp_replicate, dp_shard, cp, tp, ep, etp, batch, fsdp, loss, efsdp, y0, y1, y2, y3, "
        "y4, y5, y6, y7, y8 and 21 more"
    ]


def test_file_names_with_line_breaks_stay_on_one_line() -> None:
    diagnostic = Diagnostic(("a",), "bad\nvalue", "x\ny.yaml", 1, 2)
    assert diagnostic.render() == "x\\ny.yaml:1:2: a: bad\\nvalue"


def test_mappings_that_contain_themselves_or_nest_deeply() -> None:
    config: dict[str, object] = {"world_size": 8}
    config["x"] = config
    with pytest.raises(ConfigError, match=r"^x: contains itself$"):
        load_config(config)
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(100_000):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"nested deeper than 64 levels$"):
        load_config(deep)
    with pytest.raises(ConfigError, match=r"^domains\.d: a set has no order; give a list$"):
        load_config({"world_size": 8, "domains": {"d": {"tp", "pp"}}})


@pytest.mark.parametrize(
    "error",
    [
        ConfigError([]),
        SourceError("x"),
        YamlError("x"),
        InterpolationError("", "x"),
        FormulaError("x"),
        LayoutError("x"),
        PlanError("x"),
        meshconf.InvalidArgumentError("x"),
    ],
)
def test_every_deliberate_error_is_a_meshconf_error_and_a_value_error(error: Exception) -> None:
    assert isinstance(error, MeshconfError)
    assert isinstance(error, (ValueError, SourceError))


def test_unknown_domain_is_a_key_error_and_a_value_error() -> None:
    config = load_config({"world_size": 8})
    for kind in (KeyError, ValueError, MeshconfError):
        with pytest.raises(kind) as caught:
            config.layout("dens")
        assert (
            str(caught.value)
            == "unknown domain 'dens'; domains are dataloading, dense, sparse, loss"
        )


def test_plan_counts_before_listing() -> None:
    assert assignment_count(Request(world_size=720, gpus_per_node=None, pins={})) == 5250
    assert assignment_count(Request(world_size=2095133040, gpus_per_node=None, pins={})) == 76562500


def test_show_json_caps_groups_and_counts_them(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "w.yaml").write_text("world_size: 2147483647\n")
    result = run_cli("show", str(tmp_path / "w.yaml"), "--format", "json", "--domain", "dense")
    assert result.returncode == 0
    dims = {dim["name"]: dim for dim in json.loads(result.stdout)["domains"]["dense"]["dims"]}
    assert dims["fsdp"]["group"] == list(range(4096))
    assert (dims["fsdp"]["group_size"], dims["fsdp"]["group_last"]) == (2147483647, 2147483646)
    result = run_cli("show", str(tmp_path / "w.yaml"), "--full-groups")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --full-groups: a group of 2147483647 ranks is more than the 1048576 it "
        "lists; leave the option out to see each group's first ranks and size\n"
    )


def test_simulate_and_plan_refuse_what_they_cannot_bound(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "w.yaml").write_text("world_size: 16777216\n")
    result = run_cli("simulate", str(tmp_path / "w.yaml"))
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: simulate builds worlds of up to 4194304 ranks, and this one has "
        "16777216: torch's meshes and groups hold every rank, about 384 bytes each; "
        "`meshconf show` checks the layout of any world size\n"
    )
    result = run_cli("plan", "--world-size", "2095133040")
    assert result.returncode == 2
    assert result.stderr == (
        "meshconf: error: --world-size 2095133040 splits into 76562500 assignments of pp, "
        "dp_replicate, dp_shard, cp and tp, more than the 1000000 a plan ranks; pin a degree "
        "(such as --tp 8) to narrow them\n"
    )


def test_plan_with_a_model_estimates_a_bounded_number_of_rows(run_cli) -> None:  # type: ignore[no-untyped-def]
    """720,720 has 89,600 assignments with cp 1: ranked in about a second, but estimated in
    about ten, so with a model a pin is asked for; memory does not grow with the rows."""
    args = ["plan", "--world-size", "720720", "--gpus-per-node", "8", "--model", "llama3-8b"]
    result = run_cli(*args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: --world-size 720720 with a model has 89600 assignments to estimate, "
        "more than the 5000 a plan estimates; pin a degree (such as --tp 8) to narrow them\n"
    )
    pinned = run_cli(*args, "--tp", "8", "--limit", "1")
    assert pinned.returncode == 0, pinned.stderr
    # of its 1458 assignments, those of more pipeline stages than the model's 32 layers are
    # no rows
    lines = pinned.stdout.splitlines()
    assert lines[3].startswith("656 valid assignments; ")
    assert lines[4] == "802 left out: pp cannot split llama3-8b's 32 layers"


def test_a_failed_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshconf.cli import common

    out = tmp_path / "out.svg"
    out.write_text("old")

    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(common.os, "fsync", broken)
    with pytest.raises(OSError, match="No space left on device"):
        common.write_file(str(out), "new")
    assert out.read_text() == "old"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.svg"]
