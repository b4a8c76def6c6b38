"""``meshconf simulate`` is bounded by the work it is asked for (ranks times the world) and by
the memory the machine has, and says so with figures; a million ranks build from the command
line. The memory limits are real ones (``RLIMIT_AS``, what ``ulimit -v`` sets) in a child
process; the world of 2**20 is torch's fake process group, as ``simulate`` always is."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given, strategies as st

from meshconf.core.errors import MeshconfError
from meshconf.features.simulation import (
    MAX_SIMULATED_WORK,
    MAX_SIMULATED_WORLD,
    RANK_SET_UP_COST,
    check_simulation_size,
)
from tests.conftest import run_in_subprocess


@given(
    world_size=st.integers(1, 2**31 - 1) | st.integers(1, 2**23),
    rank_count=st.integers(1, 5000) | st.integers(1, 20),
)
def test_a_simulation_is_refused_exactly_when_its_work_is_over_the_bound(
    world_size: int, rank_count: int
) -> None:
    work = rank_count * max(world_size, RANK_SET_UP_COST)
    try:
        check_simulation_size(world_size, rank_count)
    except MeshconfError as error:
        message = str(error)
        assert world_size > MAX_SIMULATED_WORLD or work > MAX_SIMULATED_WORK
        if world_size > MAX_SIMULATED_WORLD:
            assert message.startswith(f"simulate builds worlds of up to {MAX_SIMULATED_WORLD}")
            return
        most = int(re.search(r"at most (\d+) ranks?", message).group(1))  # type: ignore[union-attr]
        # The largest number of ranks the command does build, as the message says.
        assert most * max(world_size, RANK_SET_UP_COST) <= MAX_SIMULATED_WORK
        assert (most + 1) * max(world_size, RANK_SET_UP_COST) > MAX_SIMULATED_WORK
    else:
        assert world_size <= MAX_SIMULATED_WORLD and work <= MAX_SIMULATED_WORK


def test_too_many_ranks_of_a_large_world_are_refused_before_torch_loads(run_cli) -> None:  # type: ignore[no-untyped-def]
    ranks = ",".join(str(rank) for rank in range(17))
    result = run_cli(
        "simulate", "examples/world_size_from_launcher.yaml", "--world-size", "1048576",
        "--rank", ranks,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: 17 ranks of a world of 1048576 are more than one simulate builds: "
        "each rank builds meshes over the whole world, and one command builds at most 16 ranks "
        "of this world; simulate fewer ranks at once\n"
    )
    result = run_cli("simulate", "examples/llama3_70b_512gpu.yaml", "--rank", "0", "--rank", "1")
    assert result.returncode == 0


def test_a_world_over_the_largest_is_refused_with_its_size(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "w.yaml").write_text("world_size: 4194305\n")
    result = run_cli("simulate", str(tmp_path / "w.yaml"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: simulate builds worlds of up to 4194304 ranks, and this one has "
        "4194305: torch's meshes and groups hold every rank, about 384 bytes each; "
        "`meshconf show` checks the layout of any world size\n"
    )


def test_a_million_ranks_from_the_command_line() -> None:
    """Both ends of a world of 2**20 (torch's fake process group): every group equals the
    rank arithmetic, and the first line says what the world needs."""
    result = _simulate_under_limit(
        None, "--world-size", "1048576", "--rank", "0,1048575", "-o", "degrees.pp=4"
    )
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert re.fullmatch(
        r"simulated ranks 0, 1048575 of 1048576 against torch's fake process group: 4 domains "
        r"each, built in \d+\.\d{3} s, needing about 384 MiB for a world of this size",
        first,
    )
    assert rest[:4] == [
        "  dataloading [pp=4, batch=32768, cp=1, tp=8]: groups ok",
        "  dense [pp=4, dp_replicate=1, fsdp=32768, tp=8]: groups ok",
        "  sparse [pp=4, dp_replicate=1, efsdp=262144, ep=1, etp=1]: groups ok",
        "  loss [pp=4, loss=32768, tp=8]: groups ok",
    ]
    assert rest[-1] == (
        "every group and local rank equals the rank arithmetic of the degrees, computed apart "
        "from the layouts"
    )


def test_a_world_larger_than_the_memory_left_is_refused_with_both_figures() -> None:
    # The limit leaves about 200 MiB above what the process holds once torch is loaded.
    loaded = subprocess.run(
        [sys.executable, "-c", "import meshconf.runtime, re; "
         "print(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    limit = (int(loaded.stdout) + 200 * 1024) * 1024
    result = _simulate_under_limit(limit, "--world-size", "1048576")
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(
        r"meshconf: error: a simulated rank of a world of 1048576 needs about 384 MiB for its "
        r"meshes and groups, and this process's address-space limit \(ulimit -v\) leaves "
        r"(\d+) MiB; `meshconf show` checks the layout of any world size\n",
        result.stderr,
    )
    left = int(re.search(r"leaves (\d+) MiB", result.stderr).group(1))  # type: ignore[union-attr]
    assert 150 <= left <= 250


def test_torch_that_cannot_load_under_a_memory_limit_is_one_line() -> None:
    """What fails first depends on the torch build (a library that cannot be mapped, or a
    bare MemoryError); the line names it and the limit."""
    result = _simulate_under_limit(300 << 20, "--world-size", "16")
    assert (result.returncode, result.stdout) == (2, "")
    assert re.fullmatch(
        r"meshconf: error: torch is installed but could not be loaded: "
        r"(MemoryError|ImportError: [^\n]+); this process may use 300 MiB of address space "
        r"\(ulimit -v\), which may be less than torch needs to load\n",
        result.stderr,
    ), result.stderr


def _simulate_under_limit(limit: int | None, *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_subprocess(
        "simulate", "examples/world_size_from_launcher.yaml", *args, address_space=limit
    )
