"""One shard of one embedding table: the numpy/torch face of the native engine.

The engine's bindings take typed arrays and check every argument before any
work (``csrc/arrays.h``), so a rejected call raises TypeError / InvalidArgument
and leaves the table as it was; the engine itself rejects out-of-range ids and
a full table before changing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from recstore import _native as _native_module
from recstore.core import (
    CapacityExhausted,
    DeviceUnavailable,
    DType,
    InferenceTable,
    InvalidArgument,
    NonFiniteValues,
    StorageTier,
    TableSpec,
    slot_of,
)
from recstore.core.routing import NUM_SLOTS, slot_mask
from recstore.store.buffers import NUMPY_DTYPES, is_torch, new_rows
from recstore.store.options import native_cache_options, native_options

#: The compiled engine (no type stubs).
_native: Any = _native_module


@dataclass(frozen=True)
class Chunk:
    """Exported rows: keys int64[n], values [n, dim] (raw table dtype), state float32[n, w]."""

    keys: np.ndarray
    values: np.ndarray
    state: np.ndarray


def _engine_call(table: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run an engine method of ``table``, mapping its errors to the shared error classes.

    The bindings refuse a wrong array with TypeError (not an array, dtype,
    layout, writability) or ValueError (rank, shape, device), which becomes
    InvalidArgument here; a batch the non-finite policy refuses becomes
    NonFiniteValues, naming the table.
    """
    try:
        return fn(*args)
    except _native.CapacityError as e:
        raise CapacityExhausted(str(e)) from None
    except _native.InferenceTableError:
        raise InferenceTable.of(table) from None
    except _native.NonFiniteError as e:
        raise NonFiniteValues(f"table {table!r}: {e}", table=table) from None
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def _gpu_index(spec: TableSpec, device: str, tier: StorageTier) -> int:
    """The CUDA device a GPU-backed table goes on (-1: the current one).

    DeviceUnavailable when there is none to use: the gpu_cache tier has no CPU
    form (its CPU twin, ``_native.CacheTable``, is the test oracle: a copy of host
    rows in host memory would only add work), so a CPU-only node refuses it.
    """
    what = {
        StorageTier.gpu_cache: "keeps a GPU cache in front of host memory (storage: gpu_cache)",
    }.get(tier, "is stored on a GPU (storage: gpu)")
    index = device.partition(":")[2]
    if index and not index.isdigit():
        raise InvalidArgument(f"device must be 'cuda' or 'cuda:N', got {device!r}")
    if device == "cpu":
        why = "it runs on the CPU (device cpu)"
    elif not _native.cuda_available():
        why = (
            "no CUDA device is visible to it"
            if _native.built_with_cuda()
            else "recstore._native was built without CUDA"
        )
    else:
        return int(index) if index else -1
    raise DeviceUnavailable(
        f"table {spec.name!r} {what}, but this node cannot use one: {why}; "
        "run it on a GPU node or use storage: host"
    )


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
        min_rows: int = 0,
    ) -> None:
        """``min_rows``: a hashed shard holds at least this many rows (the capacity it
        had grown to, see ``reserve``), not only its start-up share."""
        self.spec = spec
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.device = device
        self._clock = clock
        options = native_options(spec, shard_index, num_shards, _native, min_rows)
        tier = StorageTier(spec.storage)
        if device == "cpu" and tier != StorageTier.gpu_cache:
            try:
                self._engine = _native.Table(options)
            except MemoryError:
                width = spec.row_bytes + 4 * spec.state_width
                raise MemoryError(
                    f"table {spec.name!r}: cannot reserve {options.capacity} rows of "
                    f"{width} bytes ({options.capacity * width / 2**30:.1f} GiB) on this host"
                ) from None
        elif device == "cpu" or device.split(":")[0] == "cuda":
            gpu = _gpu_index(spec, device, tier)
            if tier == StorageTier.gpu_cache:
                cache = native_cache_options(spec, shard_index, num_shards, _native)
                self._engine = _engine_call(spec.name, _native.CudaCacheTable, options, cache, gpu)
            else:
                self._engine = _native.CudaTable(options, gpu)
        else:
            raise InvalidArgument(f"device must be 'cpu' or 'cuda', got {device!r}")
        self._state_width = spec.state_width

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

    def reserve(self, rows: int) -> bool:
        """Grow this shard to hold ``rows`` rows (at most its ids) while it serves; False
        when it holds that many already.

        CapacityExhausted, changing nothing, where it cannot grow: a GPU-resident
        table (``storage: gpu``) keeps its rows in one device allocation sized at start-up.
        """
        if rows <= self.capacity:
            return False
        grow = getattr(self._engine, "reserve", None)
        if grow is None:
            raise CapacityExhausted(
                f"table {self.name!r} (storage: {StorageTier(self.spec.storage).value}) holds "
                f"{self.capacity} rows on shard {self.shard_index} and cannot grow while "
                f"serving; it needs {rows}: restart the node with a larger share or keep "
                "more shards"
            )
        try:
            return bool(_engine_call(self.name, grow, rows))
        except MemoryError:
            raise CapacityExhausted(
                f"table {self.name!r}: cannot grow shard {self.shard_index} from "
                f"{self.capacity} to {rows} rows on this host (out of memory)"
            ) from None

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

    def _out(self, keys: Any, out: Any) -> tuple[Any, bool]:
        """The output rows (new ones when ``out`` is None) and whether keys is a tensor."""
        like_torch = is_torch(keys)
        if out is None:
            out = new_rows(len(keys), self.dim, self.dtype, like_torch, self.device)
        return out, like_torch

    def _batch(self, fn: Callable[..., Any], keys: Any, *arrays: Any) -> Any:
        """An engine call on the rows of ``keys``: the clock ticks when there are any."""
        if len(keys):
            self._tick()
        return _engine_call(self.name, fn, keys, *arrays)

    def pull(self, keys: Any, out: Any = None) -> Any:
        """Find-or-insert every key (new rows from the initializer), then gather its row."""
        out, _ = self._out(keys, out)
        self._batch(self._engine.pull, keys, out)
        return out

    def find(self, keys: Any, out: Any = None) -> tuple[Any, Any]:
        """Rows of resident keys without inserting; missing rows are zeros, found False."""
        out, like_torch = self._out(keys, out)
        found = np.zeros(len(keys), dtype=np.bool_)
        self._batch(self._engine.find, keys, out, found)
        if like_torch:
            import torch

            return out, torch.from_numpy(found).to(self.device)
        return out, found

    def push(self, keys: Any, values: Any) -> None:
        """Assign rows (table dtype), inserting missing keys; a repeated key keeps its last row.

        Non-finite values follow the spec's ``non_finite`` policy, as in update and
        import_chunk: NonFiniteValues (nothing written), keys left out, or written.
        """
        self._batch(self._engine.assign, keys, values)

    def update(self, keys: Any, grads: Any, lr: float | None = None) -> None:
        """Apply gradients through the table's optimizer; duplicate keys are summed first.

        An inference table (``mode: inference``) refuses with InferenceTable.
        """
        rate = self._rate(lr)
        self._tick()
        _engine_call(self.name, self._engine.update, keys, grads, rate)

    def _rate(self, lr: float | None) -> float:
        """The learning rate of an update (the optimizer's unless given); trainable tables only."""
        self.spec.check_trainable()
        rate = self.spec.optimizer.lr if lr is None else float(lr)
        if not np.isfinite(rate) or rate <= 0:
            raise InvalidArgument(f"lr must be a positive finite number, got {lr}")
        return rate

    # -- fixed-size bags (float32 CPU tables) ----------------------------------
    def pool(self, keys: Any, bag_size: int, mean: bool = False, out: Any = None) -> Any:
        """Sum (``mean``: average) of the rows of each bag of ``bag_size`` consecutive keys,
        rows inserted as ``pull`` does: [len(keys) // bag_size, dim]. ``out``: float32 rows
        of that shape to write instead; its rows may be strided (a column slice of a wider
        output), its columns not."""
        if out is None:
            bags = len(keys) // bag_size if bag_size > 0 else 0
            # float32 sums (the engine refuses other tables with a clear error)
            out = new_rows(bags, self.dim, DType.float32, is_torch(keys), self.device)
        self._batch(self._engine.pool, keys, bag_size, mean, out)
        return out

    def update_bags(
        self, keys: Any, bag_size: int, grads: Any, scale: float = 1.0, lr: float | None = None
    ) -> None:
        """The update of ``pool``'s lookups: each key of bag b gets ``scale * grads[b]``
        (fp32, one row per bag), summed per row, then the optimizer, as ``update``."""
        rate = self._rate(lr)
        self._tick()
        _engine_call(self.name, self._engine.update_bags, keys, bag_size, grads, scale, rate)

    def erase(self, keys: Any) -> int:
        """Remove rows; returns how many resident rows went."""
        return int(self._batch(self._engine.erase, keys))

    def expire(self) -> int:
        """Remove every row untouched for longer than the spec's ttl_seconds."""
        self._tick()
        return int(self._engine.expire())

    # -- checkpoint support ------------------------------------------------
    def export_chunks(
        self,
        chunk_rows: int = 65536,
        *,
        slots: np.ndarray | None = None,
        keys: np.ndarray | None = None,
    ) -> Iterator[Chunk]:
        """Rows with their optimizer state, ``chunk_rows`` at a time.

        The key list is taken when iteration starts; each chunk then copies the
        rows of those keys still resident, so concurrent writers never tear a row.
        ``slots``: a bool mask over the routing slots; only the rows of slots set in it.
        ``keys``: only these keys' rows (those resident), in their order.
        """
        if chunk_rows < 1:
            raise InvalidArgument(f"chunk_rows must be >= 1, got {chunk_rows}")
        self._tick()
        if keys is not None:
            all_keys = np.asarray(keys, np.int64)
            if slots is not None:
                all_keys = all_keys[slot_mask(slots)[slot_of(all_keys)]]
        else:
            all_keys = self.keys() if slots is None else self.keys_in_slots(slots)
        for start in range(0, len(all_keys), chunk_rows):
            want = all_keys[start : start + chunk_rows]
            n = len(want)
            keys_out = np.empty(n, dtype=np.int64)
            values = np.empty((n, self.dim), dtype=NUMPY_DTYPES[self.dtype])
            state = np.empty((n, self._state_width), dtype=np.float32)
            got = _engine_call(self.name, self._engine.export_rows, want, keys_out, values, state)
            if got:
                yield Chunk(keys_out[:got], values[:got], state[:got])

    def keys(self) -> np.ndarray:
        """Every resident key (int64), in no particular order."""
        self._tick()
        return np.asarray(self._engine.keys(), dtype=np.int64)

    def keys_in_slots(self, slots: np.ndarray) -> np.ndarray:
        """The resident keys whose routing slot is set in ``slots`` (a bool per slot)."""
        selected = np.ascontiguousarray(slot_mask(slots))
        self._tick()
        native = getattr(self._engine, "keys_in_slots", None)
        if native is not None:  # one pass over the index, no hashing of every key here
            return np.asarray(native(selected), dtype=np.int64)
        keys = np.asarray(self._engine.keys(), dtype=np.int64)
        return keys[selected[slot_of(keys)]]

    def native_slot_checksums(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Reshard checksums from one native pass over the rows: (row counts int64,
        wrapping sums of row hashes uint64), one entry per slot, 0 outside ``slots``.

        None where the engine has no such pass (the GPU tiers): the caller then hashes
        exported rows (``recstore.ps.reshard.slots.exported_slot_checksums``, the definition).
        """
        native = getattr(self._engine, "slot_checksums", None)
        if native is None:
            return None
        counts = np.empty(NUM_SLOTS, dtype=np.int64)
        sums = np.empty(NUM_SLOTS, dtype=np.uint64)
        self._tick()
        native(np.ascontiguousarray(slot_mask(slots)), counts, sums)
        return counts, sums

    @property
    def hashes_rows_in_place(self) -> bool:
        """Whether ``native_row_hashes`` reads rows where they lie (the CPU engine)."""
        return getattr(self._engine, "row_hashes", None) is not None

    def native_row_hashes(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The reshard row hash of each key's row (uint64; 0 where absent) and whether it
        is resident (bool), hashed where the rows lie; None where the engine has no such
        call (the GPU tiers)."""
        if not self.hashes_rows_in_place:
            return None
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        hashes = np.empty(len(keys), dtype=np.uint64)
        found = np.empty(len(keys), dtype=bool)
        self._tick()
        self._engine.row_hashes(keys, hashes, found)
        return hashes, found

    def export_keys(self, keys: np.ndarray) -> Chunk:
        """The rows, with optimizer state, of those of ``keys`` still resident (one chunk)."""
        for chunk in self.export_chunks(max(1, len(keys)), keys=keys):
            return chunk
        empty = np.empty((0, self.dim), dtype=NUMPY_DTYPES[self.dtype])
        return Chunk(np.empty(0, np.int64), empty, np.empty((0, self._state_width), np.float32))

    def import_chunk(self, keys: Any, values: Any, state: Any) -> None:
        """Insert or overwrite rows together with their optimizer state."""
        self._batch(self._engine.import_rows, keys, values, state)

    def optimizer_state(self) -> dict[str, int]:
        """Table-level optimizer state (Adam's step count: update() calls so far)."""
        return {"step": int(self._engine.step)}

    def load_optimizer_state(self, state: dict[str, int]) -> None:
        step = state.get("step", 0)
        if not isinstance(step, int | np.integer) or step < 0:
            raise InvalidArgument(f"optimizer state 'step' must be an int >= 0, got {step!r}")
        self._engine.set_step(int(step))
