"""Lazy builds: the members of a group must create their process groups in the same order.

torch names a group after its ranks and the number of groups the process made before it, and
its members meet in the store under that name. Two ranks that ask for meshes in different
orders would wait for each other under different names until the group timeout. Before its
k-th ``new_group``, each rank therefore publishes what it is creating as ``order/<rank>/<k>``
and reads the other members' k-th entry: a difference is an error that names both, on both
ranks and, through the rendezvous store, on every rank that waits in set-up.
"""

from __future__ import annotations

from meshconf.core.layout import RankGroup
from meshconf.runtime.rendezvous import Rendezvous, RuntimeSetupError, SetupTimeoutError


class CreationOrderError(RuntimeSetupError):
    """Ranks asked for meshes in different orders (``runtime.build: lazy``)."""


class CreationOrder:
    """The ``before_create`` check of a lazily built context."""

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous
        self.created = 0

    def before(self, group: RankGroup, identity: str, description: str) -> None:
        """Publish this rank's k-th group and compare it with the other members' k-th.

        Raises:
            CreationOrderError: a member's k-th group is another one.
            RankFailedError: another rank failed first.
            SetupTimeoutError: a member did not reach its k-th group in time.
        """
        self.created += 1
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
                f"rank{'s' if len(late) > 1 else ''} {', '.join(map(str, late[:8]))} of that "
                f"group did not create a group #{k} within {self.rendezvous.timeout_s:g} s "
                "(runtime.setup_timeout_s): with runtime.build: lazy every rank must ask for "
                "the same meshes in the same order"
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
                self.rendezvous.fail(reason)
                raise CreationOrderError(reason)

    def failed(self, description: str, error: Exception) -> None:
        """torch could not create the group: another rank's failure, or members that did not
        come within the bound.

        Raises:
            RankFailedError: another rank failed first.
            SetupTimeoutError: otherwise.
        """
        self.rendezvous.check_failures()
        self.rendezvous.failed = True
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SetupTimeoutError(
            f"rank {self.rendezvous.launch.rank} could not create its process group for "
            f"{description} within {self.rendezvous.timeout_s:g} s (runtime.setup_timeout_s): "
            f"{first}"
        ) from None
