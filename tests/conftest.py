from __future__ import annotations

import contextlib
import io
import os
import resource
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

# MESHCONF_TEST_YAML=pure hides libyaml before anything imports PyYAML, so that the tests read
# YAML with PyYAML's pure-Python parser, as a user without libyaml does (.ci/run's
# compatibility stage; tests/test_yaml_releases.py checks which parser is in use).
if os.environ.get("MESHCONF_TEST_YAML") == "pure":
    sys.modules["yaml._yaml"] = None  # type: ignore[assignment]

import forkserver
import pytest
from _pytest.mark.expression import Expression

from meshconf.cli import main

REPO = Path(__file__).resolve().parent.parent

#: The textbook seed's exercise: 256 GPUs (32 nodes of 8) as dp=8, pp=4, tp=8, outer to inner.
TEXTBOOK = """\
# The textbook's exercise: 256 GPUs as dp=8, pp=4, tp=8, outer to inner.
world_size: 256
gpus_per_node: 8
degrees: {dp_replicate: 8, pp: 4, tp: 8, dp_shard: 1}
domains:
  textbook: [dp_replicate, pp, tp]
"""


#: Test modules that start other processes or tools (torchrun, pre-commit, mypy, pip, the
#: docs' commands): `pytest -m "not slow"` leaves them out for a quick signal, and `pytest`
#: runs them.
SLOW_MODULES = frozenset(
    {
        "test_benchmarks_smoke",
        "test_code_quality",
        "test_compat_d9d",
        "test_compat_torchtitan",
        "test_compat_torchtitan_v0_2",
        "test_convert_to_megatron",
        "test_cuda",
        "test_docs",
        "test_fuzz",
        "test_fuzz_api",
        "test_fuzz_surfaces",
        "test_layers",
        "test_measure",
        "test_order_runtime",
        "test_plan_activations",
        "test_plan_dualpipe",
        "test_plan_fsdp_memory",
        "test_plan_memory_gloo",
        "test_plan_norms_latent_swiglu",
        "test_plan_pipeline_gloo",
        "test_plan_precision",
        "test_plan_schedule",
        "test_plan_sequence_parallel",
        "test_precommit",
        "test_runtime_failures",
        "test_runtime_gloo",
        "test_runtime_oracle",
        "test_runtime_placement",
        "test_runtime_single",
        "test_runtime_training",
        "test_simulation_bounds",
        "test_wheel",
    }
)


#: Test modules that fork ranks of real process groups. Under pytest-xdist (``-n``) they run
#: one after another on one worker: two 8-rank worlds at once on two cores would leave each
#: too little of the time bounds their set-up checks test. The set-up failure tests, which
#: spend their time waiting for a bound, form a group of their own.
RANK_MODULES = frozenset(
    {
        "test_compat_d9d",
        "test_compat_torchtitan",
        "test_compat_torchtitan_v0_2",
        "test_convert_to_megatron",
        "test_order_runtime",
        "test_plan_memory_gloo",
        "test_plan_pipeline_gloo",
        "test_runtime_failures",
        "test_runtime_gloo",
        "test_runtime_oracle",
        "test_runtime_placement",
        "test_runtime_single",
        "test_runtime_training",
    }
)


#: The tests that import a library meshconf hands meshes to (tests/peers), which the dev
#: environment leaves out: .ci/run's peers stage installs them and sets MESHCONF_PEER_TESTS.
collect_ignore = [] if os.environ.get("MESHCONF_PEER_TESTS") == "1" else ["peers"]


#: What a mutant's tests may take beyond what the process holds when they start: a mutant
#: of the formula parser once grew a run past 13 GB (CONTRIBUTING.md, "Mutation testing").
MUTANT_MEMORY_MIB = 1024


def pytest_configure(config: pytest.Config) -> None:
    """Under mutmut, which names the mutant in ``MUTANT_UNDER_TEST`` in the process it forks
    to run that mutant's tests, bound that process's address space: a mutant that makes a
    loop allocate without end then fails its tests with a MemoryError, as the fuzz tests
    bound theirs, instead of taking the machine down. mutmut's own runs (``stats``, ``fail``)
    are left alone."""
    if "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
        limit = size * 1024 + MUTANT_MEMORY_MIB * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # pytest-xdist's hook, when it is loaded
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a worker per core, and one more, which the set-up failure tests hold for
    about two minutes mostly waiting for their bounds while the others compute.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still chooses, as pytest-xdist reads it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


#: Test modules whose tests share what one worker set up (a fork server that imported torch,
#: a tracked run of a model): under ``-n`` they run on that one worker, which sets it up once.
SHARED_SETUP = {
    "test_measure": "torch_server",
    "test_plan_sequence_parallel": "torch_server",
    "test_plan_activations": "tracked_runs",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if item.path.stem in RANK_MODULES:
            # The set-up failure tests mostly wait for their bound: beside the others.
            group = "failures" if item.path.stem == "test_runtime_failures" else "ranks"
            item.add_marker(pytest.mark.xdist_group(group))
        if item.path.stem == "test_docs":
            # One worker runs every page: the first page's test starts them all (tests/test_docs.py).
            item.add_marker(pytest.mark.xdist_group("docs"))
        shared = SHARED_SETUP.get(item.path.stem)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(shared))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``-n`` with ``--dist loadgroup``, refuse to run if pytest-xdist could not mark the
    groups (it appends ``@group`` to node ids; a pytest release changed where they are kept)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests (such as {lost[0]}): this pair of "
            "pytest and pytest-xdist releases cannot run them under --dist loadgroup"
        )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out a slow module when ``-m`` deselects every slow test: importing it (torch,
    Megatron) costs seconds that its deselected tests would not use."""
    if collection_path.stem not in SLOW_MODULES or not config.option.markexpr:
        return None
    selects_slow = Expression.compile(config.option.markexpr).evaluate(lambda name: name == "slow")
    return True if not selects_slow else None


def run_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run ``meshconf ARGS`` through ``main(argv)`` in this process, with warnings as errors,
    and return what a subprocess would: the exit code and the text of stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("error")
            try:
                code = main(list(args))
            except SystemExit as exit:  # argparse: usage errors, --help, --version
                code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())


def run_in_subprocess(
    *args: str, cwd: Path = REPO, address_space: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m meshconf ARGS`` as a user would; ``address_space``: under that limit
    in bytes (``RLIMIT_AS``, what ``ulimit -v`` sets)."""

    def limit() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "PYTHONWARNINGS": "error"}
    result = subprocess.run(
        [sys.executable, "-m", "meshconf", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=limit,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


#: The verbs ``run_cli`` runs in a process of their own.
OWN_PROCESS_VERBS = ("simulate", "measure")


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``meshconf ARGS``: in this process, except ``simulate`` and ``measure``, which
    start torch's (fake) default process group, and a process holds only one."""

    def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
        if args and args[0] in OWN_PROCESS_VERBS:
            return run_in_subprocess(*args, cwd=cwd)
        return run_in_process(*args, cwd=cwd)

    return run


@pytest.fixture(scope="session")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The socket of a fork server (tests/forkserver.py) that imported torch, the runtime and
    tests/measure_builds.py once: ``meshconf measure`` commands and the probes that run in a
    process of their own start there in a fraction of a second, not six."""
    preload = (*forkserver.TORCH_MODULES, "meshconf.runtime.step_memory", "measure_builds")
    with forkserver.serving(tmp_path_factory.mktemp("torch-server"), preload) as socket_path:
        yield socket_path
