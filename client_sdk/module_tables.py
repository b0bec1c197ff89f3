"""What the torch modules need of a ``RecStoreClient``, as one small internal object.

``recstore.nn``'s modules create their table, pull rows through autograd and
hand their backward's gradients over; none of that is the documented KVClient
API, so it lives here instead of in private methods of the client that the
modules would call one by one. Ids reaching this object came out of the
modules' own checks and dedup: CPU int64 keys (``unique``: no repeats).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from recstore.client.backends.base import Backend, PullRequest
from recstore.client.backends.local import LocalBackend
from recstore.client.initial_data import RowSource
from recstore.client.specs import TableMeta
from recstore.client.tensors import check_id_range, coalesce, unique_keys
from recstore.core.cache_figures import ClientCache

#: (table, keys, gradient rows, unique) of one table in ``apply_gradients``
GradientRows = tuple[str, torch.Tensor, torch.Tensor, bool]


class ClientInternals(Protocol):
    """What this object uses of the ``RecStoreClient`` that holds it."""

    ops: Backend | None
    _last_table: str | None
    _learning_rate_set: bool
    _tables_changed: int

    @property
    def learning_rate(self) -> float: ...

    def _create_table(
        self,
        name: str,
        shape: tuple[int, int],
        dtype: torch.dtype,
        rows_of: RowSource | None,
        base_offset: int = 0,
        metadata: Mapping[str, Any] | None = None,
        optimizer: Any = None,
        is_gdata: bool = True,
        part_policy: Any = None,
    ) -> bool: ...

    def _backend(self) -> Backend: ...

    def _meta(self, name: str) -> TableMeta: ...


class ModuleTables:
    def __init__(self, client: ClientInternals) -> None:
        self._client = client

    def create(
        self,
        name: str,
        shape: tuple[int, int],
        dtype: torch.dtype,
        rows_of: RowSource | None,
        *,
        metadata: Mapping[str, Any] | None,
        optimizer: Any,
    ) -> bool:
        """The module's table, with rows from ``rows_of`` (None: the server initialises them);
        True if this call created it."""
        return self._client._create_table(
            name, shape, dtype, rows_of, metadata=metadata, optimizer=optimizer
        )

    @property
    def dedup_on_wire(self) -> bool:
        """Whether the modules should send each distinct id once (remote) or every id (local)."""
        backend = self._client.ops
        return backend is not None and backend.kind != "local"

    def wire_keys(self, keys: torch.Tensor) -> tuple[torch.Tensor, bool, torch.Tensor | None]:
        """What a lookup of ``keys`` (one per occurrence) pulls: (keys, unique, inverse).

        Remotely each distinct key travels once (``inverse`` repeats its row per
        occurrence); locally every key is looked up as it comes (inverse None).
        """
        if self.dedup_on_wire:
            unique, inverse = unique_keys(keys)
            return unique, True, inverse
        return keys, False, None

    def pull(self, name: str, keys: torch.Tensor, *, unique: bool) -> torch.Tensor:
        """One table's rows, as one table's share of a step (held updates ride along)."""
        (rows,) = self.pull_many([(name, keys, unique)])
        return rows

    @property
    def tables_changed(self) -> int:
        """A number that moves whenever the client creates or drops a table."""
        return self._client._tables_changed

    def pull_many(
        self, requests: list[PullRequest], *, checked: bool = False
    ) -> list[torch.Tensor]:
        """Several tables' rows; every table's ids checked before anything is sent
        (``checked``: the caller did, against ``id_ranges``)."""
        if not checked:
            self._check_keys(requests)
        return self._client._backend().pull_many(requests)

    def id_ranges(self, names: list[str]) -> list[tuple[int, int | None]]:
        """Each table's valid ids [low, high) (high None: any), as the pulls check them."""
        return [self._client._meta(name).id_range for name in names]

    def pull_versioned(
        self, name: str, keys: torch.Tensor, *, skip: frozenset[str] = frozenset()
    ) -> tuple[torch.Tensor, dict[str, int] | None]:
        """Rows of unique ``keys`` and the table's version on each node, read before them
        (what a client cache compares to know whether its rows are current); nodes in
        ``skip`` answer only for their keys (``Backend.pull_versioned``)."""
        self._check_keys([(name, keys, True)])
        return self._client._backend().pull_versioned(name, keys, skip=skip)

    def report_caches(self, name: str, caches: list[ClientCache]) -> None:
        """This process's host caches of ``name``, to the table's nodes (``CacheReport``)."""
        self._client._backend().report_caches(name, caches)

    def lookahead_many(self, requests: list[PullRequest], *, checked: bool = False) -> None:
        """Name the next ``pull_many`` (``EmbeddingBagCollection.prefetch``)."""
        if not checked:
            self._check_keys(requests)
        self._client._backend().lookahead_many(requests)

    def apply_gradients(self, updates: list[GradientRows]) -> None:
        """``update`` for ids that came out of a pull (the modules' backward), not waited for.

        Skips the id checks; every later call on a table still sees its update.
        The local store sums repeated ids natively; a remote backend gets them
        coalesced (fewer bytes). One MultiUpdate per node, held to ride on a pull.
        """
        client = self._client
        backend = client._backend()
        lr = client.learning_rate if client._learning_rate_set else None
        batch = []
        for name, keys, grads, unique in updates:
            keys = keys.to("cpu", torch.int64)
            rows = grads.detach().to("cpu", torch.float32).contiguous()
            if backend.kind != "local" and not unique:
                keys, rows = coalesce(keys, rows)
            batch.append((name, keys, rows, lr))
        backend.update_many(batch, wait=False)

    # -- fixed-size bags pooled in the engine (``recstore.client.pooled``) ------------------
    def pools_bags(self, name: str) -> bool:
        """Whether ``name`` is a float32 table of the local backend in host memory."""
        backend = self._client.ops
        return isinstance(backend, LocalBackend) and backend.pools_bags(name)

    def pool_bags(
        self, name: str, keys: torch.Tensor, bag_size: int, mean: bool,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Each bag of ``bag_size`` consecutive keys pooled (sum or mean), into ``out``'s rows
        when given; keys checked first."""
        self._check_keys([(name, keys, False)])
        return self._local().pool_bags(name, keys, bag_size, mean, out)

    def update_bags(
        self, name: str, keys: torch.Tensor, bag_size: int, grads: torch.Tensor, scale: float
    ) -> None:
        """``pool_bags``' update: bag b's gradient row (times ``scale``) for each of its keys."""
        client = self._client
        lr = client.learning_rate if client._learning_rate_set else None
        self._local().update_bags(name, keys, bag_size, grads, scale, lr)

    def _local(self) -> LocalBackend:
        backend = self._client._backend()
        assert isinstance(backend, LocalBackend)
        return backend

    def _check_keys(self, requests: list[PullRequest]) -> None:
        for name, keys, _ in requests:
            meta = self._client._meta(name)
            low, high = meta.id_range
            check_id_range(keys, low, high, name)
            self._client._last_table = name
