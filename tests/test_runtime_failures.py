"""Set-up failures on 8 real processes (gloo, forked): every rank ends within
``runtime.setup_timeout_s`` (a short one here) with a meshconf error that says what went wrong
and on which rank; ranks asking for meshes in different orders get correct meshes (eager
build) or an error naming what each rank was creating (lazy build)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed import Ending, run_ranks, run_ranks_apart

from meshconf import ConfigError, DistributedContext, MeshconfError, load_config
from meshconf.runtime import (
    CreationOrderError,
    RankFailedError,
    RuntimeSetupError,
    SetupTimeoutError,
    all_reduce,
)

# Long enough for 8 forked ranks to start on two busy cores; short enough for a test.
BOUND_S = 10
# Forked ranks on two shared cores start and import within a few seconds of each other.
SLACK_S = 8
CONFIG: dict[str, Any] = {
    "world_size": 8,
    "degrees": {"dp_shard": 2, "tp": 2, "cp": 2},
    "runtime": {"setup_timeout_s": BOUND_S},
}


def _expect(call: Any, error: type[Exception], message: str, bound: float) -> None:
    start = time.monotonic()
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message
    assert time.monotonic() - start < bound + SLACK_S
    assert not dist.is_initialized()


def _ask_in_rank_order(rank: int, environ: dict[str, str], build: str) -> None:
    # Rank 0 logs the loss first; the others set up the model first.
    order = ["loss", "dense", "dataloading"] if rank == 0 else ["dense", "dataloading", "loss"]
    # The loss group {0, 2, 4, 6} is none of dense's groups, so the order matters to torch.
    degrees = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
    config = load_config(
        {**CONFIG, "degrees": degrees, "runtime": {**CONFIG["runtime"], "build": build}}
    )
    start = time.monotonic()
    if build == "eager":
        with DistributedContext(config, environ=environ) as ctx:
            meshes = {domain: ctx.mesh_for(domain) for domain in order}
            # The collectives themselves must run in one order on every rank.
            for domain in sorted(meshes):
                mesh = meshes[domain]
                for dim in ctx.config.layout(domain).dim_names:
                    group = mesh.get_group(dim)
                    members = dist.get_process_group_ranks(group)
                    total = all_reduce(torch.tensor([float(rank)]), "sum", mesh[dim])
                    assert total.item() == sum(members), (domain, dim)
        assert time.monotonic() - start < 60
        return
    ctx: DistributedContext | None = None
    try:
        # a rank still setting up when another has found the orders differ learns it there
        with pytest.raises((CreationOrderError, RankFailedError)) as caught:
            ctx = DistributedContext(config, environ=environ)
            for domain in order:
                ctx.mesh_for(domain)
    finally:
        if ctx is not None:
            ctx.close()
    message = str(caught.value)
    assert message.startswith("ranks asked for meshes in different orders: rank "), message
    assert " was creating loss/" in message and " was creating dense/" in message, message
    assert "/default_pg" not in message
    assert time.monotonic() - start < 60


def test_ranks_asking_in_different_orders_get_correct_meshes_with_the_eager_build() -> None:
    run_ranks(_ask_in_rank_order, 8, "eager")


def test_ranks_asking_in_different_orders_fail_fast_with_the_lazy_build() -> None:
    run_ranks(_ask_in_rank_order, 8, "lazy")


def _one_rank_has_another_world_size(rank: int, environ: dict[str, str]) -> None:
    degrees = {"dp_shard": 4, "tp": 2, "cp": 2}
    config = load_config({**CONFIG, "world_size": 16, "degrees": degrees} if rank == 3 else CONFIG)
    message = "world_size: the config says 16, but torchrun started 8 ranks"
    if rank == 3:
        _expect(lambda: DistributedContext(config, environ=environ), MeshconfError, message, 1)
    else:
        _expect(
            lambda: DistributedContext(config, environ=environ),
            RankFailedError,
            f"rank 3 could not set up: {message}",
            BOUND_S,
        )


def test_a_rank_with_another_world_size_is_quoted_on_every_rank() -> None:
    run_ranks(_one_rank_has_another_world_size, 8)


def _one_rank_cannot_load(rank: int, environ: dict[str, str], directory: str) -> None:
    good, bad = Path(directory, "good.yaml"), Path(directory, "bad.yaml")
    problem = (
        f"{bad}:4:3: degrees.tp: tp(3) leaves no whole number of ranks for dp_shard (-1 by "
        "default): world_size 8 is not divisible by pp(1) * dp_replicate(1) * cp(1) * tp(3) = 3; "
        "tp could be one of 1, 2, 4, 8 (the divisors of 8)"
    )
    if rank == 3:
        _expect(lambda: DistributedContext.from_yaml(bad, environ=environ), ConfigError, problem, 1)
    else:
        _expect(
            lambda: DistributedContext.from_yaml(good, environ=environ),
            RankFailedError,
            f"rank 3 could not load the config: {problem}",
            BOUND_S,
        )


def test_a_rank_with_an_invalid_config_is_quoted_on_every_rank(tmp_path: Path) -> None:
    text = f"world_size: 8\nruntime: {{setup_timeout_s: {BOUND_S}}}\ndegrees:\n  tp: "
    (tmp_path / "good.yaml").write_text(text + "2\n")
    (tmp_path / "bad.yaml").write_text(text + "3\n")
    run_ranks(_one_rank_cannot_load, 8, str(tmp_path))


def _different_configs(rank: int, environ: dict[str, str]) -> None:
    config = load_config({**CONFIG, "degrees": {"tp": 4 if rank == 6 else 2}})
    # The context takes the node size from LOCAL_WORLD_SIZE (8) before comparing.
    fingerprints = {
        r: load_config(
            {**CONFIG, "gpus_per_node": 8, "degrees": {"tp": 4 if r == 6 else 2}}
        ).fingerprint[:12]
        for r in (0, 6)
    }
    message = (
        f"rank 6 loaded another config than rank 0 (fingerprints {fingerprints[6]} and "
        f"{fingerprints[0]}); every rank must read the same file with the same overrides"
    )
    error = RuntimeSetupError if rank == 6 else RankFailedError
    _expect(lambda: DistributedContext(config, environ=environ), error, message, BOUND_S)


def test_a_rank_with_another_config_is_quoted_on_every_rank() -> None:
    run_ranks(_different_configs, 8)


def _rank_never_starts(rank: int, environ: dict[str, str], absent: int) -> None:
    if rank == absent:
        return
    config = load_config(CONFIG)
    _expect(
        lambda: DistributedContext(config, environ=environ),
        SetupTimeoutError,
        f"rank {absent} did not join within {BOUND_S} s (runtime.setup_timeout_s): did every "
        "rank start?",
        BOUND_S,
    )


@pytest.mark.parametrize("absent", [5, 0])
def test_a_rank_that_never_starts_is_named(absent: int) -> None:
    run_ranks(_rank_never_starts, 8, absent)


def _rank_0_hosting_the_store_never_starts(rank: int, environ: dict[str, str]) -> None:
    if rank == 0:
        return
    _expect(
        lambda: DistributedContext(load_config(CONFIG), environ=environ),
        SetupTimeoutError,
        f"rank 0 did not start within {BOUND_S} s, or stopped: no rendezvous store answered at "
        f"127.0.0.1:{environ['MASTER_PORT']} (runtime.setup_timeout_s; are MASTER_ADDR and "
        "MASTER_PORT those of rank 0, with no other program listening there?)",
        BOUND_S,
    )


def test_rank_0_that_should_host_the_store_and_never_starts_is_named() -> None:
    run_ranks(_rank_0_hosting_the_store_never_starts, 8, store="absent")


LATE_S = 5


def _one_rank_arrives_late(rank: int, environ: dict[str, str]) -> None:
    if rank == 3:
        time.sleep(LATE_S)
    degrees = {"dp_shard": 2, "tp": 2}
    config = load_config({"world_size": 4, "degrees": degrees, "runtime": {"setup_timeout_s": 60}})
    with DistributedContext(config, environ=environ) as ctx:
        tp = ctx.get_mesh("tp")
        total = all_reduce(torch.tensor([float(rank)]), "sum", tp)
        assert total.item() == sum(dist.get_process_group_ranks(tp.get_group()))
        assert ctx.get_mesh("fsdp").size() == 2


def test_ranks_waiting_for_a_late_rank_log_nothing(tmp_path: Path) -> None:
    """The three ranks that wait 5 s for the fourth print nothing while they wait: no line of
    torch's on any rank's standard error, and every rank builds its meshes."""
    run_ranks(_one_rank_arrives_late, 4, stderr_dir=str(tmp_path))
    logs = {path.name: path.read_text() for path in sorted(tmp_path.glob("rank*.stderr"))}
    assert logs == {f"rank{rank}.stderr": "" for rank in range(4)}


# --- The launcher's environment and faults, on 4 ranks (tests/distributed.run_ranks_apart) ---

FAULT_BOUND_S = 8
FAULT_CONFIG: dict[str, Any] = {
    "world_size": 4,
    "degrees": {"dp_shard": 2, "tp": 2},
    "runtime": {"setup_timeout_s": FAULT_BOUND_S},
}


def _set_up_with(rank: int, environ: dict[str, str], changes: dict[int, dict[str, str]]) -> None:
    environ.update(changes.get(rank, {}))
    with DistributedContext(load_config(FAULT_CONFIG), environ=environ):
        pass


def _assert_ended(endings: dict[int, Ending], expected: dict[int, tuple[str, str]]) -> None:
    """Each rank ended with the error class and message given (a message ending in ``*``
    is a prefix), within the bound and a few seconds."""
    for rank, (how, message) in expected.items():
        ending = endings[rank]
        assert ending.how == how, (rank, ending)
        if message.endswith("*"):
            assert ending.message.startswith(message[:-1]), (rank, ending)
        else:
            assert ending.message == message, (rank, ending)
        assert ending.seconds < FAULT_BOUND_S + SLACK_S, (rank, ending)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"RANK": "4"}, "a rank has RANK=4, outside WORLD_SIZE=4 (torchrun)"),
        (
            {"LOCAL_WORLD_SIZE": "0"},
            "rank 3 has LOCAL_WORLD_SIZE=0 (torchrun): a node runs at least one process",
        ),
        (
            {"LOCAL_RANK": "-1"},
            "rank 3 has LOCAL_RANK=-1, which is not an integer from 0 to 2147483647",
        ),
        (
            {"WORLD_SIZE": "9" * 5000},
            "rank 3 has WORLD_SIZE=99999999999999999... (5,000 characters), which is not an "
            "integer from 0 to 2147483647",
        ),
    ],
    ids=["rank-outside", "node-of-0", "negative-local-rank", "5000-digit-world"],
)
@pytest.mark.parametrize("store", ["agent", "rank0"])
def test_a_rank_with_a_wrong_environment_is_quoted_on_every_rank(
    changes: dict[str, str], message: str, store: str
) -> None:
    endings = run_ranks_apart(_set_up_with, 4, {3: changes}, store=store)
    expected = {3: ("MeshconfError", message)}
    expected.update({rank: ("RankFailedError", message) for rank in range(3)})
    _assert_ended(endings, expected)


def test_a_rank_with_a_port_that_is_not_a_port_is_named_missing() -> None:
    endings = run_ranks_apart(_set_up_with, 4, {2: {"MASTER_PORT": "99999"}})
    missing = "rank 2 did not join within 8 s (runtime.setup_timeout_s): did every rank start?"
    expected = {2: ("MeshconfError", "rank 2 has MASTER_PORT='99999', not a port (1 to 65535)")}
    expected.update({rank: ("SetupTimeoutError", missing) for rank in (0, 1, 3)})
    _assert_ended(endings, expected)


def _late(rank: int, environ: dict[str, str]) -> None:
    if rank == 3:
        time.sleep(FAULT_BOUND_S + 4)
    _set_up_with(rank, environ, {})


def test_a_rank_later_than_the_bound_is_named_and_learns_it_too() -> None:
    endings = run_ranks_apart(_late, 4)
    missing = "rank 3 did not join within 8 s (runtime.setup_timeout_s): did every rank start?"
    _assert_ended(endings, {rank: ("SetupTimeoutError", missing) for rank in range(3)})
    assert (endings[3].how, endings[3].message) == ("SetupTimeoutError", missing)


def _killed_in_group_creation(rank: int, environ: dict[str, str]) -> None:
    if rank == 2:
        import meshconf.runtime.groups as groups

        def die(*args: Any, **kwargs: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        groups.dist.new_group = die  # type: ignore[assignment]
    _set_up_with(rank, environ, {})


def test_a_rank_killed_in_group_creation_is_named_on_every_rank() -> None:
    endings = run_ranks_apart(_killed_in_group_creation, 4)
    assert endings[2].how == "died"
    stopped = "rank 2 stopped answering during group creation, before the group dataloading/*"
    for rank in (0, 1, 3):
        assert endings[rank].how == "RankFailedError", endings[rank]
        _assert_ended(endings, {rank: (endings[rank].how, stopped)})


def _slow_rank_3(rank: int, environ: dict[str, str]) -> None:
    if rank == 3:
        time.sleep(3)
    _set_up_with(rank, environ, {})


def test_a_store_that_stops_is_named_on_every_rank() -> None:
    def stop_after_a_second(stop_store: Any) -> None:
        time.sleep(1.5)
        stop_store()

    endings = run_ranks_apart(_slow_rank_3, 4, during=stop_after_a_second)
    for rank in range(4):
        ending = endings[rank]
        assert ending.how in ("StoreGoneError", "SetupTimeoutError"), (rank, ending)
        assert ending.message.startswith(
            ("the store at 127.0.0.1:", "torchrun's agent did not start within 8 s, or stopped")
        ), (rank, ending)
        assert ending.seconds < FAULT_BOUND_S + SLACK_S, (rank, ending)


def _config_of_rank_0_unreadable(rank: int, environ: dict[str, str], folder: str) -> None:
    if rank == 3:
        os._exit(3)  # dies before it reaches the store
    bad, good = Path(folder, "bad.yaml"), Path(folder, "good.yaml")
    DistributedContext.from_yaml(bad if rank == 0 else good, environ=environ)


def test_rank_0_with_an_unreadable_config_and_a_dead_rank_ends_within_the_others_bound(
    tmp_path: Path,
) -> None:
    (tmp_path / "bad.yaml").write_text("world_size: [\n")
    (tmp_path / "good.yaml").write_text(
        f"world_size: 4\nruntime: {{setup_timeout_s: {FAULT_BOUND_S}}}\n"
    )
    endings = run_ranks_apart(_config_of_rank_0_unreadable, 4, str(tmp_path), store="rank0")
    assert endings[3].how == "died"
    _assert_ended(endings, {0: ("ConfigError", f"{tmp_path / 'bad.yaml'}:2:1: YAML syntax: *")})
    for rank in (1, 2):
        _assert_ended(endings, {rank: ("RankFailedError", "rank 0 could not load the config: *")})


def test_a_port_where_another_program_listens_ends_every_rank() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]

        def with_that_port(rank: int, environ: dict[str, str]) -> None:
            environ["MASTER_PORT"] = str(port)
            _set_up_with(rank, environ, {})

        endings = run_ranks_apart(with_that_port, 4)
    message = (
        f"torchrun's agent did not start within 8 s, or stopped: no rendezvous store answered "
        f"at 127.0.0.1:{port} (runtime.setup_timeout_s; are MASTER_ADDR and MASTER_PORT those "
        "of torchrun's agent, with no other program listening there?)"
    )
    _assert_ended(endings, {rank: ("SetupTimeoutError", message) for rank in range(4)})
