"""Watching group creation across ranks: who stopped answering, and, for lazy builds, whether
the members create their process groups in the same order.

Before each ``new_group``, a rank publishes in the rendezvous store that it is creating that
group (``creating/<group>/<rank>``, and ``current/<rank>``). When torch gives up on a group (a
member never came), each member says so (``stuck/<group>/<rank>``) and waits a moment for the
others to say so too. A member that did not answer and is not itself waiting on another group
of several ranks stopped answering: the failure names it on every rank. (One waiting on
another group is named by that group's members, who wait on the one that stopped.)

torch names a group after its ranks and the number of groups the process made before it, and
its members meet in the store under that name. Two ranks that ask for meshes in different
orders (``runtime.build: lazy``) would wait for each other under different names until the
group timeout. Before its k-th ``new_group``, each rank therefore also publishes what it is
creating as ``order/<rank>/<k>`` and reads the other members' k-th entry: a difference is an
error that names both, on both ranks and, through the store, on every rank that waits.
"""

from __future__ import annotations

import itertools
import time

from meshconf.core.layout import RankGroup
from meshconf.core.messages import first_line
from meshconf.runtime.rendezvous import Rendezvous, failure_error, ranks_named
from meshconf.runtime.store import RuntimeSetupError, SetupTimeoutError

#: How long a member whose group creation failed waits for the others to say they failed too;
#: members that started the same group time out within moments of each other.
ANSWER_S = 2.0


class CreationOrderError(RuntimeSetupError):
    """Ranks asked for meshes in different orders (``runtime.build: lazy``)."""


class CreationWatch:
    """The hooks around each ``new_group`` call of a context's group registry."""

    def __init__(self, rendezvous: Rendezvous, *, same_order: bool) -> None:
        """``same_order``: compare each group's place in the members' creation orders
        (lazy builds; an eager build creates every group in one order on every rank)."""
        self.rendezvous = rendezvous
        self.same_order = same_order
        self.created = 0

    def before(self, group: RankGroup, identity: str, description: str) -> None:
        """Publish the group this rank is about to create; lazily, compare its place.
        ``identity`` is equal on two ranks exactly when they create the same group;
        ``description`` says what it is for ("dense/tp").

        Raises:
            CreationOrderError: a member's k-th group is another one.
            RankFailedError: another rank failed first.
            SetupTimeoutError: a member did not reach its k-th group in time.
        """
        store, rank = self.rendezvous.store, self.rendezvous.launch.rank
        store.set(f"creating/{identity}/{rank}", description)
        store.set(f"current/{rank}", f"{group.size}|{identity}")
        self.created += 1
        if self.same_order:
            self._compare_order(group, identity, description)

    def _compare_order(self, group: RankGroup, identity: str, description: str) -> None:
        k = self.created
        store, rank = self.rendezvous.store, self.rendezvous.launch.rank
        store.set(f"order/{rank}/{k}", f"{identity}|{description}")
        others = [member for member in group if member != rank]
        if not others:
            return
        keys = [f"order/{member}/{k}" for member in others]
        try:
            # Entries once written stay: members that all see them all go on to compare.
            self.rendezvous.wait_for(keys, "", failures_first=False)
        except SetupTimeoutError:
            late = [m for m, key in zip(others, keys, strict=True) if not store.check([key])]
            raise SetupTimeoutError(
                f"rank {rank} was creating {description} as its process group #{k}, but "
                f"{ranks_named(late)} of that group did not create a group #{k} within "
                f"{self.rendezvous.timeout_s:g} s (runtime.setup_timeout_s): with "
                "runtime.build: lazy every rank must ask for the same meshes in the same order"
            ) from None
        for member, value in zip(others, store.multi_get(keys), strict=True):
            their_identity, their_description = value.decode().split("|", 1)
            if their_identity != identity:
                reason = (
                    f"ranks asked for meshes in different orders: rank {rank} was creating "
                    f"{description} as its process group #{k}, rank {member} was creating "
                    f"{their_description}; with runtime.build: lazy every rank must ask for "
                    "meshes in the same order (runtime.build: eager, the default, creates "
                    "them all up front)"
                )
                self.rendezvous.publish(reason)
                raise CreationOrderError(reason)

    def _waits_elsewhere(self, member: int, identity: str) -> bool:
        """Whether ``member`` is creating another group, one of several ranks."""
        store = self.rendezvous.store
        if not store.check([f"current/{member}"]):
            return False
        size, _, theirs = store.get(f"current/{member}").decode().partition("|")
        return theirs != identity and int(size) > 1

    def failed(self, group: RankGroup, identity: str, description: str, error: Exception) -> None:
        """torch could not create the group: name the members that stopped answering, or
        else say what torch said.

        Raises:
            RankFailedError: members of the group stopped answering, or another rank failed
                first.
            SetupTimeoutError: ranks timed out first, or torch gave up for another reason.
        """
        rendezvous, rank = self.rendezvous, self.rendezvous.launch.rank
        rendezvous.check_failures()
        store = rendezvous.store
        store.set(f"stuck/{identity}/{rank}", "")
        others = [member for member in group if member != rank]
        keys = [f"stuck/{identity}/{member}" for member in others]
        deadline = time.monotonic() + ANSWER_S
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        silent = [
            member for member, key in zip(others, keys, strict=True) if not store.check([key])
        ]
        # A silent member waiting on another group of several ranks is not the one that
        # stopped: the members of that group name who is.
        stopped = [member for member in silent if not self._waits_elsewhere(member, identity)]
        rendezvous.check_failures()
        if stopped:
            reached = all(store.check([f"creating/{identity}/{m}"]) for m in stopped)
            where = "while creating" if reached else "during group creation, before"
            reason = (
                f"{ranks_named(stopped)} stopped answering {where} the group {description} "
                f"(ranks {_group_text(group)})"
            )
            # The first failure published, this one or another rank's, is the one raised.
            raise failure_error(rendezvous.publish(reason, gone=stopped))
        if silent:  # a failure is on its way from the group they wait on
            deadline = time.monotonic() + ANSWER_S
            while time.monotonic() < deadline:
                rendezvous.check_failures()
                time.sleep(0.05)
        first = first_line(error)
        rendezvous.failed = True
        raise SetupTimeoutError(
            f"rank {rank} could not create its process group for {description} within "
            f"{rendezvous.timeout_s:g} s (runtime.setup_timeout_s): {first}"
        )


def _group_text(group: RankGroup) -> str:
    shown = ", ".join(map(str, itertools.islice(group, 8)))
    return shown if group.size <= 8 else f"{shown} and {group.size - 8} more"
