"""The interface every backend offers the client.

The client validates and converts input (ids to CPU int64, rows to the table
dtype) before it calls a backend, so a backend only
moves rows: create/find a table, gather, assign, apply gradients, drop.
Failures come back as the SDK's errors (``recstore.client.errors``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from recstore.core import TableSpec
from recstore.core.cache_figures import ClientCache

#: (table, keys, unique) of one table in ``pull_many``
PullRequest = tuple[str, torch.Tensor, bool]
#: (table, keys, grads, lr) of one table in ``update_many``
UpdateRequest = tuple[str, torch.Tensor, torch.Tensor, float | None]


@dataclass(frozen=True)
class CreateResult:
    spec: TableSpec  # the table's spec on the backend (the existing one when not created)
    created: bool  # False: a table of that name was already there


@dataclass(frozen=True)
class RowChunk:
    """Rows of one table with their optimizer state (``export_rows`` / ``import_rows``).

    keys int64[n]; values [n, dim] in the table dtype; state float32[n, width] of the
    table's optimizer (``TableSpec.state_width``), None for values alone.
    """

    keys: torch.Tensor
    values: torch.Tensor
    state: torch.Tensor | None = None


class Backend(Protocol):
    kind: str  # "local" or "grpc"

    def create_table(self, spec: TableSpec) -> CreateResult:
        """Create the table, or find it when one of that name exists (any spec)."""
        ...

    def describe(self, name: str) -> TableSpec | None:
        """The spec of an existing table, None when there is none."""
        ...

    def drop_table(self, name: str) -> None: ...

    def pull(self, name: str, keys: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        """Rows [len(keys), dim] in the table dtype (any device); missing rows initialised.

        ``unique``: the caller vouches that ``keys`` has no repeats (no dedup pass).
        """
        ...

    def pull_versioned(
        self, name: str, keys: torch.Tensor, *, skip: frozenset[str] = frozenset()
    ) -> tuple[torch.Tensor, dict[str, int] | None]:
        """``pull`` of unique ``keys`` and the table's version per node, read before the rows.

        A version moves on every write to the table, so rows kept from a pull
        that reported the same versions are still current. Every node of the
        table answers except those in ``skip``, which answer only when they own
        some of the keys. None instead of the versions when the nodes that
        answered may not be all the nodes asked (a slot-map change meanwhile).
        """
        ...

    def push(self, name: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Assign rows; ``keys`` are unique."""
        ...

    def update(
        self,
        name: str,
        keys: torch.Tensor,
        grads: torch.Tensor,
        lr: float | None,
        *,
        wait: bool = True,
    ) -> None:
        """Apply gradients through the table's optimizer (repeated keys summed).

        ``wait=False`` may return before the update is applied; every later call
        on the table still sees it, and a failure is raised by that call.
        """
        ...

    def pull_many(self, requests: Sequence[PullRequest]) -> list[torch.Tensor]:
        """``pull`` of several tables at once (remote: one request per node)."""
        ...

    def lookahead_many(self, requests: Sequence[PullRequest]) -> None:
        """Name the next ``pull_many`` so a remote backend can send it early.

        Remote: it goes out with the next updates left in flight, and the next
        ``pull_many`` of the same keys uses its rows unless anything else
        happened meanwhile. Local: nothing to gain, nothing done.
        """
        ...

    def update_many(self, updates: Sequence[UpdateRequest], *, wait: bool = True) -> None:
        """``update`` of several tables at once (remote: one request per node).

        A table whose rows a node refuses applies nothing there; every later call on
        a table raises a failure of that table's rows, as for ``update``.
        """
        ...

    def export_rows(
        self,
        name: str,
        *,
        with_state: bool = False,
        slots: np.ndarray | None = None,
        keys: torch.Tensor | None = None,
    ) -> Iterator[RowChunk]:
        """The table's resident rows in chunks of bounded bytes, shard by shard.

        ``slots``: a bool array over the 16384 routing slots (checked by the caller,
        ``recstore.core.routing.slot_mask``); only the rows of those set. ``keys``:
        only the rows of these keys (those resident).
        """
        ...

    def report_caches(self, name: str, caches: Sequence[ClientCache]) -> None:
        """Tell the table's nodes what this process's host caches of it counted (remote);
        an in-process table has no node view to tell (local: nothing is sent)."""
        ...

    def optimizer_step(self, name: str) -> int:
        """The table's optimizer step count (adam's bias correction; 0 for the others)."""
        ...

    def set_optimizer_step(self, name: str, step: int) -> None: ...

    def import_rows(self, name: str, chunks: Iterable[RowChunk]) -> int:
        """Write chunks (values and, where given, optimizer state); returns the rows.

        Each chunk is checked whole before any of its rows is written.
        """
        ...

    def flush(self) -> None:
        """Wait until every update is applied; raise a failure not yet reported."""
        ...

    def close(self) -> None:
        """Flush, then release connections."""
        ...
