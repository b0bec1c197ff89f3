"""One shard of one embedding table: the numpy/torch face of the native engine.

Every method checks its arguments completely before the engine runs (see
``buffers``), so a rejected call raises TypeError / InvalidArgument and leaves
the table as it was; the engine itself rejects out-of-range ids and a full
table before changing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.core import CapacityExhausted, DType, InvalidArgument, TableSpec
from recstore.store.buffers import (
    NUMPY_DTYPES,
    keys_buffer,
    new_rows,
    rows_buffer,
)
from recstore.store.options import DTYPE_CODES, native_options

#: The compiled engine (no type stubs: its methods take raw buffer addresses).
_native: Any = _native_module


@dataclass(frozen=True)
class Chunk:
    """Exported rows: keys int64[n], values [n, dim] (raw table dtype), state float32[n, w]."""

    keys: np.ndarray
    values: np.ndarray
    state: np.ndarray


def _engine_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run an engine method, mapping its errors to the shared error classes."""
    try:
        return fn(*args)
    except _native.CapacityError as e:
        raise CapacityExhausted(str(e)) from None
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


class Table:
    """Holds the rows of one shard of a table (every row when num_shards == 1)."""

    def __init__(
        self,
        spec: TableSpec,
        *,
        shard_index: int = 0,
        num_shards: int = 1,
        device: str = "cpu",
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.spec = spec
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.device = device
        self._clock = clock
        options = native_options(spec, shard_index, num_shards, _native)
        if device == "cpu":
            try:
                self._engine = _native.Table(options)
            except MemoryError:
                width = spec.row_bytes + 4 * spec.optimizer.state_width(spec.embedding_dim)
                raise MemoryError(
                    f"table {spec.name!r}: cannot reserve {options.capacity} rows of "
                    f"{width} bytes ({options.capacity * width / 2**30:.1f} GiB) on this host"
                ) from None
        elif device.split(":")[0] == "cuda":
            index = device.partition(":")[2]
            if index and not index.isdigit():
                raise InvalidArgument(f"device must be 'cuda' or 'cuda:N', got {device!r}")
            if not _native.cuda_available():
                raise RuntimeError(
                    "device='cuda' needs a CUDA build of recstore._native and a visible GPU"
                )
            self._engine = _native.CudaTable(options, int(index) if index else -1)
        else:
            raise InvalidArgument(f"device must be 'cpu' or 'cuda', got {device!r}")
        self._state_width = spec.optimizer.state_width(spec.embedding_dim)

    # -- description -------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dim(self) -> int:
        return self.spec.embedding_dim

    @property
    def dtype(self) -> DType:
        return DType(self.spec.dtype)

    @property
    def size(self) -> int:
        return int(self._engine.size)

    @property
    def capacity(self) -> int:
        return int(self._engine.capacity)

    @property
    def memory_bytes(self) -> int:
        return int(self._engine.memory_bytes)

    def stats(self) -> dict[str, int | float]:
        return dict(self._engine.stats())

    def __repr__(self) -> str:
        return (
            f"Table({self.name!r}, dim={self.dim}, dtype={self.dtype.value}, "
            f"shard={self.shard_index}/{self.num_shards}, size={self.size})"
        )

    # -- data path ---------------------------------------------------------
    @property
    def host_engine(self) -> Any:
        """The native CPU engine, for callers that drive it directly (the PS node's fast path).

        None on a GPU, or with an injected clock (every call must tick it first).
        """
        if self.device != "cpu" or self._clock is not None:
            return None
        return self._engine

    def _tick(self) -> None:
        if self._clock is not None:
            self._engine.set_now(float(self._clock()))

    def _out(self, out: Any, rows: int, like_torch: bool) -> tuple[Any, int]:
        if out is None:
            out = new_rows(rows, self.dim, self.dtype, like_torch, self.device)
        buf, _ = rows_buffer(out, rows, self.dim, (self.dtype,), "out", self.device, writable=True)
        return out, buf.address

    def pull(self, keys: Any, out: Any = None) -> Any:
        """Find-or-insert every key (new rows from the initializer), then gather its row."""
        k = keys_buffer(keys, self.device)
        out, address = self._out(out, k.rows, k.is_torch)
        if k.rows:
            self._tick()
            _engine_call(self._engine.pull, k.rows, k.address, address)
        return out

    def find(self, keys: Any, out: Any = None) -> tuple[Any, Any]:
        """Rows of resident keys without inserting; missing rows are zeros, found False."""
        k = keys_buffer(keys, self.device)
        out, address = self._out(out, k.rows, k.is_torch)
        found = np.zeros(k.rows, dtype=np.bool_)
        if k.rows:
            self._tick()
            _engine_call(self._engine.find, k.rows, k.address, address, found.ctypes.data)
        if k.is_torch:
            import torch

            return out, torch.from_numpy(found).to(self.device)
        return out, found

    def push(self, keys: Any, values: Any) -> None:
        """Assign rows (table dtype), inserting missing keys; a repeated key keeps its last row."""
        k = keys_buffer(keys, self.device)
        v, _ = rows_buffer(values, k.rows, self.dim, (self.dtype,), "values", self.device)
        if k.rows:
            self._tick()
            _engine_call(self._engine.assign, k.rows, k.address, v.address)

    def update(self, keys: Any, grads: Any, lr: float | None = None) -> None:
        """Apply gradients through the table's optimizer; duplicate keys are summed first."""
        k = keys_buffer(keys, self.device)
        g, gdtype = rows_buffer(
            grads, k.rows, self.dim, (DType.float32, self.dtype), "grads", self.device
        )
        rate = self.spec.optimizer.lr if lr is None else float(lr)
        if not np.isfinite(rate) or rate <= 0:
            raise InvalidArgument(f"lr must be a positive finite number, got {lr}")
        self._tick()
        _engine_call(self._engine.update, k.rows, k.address, g.address, DTYPE_CODES[gdtype], rate)

    def erase(self, keys: Any) -> int:
        """Remove rows; returns how many resident rows went."""
        k = keys_buffer(keys, self.device)
        if not k.rows:
            return 0
        self._tick()
        return int(_engine_call(self._engine.erase, k.rows, k.address))

    def expire(self) -> int:
        """Remove every row untouched for longer than the spec's ttl_seconds."""
        self._tick()
        return int(self._engine.expire())

    # -- checkpoint support ------------------------------------------------
    def export_chunks(self, chunk_rows: int = 65536) -> Iterator[Chunk]:
        """Rows with their optimizer state, ``chunk_rows`` at a time.

        The key list is taken when iteration starts; each chunk then copies the
        rows of those keys still resident, so concurrent writers never tear a row.
        """
        if chunk_rows < 1:
            raise InvalidArgument(f"chunk_rows must be >= 1, got {chunk_rows}")
        self._tick()
        all_keys = self._engine.keys()
        for start in range(0, len(all_keys), chunk_rows):
            want = np.ascontiguousarray(all_keys[start : start + chunk_rows])
            n = len(want)
            keys_out = np.empty(n, dtype=np.int64)
            values = np.empty((n, self.dim), dtype=NUMPY_DTYPES[self.dtype])
            state = np.empty((n, self._state_width), dtype=np.float32)
            got = self._engine.export_rows(
                n, want.ctypes.data, keys_out.ctypes.data, values.ctypes.data, state.ctypes.data
            )
            if got:
                yield Chunk(keys_out[:got], values[:got], state[:got])

    def import_chunk(self, keys: Any, values: Any, state: Any) -> None:
        """Insert or overwrite rows together with their optimizer state."""
        k = keys_buffer(keys, self.device)
        v, _ = rows_buffer(values, k.rows, self.dim, (self.dtype,), "values", self.device)
        s, _ = rows_buffer(state, k.rows, self._state_width, (DType.float32,), "state", self.device)
        if k.rows:
            self._tick()
            _engine_call(self._engine.import_rows, k.rows, k.address, v.address, s.address)

    def optimizer_state(self) -> dict[str, int]:
        """Table-level optimizer state (Adam's step count: update() calls so far)."""
        return {"step": int(self._engine.step)}

    def load_optimizer_state(self, state: dict[str, int]) -> None:
        step = state.get("step", 0)
        if not isinstance(step, int | np.integer) or step < 0:
            raise InvalidArgument(f"optimizer state 'step' must be an int >= 0, got {step!r}")
        self._engine.set_step(int(step))
