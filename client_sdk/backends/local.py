"""The local backend: tables in the native store of this very process, no server.

All local clients of a process share one ``recstore.store.Store``, as all
clients of a PS fleet share its nodes: a table one role creates, another role
of the same process sees. Tables whose storage tier asks for a GPU live on
the GPU when there is one.

The engine's batch work runs on torch's OpenMP threads here (the process
trains with torch; ``recstore.client.native.share_torch_threads``).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import torch

from recstore import _native as _native_module
from recstore.client.backends.base import CreateResult, PullRequest, RowChunk, UpdateRequest
from recstore.client.errors import BackendError, TableNotInitialized
from recstore.client.tensors import rows_from_numpy
from recstore.core import (
    CapacityExhausted,
    DType,
    InferenceTable,
    InvalidArgument,
    NonFiniteValues,
    RecStoreError,
    StorageTier,
    TableExists,
    TableNotFound,
)
from recstore.core import TableSpec as TableSpec
from recstore.core.cache_figures import ClientCache
from recstore.core.grpc_status import status_of
from recstore.core.limits import ROW_CHUNK_BYTES

if TYPE_CHECKING:
    from recstore.store import Store, Table
    from recstore.store.table import Chunk

#: the compiled engine (no type stubs)
_native: Any = _native_module
_store: Store | None = None
_store_lock = threading.Lock()
#: the name a local table's one node answers ``pull_versioned`` under
LOCAL_NODE = "local"
#: each table's version (``pull_versioned``), moved by every write made through a local
#: client; a table dropped and created again is a new object with a newer version
_versions: weakref.WeakKeyDictionary[Table, int] = weakref.WeakKeyDictionary()
_next_version = itertools.count(1)
#: the version cells of the table groups (``LocalBackend.table_group``) each table is in:
#: a group's update moves its one cell, not every table's version
_group_cells: weakref.WeakKeyDictionary[Table, list[list[int]]] = weakref.WeakKeyDictionary()


def _version(table: Table) -> int:
    """The newest write to ``table``: its own, or one of a group it is in."""
    own = _versions.setdefault(table, next(_next_version))
    return max([own, *(cell[0] for cell in _group_cells.get(table, ()))])


@dataclass(frozen=True)
class LocalGroup:
    """Several host tables of the local store as one ``recstore._native.TableGroup``."""

    engine: Any  # recstore._native.TableGroup
    tables: tuple[Table, ...]
    version: list[int]  # moved by every update through the group (``_version``)


def process_store() -> Store:
    """The store shared by every local client of this process (created on first use)."""
    global _store
    with _store_lock:
        if _store is None:
            from recstore.client.native import share_torch_threads
            from recstore.store import Store

            share_torch_threads()
            _store = Store()
        return _store


def load_native() -> None:
    """Import the native engine now; ImportError (with the cause) when it cannot load."""
    try:
        import recstore.store  # noqa: F401  (imports recstore._native)
    except ImportError as error:
        raise ImportError(f"cannot load the RecStore native library: {error}") from error


def _device_for(spec: TableSpec) -> str:
    """Where the local store keeps a table: storage gpu falls back to the CPU without
    a GPU; gpu_cache has no CPU form, so it asks for one and is refused clearly."""
    tier = StorageTier(spec.storage)
    if tier == StorageTier.gpu_cache:
        return "cuda"
    return "cuda" if tier == StorageTier.gpu and torch.cuda.is_available() else "cpu"


def _backend_error(error: RecStoreError, name: str) -> BackendError:
    if isinstance(error, TableNotFound):
        return TableNotInitialized(
            f"table {name!r} does not exist in the local store", reason=str(error)
        )
    code = status_of(error) or grpc.StatusCode.INTERNAL  # the PS node's status, as over gRPC
    return BackendError(
        f"local store refused the call on table {name!r}: {error}", code=code, reason=str(error)
    )


def _row_chunks(
    name: str, chunks: Iterator[Chunk], dtype: DType, with_state: bool
) -> Iterator[RowChunk]:
    """Engine chunks as the SDK's (state dropped unless asked for)."""
    while True:
        try:
            chunk = next(chunks, None)
        except RecStoreError as error:
            raise _backend_error(error, name) from error
        if chunk is None:
            return
        state = torch.from_numpy(chunk.state) if with_state and chunk.state.shape[1] else None
        yield RowChunk(torch.from_numpy(chunk.keys), rows_from_numpy(chunk.values, dtype), state)


def _group_table(group: LocalGroup, error: Exception) -> tuple[str, str]:
    """The table a group call's refusal names ("table <index>: ..."), and its reason."""
    why = str(error)
    index, colon, rest = why.partition(": ")
    if colon and index.startswith("table ") and index[6:].isdigit():
        position = int(index[6:])
        if position < len(group.tables):
            return group.tables[position].name, rest
    return group.tables[0].name, why


class LocalBackend:
    kind = "local"

    def __init__(self, store: Store | None = None) -> None:
        load_native()
        self._store = store if store is not None else process_store()

    def create_table(self, spec: TableSpec) -> CreateResult:
        existing = self.describe(spec.name)
        if existing is not None:
            return CreateResult(existing, created=False)
        try:
            self._store.create(spec, device=_device_for(spec))
        except TableExists:  # created concurrently with another spec
            found = self.describe(spec.name)
            assert found is not None
            return CreateResult(found, created=False)
        except RecStoreError as error:
            raise _backend_error(error, spec.name) from error
        return CreateResult(spec, created=True)

    def describe(self, name: str) -> TableSpec | None:
        try:
            return self._store.get(name).spec
        except TableNotFound:
            return None

    def drop_table(self, name: str) -> None:
        try:
            self._store.drop(name)
        except TableNotFound as error:
            raise _backend_error(error, name) from error

    def table(self, name: str) -> Table:
        try:
            return self._store.get(name)
        except TableNotFound as error:
            raise _backend_error(error, name) from error

    def pull(self, name: str, keys: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        table = self.table(name)
        try:
            return table.pull(keys.to(table.device))
        except RecStoreError as error:
            raise _backend_error(error, name) from error

    def pull_versioned(
        self, name: str, keys: torch.Tensor, *, skip: frozenset[str] = frozenset()
    ) -> tuple[torch.Tensor, dict[str, int]]:
        """``pull`` of unique ``keys`` and the table's version read before them (the one
        node, in this process, answers every time: asking it costs nothing)."""
        table = self.table(name)
        return self.pull(name, keys, unique=True), {LOCAL_NODE: _version(table)}

    def push(self, name: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        table = self.table(name)
        try:
            table.push(keys.to(table.device), values.to(table.device))
        except RecStoreError as error:
            raise _backend_error(error, name) from error
        finally:
            _versions[table] = next(_next_version)

    def update(
        self,
        name: str,
        keys: torch.Tensor,
        grads: torch.Tensor,
        lr: float | None,
        *,
        wait: bool = True,
    ) -> None:
        """Applied before returning (a native call is cheaper than any hand-off)."""
        table = self.table(name)
        try:
            table.update(keys.to(table.device), grads.to(table.device), lr=lr)
        except RecStoreError as error:
            raise _backend_error(error, name) from error
        finally:
            _versions[table] = next(_next_version)

    def pools_bags(self, name: str) -> bool:
        """Whether ``name``'s bags can be pooled by the engine: float32 rows in host memory."""
        try:
            table = self._store.get(name)
        except TableNotFound:
            return False
        return table.device == "cpu" and table.dtype == DType.float32

    def pool_bags(
        self, name: str, keys: torch.Tensor, bag_size: int, mean: bool,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Each bag of ``bag_size`` consecutive keys' rows, summed (``mean``: averaged), into
        ``out``'s rows when given (a column slice of a wider output will do)."""
        table = self.table(name)
        try:
            out = table.pool(keys, bag_size, mean, out)
        except RecStoreError as error:
            raise _backend_error(error, name) from error
        return out

    def update_bags(
        self,
        name: str,
        keys: torch.Tensor,
        bag_size: int,
        grads: torch.Tensor,
        scale: float,
        lr: float | None,
    ) -> None:
        """``pool_bags``' update: bag b's gradient row times ``scale`` for each of its keys."""
        table = self.table(name)
        try:
            table.update_bags(keys, bag_size, grads, scale, lr=lr)
        except RecStoreError as error:
            raise _backend_error(error, name) from error
        finally:
            _versions[table] = next(_next_version)

    @property
    def generation(self) -> int:
        """Moves whenever a table of the store is created or dropped."""
        return self._store.generation

    def table_group(self, names: Sequence[str]) -> LocalGroup | None:
        """The named tables as one native group, or None when one is not a host table
        (or has an injected clock, which every call must tick first)."""
        tables = tuple(self.table(name) for name in names)
        engines = [table.host_engine for table in tables]
        if any(type(engine) is not _native.Table for engine in engines):
            return None
        cell = [next(_next_version)]
        for table in tables:
            _group_cells.setdefault(table, []).append(cell)
        return LocalGroup(_native.TableGroup(engines), tables, cell)

    def pool_group(self, group: LocalGroup, *args: Any) -> None:
        """``TableGroup.pool`` (rows inserted as ``pull`` does)."""
        self._group_call(group, group.engine.pool, args)

    def update_group(self, group: LocalGroup, *args: Any) -> None:
        """``TableGroup.update``: every table's optimizer, in one call."""
        try:
            self._group_call(group, group.engine.update, args)
        finally:
            group.version[0] = next(_next_version)

    @staticmethod
    def _group_call(group: LocalGroup, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except _native.CapacityError as error:
            name, why = _group_table(group, error)
            raise _backend_error(CapacityExhausted(why), name) from None
        except _native.InferenceTableError:
            name = group.tables[0].name
            raise _backend_error(InferenceTable.of(name), name) from None
        except _native.NonFiniteError as error:
            name, why = _group_table(group, error)
            raise _backend_error(NonFiniteValues(why, table=name), name) from None
        except ValueError as error:  # ids or offsets the engine refused: nothing changed
            name, why = _group_table(group, error)
            raise _backend_error(InvalidArgument(why), name) from None

    def pull_many(self, requests: Sequence[PullRequest]) -> list[torch.Tensor]:
        """Direct store calls, table by table (no request to save locally)."""
        return [self.pull(name, keys, unique=unique) for name, keys, unique in requests]

    def lookahead_many(self, requests: Sequence[PullRequest]) -> None:
        """Nothing: a local pull costs no round trip to hide."""

    def update_many(self, updates: Sequence[UpdateRequest], *, wait: bool = True) -> None:
        """Table by table, once every table is found (an unknown one changes nothing)."""
        for name, _, _, _ in updates:
            self.table(name)
        for name, keys, grads, lr in updates:
            self.update(name, keys, grads, lr)

    def export_rows(
        self,
        name: str,
        *,
        with_state: bool = False,
        slots: np.ndarray | None = None,
        keys: torch.Tensor | None = None,
    ) -> Iterator[RowChunk]:
        table = self.table(name)
        rows = max(1, ROW_CHUNK_BYTES // (table.spec.row_bytes + 4 * table.spec.state_width))
        wanted = None if keys is None else keys.numpy()
        chunks = table.export_chunks(rows, slots=slots, keys=wanted)
        return _row_chunks(name, chunks, table.dtype, with_state)

    def report_caches(self, name: str, caches: Sequence[ClientCache]) -> None:
        """Nothing to tell: an in-process table has no node whose view shows caches."""
        self.table(name)  # an unknown table is still an error

    def optimizer_step(self, name: str) -> int:
        return self.table(name).optimizer_state()["step"]

    def set_optimizer_step(self, name: str, step: int) -> None:
        table = self.table(name)
        try:
            table.spec.check_trainable()
            table.load_optimizer_state({"step": step})
        except RecStoreError as error:
            raise _backend_error(error, name) from error

    def import_rows(self, name: str, chunks: Iterable[RowChunk]) -> int:
        table = self.table(name)
        written = 0
        for chunk in chunks:
            keys, values = chunk.keys.to(table.device), chunk.values.to(table.device)
            try:
                if chunk.state is None:
                    table.push(keys, values)
                else:
                    table.import_chunk(keys, values, chunk.state.to(table.device))
            except RecStoreError as error:
                raise _backend_error(error, name) from error
            finally:
                _versions[table] = next(_next_version)
            written += len(keys)
        return written

    def flush(self) -> None:
        """Nothing in flight: local updates are applied when ``update`` returns."""

    def close(self) -> None:
        """Nothing to release: the process store outlives its clients."""
