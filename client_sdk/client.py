"""``RecStoreClient``: the documented KVClient API over the local or gRPC backend.

One instance per role (constructing the same role again returns it). Tables
are created on the backend by ``init_data``; ``pull``/``push``/``update``
convert ids to int64 and return results on the caller's device; ``prefetch``
pulls in the background. Unknown tables and backend failures raise
``RuntimeError`` (with the server's reason), a table met again with another
shape or dtype ``TypeError``, bad input ``ValueError``/``TypeError`` before
anything is sent.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import torch

from recstore.client import connection as conn
from recstore.client.backends.base import Backend, RowChunk
from recstore.client.errors import BackendError, TableNotInitialized, TableShapeMismatch
from recstore.client.initial_data import RowSource, write_initial_rows
from recstore.client.module_tables import ModuleTables
from recstore.client.native import load_library
from recstore.client.prefetch import PrefetchExecutor
from recstore.client.specs import (
    TableMeta,
    build_spec,
    check_learning_rate,
    check_shape,
    same_layout,
)
from recstore.client.tensors import (
    as_id_tensor,
    as_value_tensor,
    check_id_range,
    coalesce,
    last_write_wins,
    result_device,
    torch_dtype,
)
from recstore.core import DType
from recstore.core.routing import slot_mask

DEFAULT_LEARNING_RATE = 0.01
MACHINE_ID_ENV = "RECSTORE_MACHINE_ID"


def _make_backend(connection: conn.Connection) -> Backend | None:
    if connection.backend == "local":
        from recstore.client.backends.local import LocalBackend

        return LocalBackend()
    if not connection.configured:
        return None  # set_ps_backend("grpc") before set_ps_config: wait for the endpoints
    from recstore.client.remote.backend import GrpcBackend

    return GrpcBackend(
        endpoints=connection.endpoints,
        admin_url=connection.admin_url,
        admin_token=connection.token,
        token=connection.ps_token,
        transport_dtype=connection.transport_dtype,
    )


class RecStoreClient:
    """Client of RecStore embedding tables (see docs/sdk.md)."""

    _instances: ClassVar[dict[str, RecStoreClient]] = {}
    _registry_lock: ClassVar[threading.RLock] = threading.RLock()
    _client_ids: ClassVar[itertools.count[int]] = itertools.count()
    _initialized: bool

    def __new__(cls, library_path: str | None = None, role: str = "default") -> RecStoreClient:
        with cls._registry_lock:
            instance = cls._instances.get(role)
            if instance is None:
                instance = super().__new__(cls)
                instance._initialized = False
                cls._instances[role] = instance
            return instance

    def __init__(self, library_path: str | None = None, role: str = "default") -> None:
        with self._registry_lock:
            if self._initialized:
                return
            try:
                self._setup(library_path, role)
            except BaseException:
                self._instances.pop(role, None)
                raise
            self._initialized = True

    def __reduce__(self) -> Any:
        raise TypeError(
            f"RecStoreClient (role {self.role!r}) holds connections and in-process tables and "
            "cannot be pickled or copied. To save a model with RecStore modules, save its "
            "state_dict() (torch.save, torch.distributed.checkpoint) or use recstore.export; "
            "in another process, create the client there (RecStoreClient(role=...))"
        )

    def _setup(self, library_path: str | None, role: str) -> None:
        if not isinstance(role, str) or not role:
            raise ValueError(f"role must be a non-empty string, got {role!r}")
        if library_path is not None:
            load_library(library_path)
        self.role = role
        self.client_id = next(self._client_ids)
        self.machine_id = int(os.environ.get(MACHINE_ID_ENV, "0"))
        self.part_policy: dict[str, Any] = {}
        self._tensor_meta: dict[str, TableMeta] = {}
        self._full_data_shape: dict[str, tuple[int, int]] = {}
        self._data_name_list: set[str] = set()
        self._gdata_name_list: set[str] = set()
        self._lock = threading.RLock()
        self._learning_rate = DEFAULT_LEARNING_RATE
        self._learning_rate_set = False
        self._last_table: str | None = None
        self._tables_changed = 0  # moves whenever a table is created or dropped
        self._prefetcher = PrefetchExecutor()
        self._connection = conn.from_environment()
        self.ops: Backend | None = _make_backend(self._connection)
        # what recstore.nn's modules use, and nothing else does
        self._for_modules = ModuleTables(self)

    # -- connection -----------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """``"local"`` or ``"grpc"``."""
        return self._connection.backend

    def _reconnect(self, connection: conn.Connection) -> None:
        backend = _make_backend(connection)  # may fail: keep the old backend then
        with self._lock:
            old, self.ops, self._connection = self.ops, backend, connection
        if old is not None:
            old.close()

    def set_ps_config(self, host: str, port: int, *, transport_dtype: str | None = None) -> None:
        """Talk to the single PS node ``host:port`` over gRPC (reconnects).

        ``transport_dtype`` (float16 or bfloat16): float32 tables' pulls and updates
        travel in it, as with set_transport_dtype.
        """
        if (
            not isinstance(host, str)
            or not host
            or isinstance(port, bool)
            or not isinstance(port, int)
        ):
            raise ValueError(
                f"set_ps_config needs a host name and an int port, got {host!r}, {port!r}"
            )
        connection = conn.with_endpoints(self._connection, [f"{host}:{port}"])
        if transport_dtype is not None:
            connection = conn.with_transport(connection, transport_dtype)
        self._reconnect(connection)

    def set_transport_dtype(self, dtype: str | None) -> None:
        """Pull and update float32 tables' rows as ``dtype`` (float16 or bfloat16) on the wire.

        Half the bytes; the nodes keep the rows, and run the optimizer, in float32.
        None: as each table's spec says (``transport_dtype``). Reconnects.
        """
        self._reconnect(conn.with_transport(self._connection, dtype))

    def set_ps_endpoints(
        self, endpoints: str | list[str] | tuple[str, ...], *, ps_token: str | None = None
    ) -> None:
        """Talk to a sharded table's PS nodes, ``host:port`` in shard order (reconnects).

        ``ps_token``: the nodes' bearer token (default: ``RECSTORE_PS_TOKEN``).
        """
        self._reconnect(conn.with_endpoints(self._connection, endpoints, ps_token))

    def set_admin_url(
        self, admin_url: str, token: str | None = None, *, ps_token: str | None = None
    ) -> None:
        """Find each table's shards through the admin API's discovery (reconnects).

        ``token`` is the admin API's (default: ``RECSTORE_TOKEN``), ``ps_token`` the
        nodes' (default: ``RECSTORE_PS_TOKEN``); neither is sent to the other service.
        """
        self._reconnect(conn.with_admin(self._connection, admin_url, token, ps_token))

    def set_ps_backend(self, backend: str) -> None:
        """``"local"`` (native store in this process) or ``"grpc"`` (PS nodes)."""
        self._reconnect(conn.with_backend(self._connection, backend))

    def set_learning_rate(self, lr: float) -> None:
        """The rate of every later ``update`` (and of the sgd tables created later)."""
        lr = check_learning_rate(lr)
        with self._lock:
            self._learning_rate, self._learning_rate_set = lr, True

    @property
    def learning_rate(self) -> float:
        return self._learning_rate

    def _backend(self) -> Backend:
        backend = self.ops
        if backend is None:
            raise RuntimeError(
                "grpc backend has no PS endpoints: call set_ps_config/set_ps_endpoints/"
                "set_admin_url or set RECSTORE_PS_ENDPOINTS/RECSTORE_ADMIN_URL"
            )
        return backend

    # -- tables ---------------------------------------------------------------------------

    def init_data(
        self,
        name: str,
        shape: tuple[int, int],
        dtype: torch.dtype,
        part_policy: Any = None,
        init_func: Callable[[tuple[int, int], torch.dtype], torch.Tensor] | None = None,
        is_gdata: bool = True,
        base_offset: int = 0,
        metadata: Mapping[str, Any] | None = None,
        *,
        optimizer: Any = None,
    ) -> None:
        """Create table ``name`` and write its initial rows (ids ``base_offset + arange(rows)``)."""
        rows_of: RowSource | None = None
        if init_func is not None:
            dim, torch_type = check_shape(shape)[1], dtype

            def rows_of(start: int, end: int) -> torch.Tensor:
                return init_func((end - start, dim), torch_type)

        self._create_table(
            name, shape, dtype, rows_of, base_offset, metadata, optimizer, is_gdata, part_policy
        )

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
    ) -> bool:
        """``init_data`` with rows from ``rows_of(start, end)``; True if it created the table."""
        spec = build_spec(
            name,
            shape,
            dtype,
            base_offset=base_offset,
            metadata=metadata,
            optimizer=optimizer,
            lr=self._learning_rate,
            server_initialised=rows_of is None,
        )
        rows, dim = check_shape(shape)
        with self._lock:
            known = self._tensor_meta.get(name)
            if known is not None:
                if (known.shape, known.dtype, known.base_offset) != (
                    (rows, dim),
                    spec.dtype,
                    base_offset,
                ):
                    raise TableShapeMismatch(
                        f"table {name!r} already initialised with shape {known.shape}, dtype "
                        f"{known.dtype.value}, base_offset {known.base_offset}"
                    )
                self._last_table = name
                return False
        backend = self._backend()
        result = backend.create_table(spec)
        if not same_layout(spec, result.spec):
            raise TableShapeMismatch(
                f"table {name!r} exists on the {self.backend} backend with "
                f"{result.spec.num_embeddings} x {result.spec.embedding_dim} "
                f"{DType(result.spec.dtype).value}, not {spec.num_embeddings} x {dim} "
                f"{DType(spec.dtype).value}"
            )
        meta = TableMeta((rows, dim), DType(spec.dtype), base_offset, result.spec, bool(is_gdata))
        if result.created and rows_of is not None:
            try:
                write_initial_rows(backend, name, meta, rows_of)
            except BaseException:
                backend.drop_table(name)  # a failed init_data leaves no table behind
                raise
        with self._lock:
            self._tensor_meta[name] = meta
            self._tables_changed += 1
            self._full_data_shape[name] = (rows, dim)
            self._data_name_list.add(name)
            if is_gdata:
                self._gdata_name_list.add(name)
            if part_policy is not None:
                self.part_policy[name] = part_policy
            self._last_table = name
        return result.created

    def delete_data(self, name: str) -> None:
        """Drop the table on the backend (its rows are freed) and forget it."""
        self._meta(name)
        with contextlib.suppress(TableNotInitialized):  # gone already: just forget it
            self._backend().drop_table(name)
        with self._lock:
            self._tensor_meta.pop(name, None)
            self._tables_changed += 1
            self._full_data_shape.pop(name, None)
            self._data_name_list.discard(name)
            self._gdata_name_list.discard(name)
            self.part_policy.pop(name, None)
            if self._last_table == name:
                self._last_table = None

    def get_data_meta(self, name: str) -> tuple[torch.dtype, tuple[int, int]]:
        meta = self._meta(name)
        return torch_dtype(meta.dtype), meta.shape

    def data_name_list(self) -> list[str]:
        with self._lock:
            return sorted(self._data_name_list)

    def gdata_name_list(self) -> list[str]:
        with self._lock:
            return sorted(self._gdata_name_list)

    def _meta(self, name: str) -> TableMeta:
        with self._lock:
            meta = self._tensor_meta.get(name)
        if meta is None:
            raise TableNotInitialized(f"table {name!r} is not initialised: call init_data first")
        return meta

    def _ids(self, name: str, ids: Any) -> tuple[TableMeta, torch.Tensor]:
        meta = self._meta(name)
        id_tensor = as_id_tensor(ids)
        low, high = meta.id_range
        check_id_range(id_tensor, low, high, name)
        self._last_table = name
        return meta, id_tensor

    # -- rows -----------------------------------------------------------------------------

    def pull(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids``, [N, dim] in the table dtype, on the device of ``ids``."""
        _, id_tensor = self._ids(name, ids)
        return self._backend().pull(name, id_tensor).to(result_device(ids))

    def push(self, name: str, ids: torch.Tensor, data: torch.Tensor) -> None:
        """Assign rows (for a repeated id, its last row wins)."""
        meta, id_tensor = self._ids(name, ids)
        values = as_value_tensor(
            data, len(id_tensor), meta.shape[1], torch_dtype(meta.dtype), "data"
        )
        self._backend().push(name, *last_write_wins(id_tensor, values))

    def update(
        self, name: str, ids: torch.Tensor, grads: torch.Tensor, *, lr: float | None = None
    ) -> None:
        """Apply gradients through the table's optimizer (repeated ids summed).

        The rate is ``lr`` when given, else the one of ``set_learning_rate`` once
        called, else the table optimizer's own.
        """
        meta, id_tensor = self._ids(name, ids)
        grad_tensor = as_value_tensor(grads, len(id_tensor), meta.shape[1], torch.float32, "grads")
        if lr is not None:
            lr = check_learning_rate(lr)
        elif self._learning_rate_set:
            lr = self._learning_rate
        backend = self._backend()
        if backend.kind == "local":  # the native store sums repeated ids itself
            backend.update(name, id_tensor, grad_tensor, lr)
        else:
            backend.update(name, *coalesce(id_tensor, grad_tensor), lr)

    def export_rows(
        self,
        name: str,
        *,
        with_state: bool = False,
        slots: torch.Tensor | None = None,
        ids: torch.Tensor | None = None,
    ) -> Iterator[RowChunk]:
        """The table's stored rows in chunks of bounded bytes (``RowChunk``: keys, values
        and, with ``with_state``, each row's optimizer state). ``slots``: a bool mask over
        the 16384 routing slots, only the rows of those set; ``ids``: only these rows
        (those stored)."""
        keys = None if ids is None else self._ids(name, ids)[1]
        self._meta(name)
        mask = None if slots is None else slot_mask(torch.as_tensor(slots).cpu().numpy())
        return self._backend().export_rows(name, with_state=with_state, slots=mask, keys=keys)

    def optimizer_step(self, name: str) -> int:
        """The table's optimizer step count (adam's bias correction; 0 for the others)."""
        self._meta(name)
        return self._backend().optimizer_step(name)

    def set_optimizer_step(self, name: str, step: int) -> None:
        """Set the table's optimizer step count (as restoring a checkpoint does)."""
        self._meta(name)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        self._backend().set_optimizer_step(name, step)

    def import_rows(self, name: str, chunks: Iterable[RowChunk]) -> int:
        """Write ``export_rows`` chunks (values, and optimizer state where a chunk has it)
        into the table; each chunk is checked whole before any of its rows is written."""
        self._meta(name)
        return self._backend().import_rows(name, chunks)

    def flush(self) -> None:
        """Wait until every update sent in the background is applied.

        The torch modules' backward does not wait for a remote update; ``flush``
        does (so does any later call on the same table, ``delete_data`` and
        ``close``). Raises ``RuntimeError`` for an update that failed.
        """
        self._backend().flush()

    # -- prefetch -------------------------------------------------------------------------

    def prefetch(self, ids: torch.Tensor, *, name: str | None = None) -> int:
        """Start pulling ``ids`` in the background; the id for ``wait_for_prefetch``.

        ``name`` defaults to the table most recently initialised or used.
        """
        table = name or self._last_table
        if table is None:
            raise RuntimeError("prefetch needs a table: no table initialised yet, pass name=")
        _, id_tensor = self._ids(table, ids)
        backend, device = self._backend(), result_device(ids)
        return self._prefetcher.submit(lambda: backend.pull(table, id_tensor).to(device))

    def is_prefetch_done(self, prefetch_id: int) -> bool:
        return self._prefetcher.done(prefetch_id)

    def wait_for_prefetch(self, prefetch_id: int, timeout: float | None = None) -> torch.Tensor:
        return self._prefetcher.wait(prefetch_id, timeout)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop background work, close connections, release the role (tables stay)."""
        with self._registry_lock:
            if self._instances.get(self.role) is self:
                del self._instances[self.role]
        self._prefetcher.shutdown()
        if self.ops is not None:
            self.ops.close()
            self.ops = None

    def __repr__(self) -> str:
        return f"RecStoreClient(role={self.role!r}, backend={self._connection.describe()})"


__all__ = ["BackendError", "RecStoreClient"]
