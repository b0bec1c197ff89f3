"""A deliberately simple pure-Python model of one table shard: the test oracle.

Rows live in a dict; every rule of the engine (deterministic initial rows,
duplicate merging, the four optimizers, LRU/LFU/TTL eviction, what touches a
row, the non-finite policy) is written out here the obvious way, so the native engine can be checked
against it operation by operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from recstore.core import (
    CapacityExhausted,
    DType,
    InvalidArgument,
    NonFinite,
    NonFiniteValues,
    TableSpec,
)
from recstore.core.shard_rows import shard_layout

MASK = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def init_bits(key: int, seed: int, counter: int) -> int:
    k = splitmix64((key & MASK) ^ splitmix64(seed))
    return splitmix64((k + counter * 0xD1B54A32D192ED03) & MASK)


def unit(bits: int) -> float:
    return ((bits >> 11) + 0.5) * (1.0 / 9007199254740992.0)


def initial_row(spec: TableSpec, key: int) -> np.ndarray:
    """The fp32 initial row of ``key`` (before rounding to the table dtype)."""
    init = spec.initializer
    row = np.zeros(spec.embedding_dim, dtype=np.float32)
    for col in range(spec.embedding_dim):
        if init.kind == "uniform":
            u = unit(init_bits(key, init.seed, col))
            row[col] = np.float32(init.low + (init.high - init.low) * u)
        elif init.kind == "normal":
            pair = col >> 1
            r = math.sqrt(-2.0 * math.log(unit(init_bits(key, init.seed, 2 * pair))))
            angle = 6.283185307179586 * unit(init_bits(key, init.seed, 2 * pair + 1))
            z = r * math.sin(angle) if col & 1 else r * math.cos(angle)
            row[col] = np.float32(init.mean + init.std * z)
    return row


def to_table_dtype(row: np.ndarray, dtype: DType) -> np.ndarray:
    """fp32 -> the table's raw storage (bfloat16 as uint16 bits, round to nearest even)."""
    if dtype == DType.float32:
        return row.astype(np.float32)
    if dtype == DType.float16:
        return row.astype(np.float16)
    import torch

    return (
        torch.from_numpy(row.astype(np.float32))
        .to(torch.bfloat16)
        .view(torch.int16)
        .numpy()
        .view(np.uint16)
    )


def to_fp32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.bfloat16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


@dataclass
class Row:
    values: np.ndarray  # raw table dtype
    state: np.ndarray  # fp32 optimizer state
    last_tick: int = 0
    touches: int = 0
    touched_at: float = 0.0


@dataclass
class OracleTable:
    spec: TableSpec
    num_shards: int = 1
    shard_index: int = 0
    now: float = 0.0
    rows: dict[int, Row] = field(default_factory=dict)
    tick: int = 1
    step: int = 0
    skipped: int = 0  # keys the skip-rows policy left out

    def __post_init__(self) -> None:
        layout = shard_layout(self.spec, self.shard_index, self.num_shards)
        self.capacity = layout.capacity
        self.id_limit = layout.id_limit
        self.dtype = DType(self.spec.dtype)
        self.dim = self.spec.embedding_dim
        self.width = self.spec.optimizer.state_width(self.dim)
        keys = self.spec.keys
        self.eviction = keys.eviction if keys.mode == "hashed" else "none"
        self.ttl = keys.ttl_seconds if keys.mode == "hashed" else None
        self.tracking = self.eviction != "none" or self.ttl is not None

    # -- helpers -------------------------------------------------------------
    def _check(self, keys: list[int]) -> None:
        if self.id_limit and any(not 0 <= k < self.id_limit for k in keys):
            raise InvalidArgument("id out of range")

    def _screen(
        self, keys: list[int], rows: np.ndarray, dtype: DType, what: str
    ) -> tuple[list[int], np.ndarray]:
        """The batch the non-finite policy lets through (rows in ``dtype``'s raw storage)."""
        self._check(keys)
        policy = NonFinite(self.spec.non_finite)
        bad = [i for i in range(len(keys)) if not np.isfinite(to_fp32(rows[i], dtype)).all()]
        if not bad or policy == NonFinite.allow:
            return keys, rows
        if policy == NonFinite.reject:
            raise NonFiniteValues(
                f"table {self.spec.name!r}: {len(bad)} of {len(keys)} {what} rows hold NaN or "
                f"infinite values (the first: key {keys[bad[0]]}, at position {bad[0]}); "
                "nothing was applied (nonFinite: reject)",
                table=self.spec.name,
            )
        poisoned = {keys[i] for i in bad}
        self.skipped += len(poisoned)
        kept = [i for i, k in enumerate(keys) if k not in poisoned]
        return [keys[i] for i in kept], rows[kept]

    def _expired(self, row: Row) -> bool:
        return self.ttl is not None and self.now - row.touched_at > self.ttl

    def _fresh_state(self) -> np.ndarray:
        opt = self.spec.optimizer
        fill = 0.0 if opt.kind == "adam" else opt.initial_accumulator_value
        return np.full(self.width, fill, dtype=np.float32)

    def _new_row(self, key: int) -> Row:
        return Row(to_table_dtype(initial_row(self.spec, key), self.dtype), self._fresh_state())

    def _resolve(self, keys: list[int], initialise: bool = True) -> None:
        """Give every key a row (inserting, evicting), then touch them all."""
        self._check(keys)
        batch = set(keys)
        missing = sorted(k for k in batch if k not in self.rows)
        stale = [k for k in batch if k in self.rows and self._expired(self.rows[k])]
        shortfall = len(missing) - (self.capacity - len(self.rows))
        if shortfall > 0:
            if not self.tracking:
                raise CapacityExhausted("full")
            candidates = []
            for k, r in self.rows.items():
                if k in batch:
                    continue
                gone = self._expired(r)
                if not gone and self.eviction == "none":
                    continue
                rank = r.touches if self.eviction == "lfu" else 0
                candidates.append(((0 if gone else 1, rank, r.last_tick), k))
            if len(candidates) < shortfall:
                raise CapacityExhausted("full")
            for _, k in sorted(candidates)[:shortfall]:
                del self.rows[k]
        for k in stale:
            self.rows[k] = self._new_row(k)
        for k in missing:
            self.rows[k] = self._new_row(k)
        if self.tracking:
            base = self.tick
            self.tick += len(keys)
            for i, k in enumerate(keys):
                r = self.rows[k]
                if r.last_tick < base:
                    r.touches += 1
                r.last_tick = base + i
                r.touched_at = self.now

    # -- the table API -----------------------------------------------------------
    def pull(self, keys: list[int]) -> np.ndarray:
        self._resolve(keys)
        out = np.empty(
            (len(keys), self.dim), dtype=to_table_dtype(np.zeros(1, np.float32), self.dtype).dtype
        )
        for i, k in enumerate(keys):
            out[i] = self.rows[k].values
        return out

    def find(self, keys: list[int]) -> tuple[np.ndarray, np.ndarray]:
        self._check(keys)
        raw = to_table_dtype(np.zeros((len(keys), self.dim), np.float32), self.dtype)
        found = np.zeros(len(keys), dtype=bool)
        for i, k in enumerate(keys):
            r = self.rows.get(k)
            if r is not None and not self._expired(r):
                raw[i] = r.values
                found[i] = True
        return raw, found

    def push(self, keys: list[int], values: np.ndarray) -> None:
        keys, values = self._screen(keys, values, self.dtype, "value")
        self._resolve(keys, initialise=False)
        for i, k in enumerate(keys):
            self.rows[k].values = values[i].copy()

    def update(self, keys: list[int], grads: np.ndarray, lr: float | None = None) -> None:
        """``grads`` fp32 (or raw rows of the table dtype, the engine's other choice)."""
        grad_dtype = DType.float32 if grads.dtype == np.float32 else self.dtype
        keys, grads = self._screen(keys, grads, grad_dtype, "gradient")
        grads = to_fp32(grads, grad_dtype)
        self._resolve(keys)
        self.step += 1
        opt = self.spec.optimizer
        lr = opt.lr if lr is None else lr
        merged: dict[int, np.ndarray] = {}
        for i, k in enumerate(keys):
            merged[k] = merged.get(k, np.zeros(self.dim, np.float32)) + grads[i]
        f = np.float32
        for k, g in merged.items():
            r = self.rows[k]
            w = to_fp32(r.values, self.dtype)
            g = g + f(opt.weight_decay) * w
            if opt.kind == "sgd":
                w = w - f(lr) * g
            elif opt.kind == "adagrad":
                r.state = r.state + g * g
                w = w - f(lr) * (g / (np.sqrt(r.state) + f(opt.eps)))
            elif opt.kind == "rowwise_adagrad":
                r.state = r.state + np.float32(np.sum(g * g, dtype=np.float32) / f(self.dim))
                w = w - f(lr) * g * (f(1.0) / (np.sqrt(r.state[0]) + f(opt.eps)))
            else:
                m = r.state[: self.dim] + (g - r.state[: self.dim]) * f(1 - opt.beta1)
                v = r.state[self.dim :] + (g * g - r.state[self.dim :]) * f(1 - opt.beta2)
                r.state = np.concatenate([m, v])
                bc1 = 1 - opt.beta1**self.step
                bc2 = 1 - opt.beta2**self.step
                step_size = f(lr * math.sqrt(bc2) / bc1)
                w = w - step_size * (m / (np.sqrt(v) + f(opt.eps)))
            r.values = to_table_dtype(w, self.dtype)

    def import_rows(self, keys: list[int], values: np.ndarray, state: np.ndarray) -> None:
        """Rows with their optimizer state; only the values are screened."""
        kept_keys, kept_values = self._screen(keys, values, self.dtype, "value")
        kept_state = state[[i for i, k in enumerate(keys) if k in set(kept_keys)]]
        self._resolve(kept_keys, initialise=False)
        for i, k in enumerate(kept_keys):
            self.rows[k].values = kept_values[i].copy()
            self.rows[k].state = kept_state[i].copy()

    def erase(self, keys: list[int]) -> int:
        self._check(keys)
        removed = 0
        for k in keys:
            r = self.rows.pop(k, None)
            if r is not None and not self._expired(r):
                removed += 1
        return removed

    def expire(self) -> int:
        gone = [k for k, r in self.rows.items() if self._expired(r)]
        for k in gone:
            del self.rows[k]
        return len(gone) if self.ttl is not None else 0

    def live(self) -> dict[int, Row]:
        return {k: r for k, r in self.rows.items() if not self._expired(r)}
