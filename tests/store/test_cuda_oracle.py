"""The CUDA table against the CPU engine (its oracle) on the same inputs.

Every test builds the same table twice, ``device="cpu"`` and ``device="cuda"``,
drives both with identical operations (torch CUDA tensors into the GPU table,
numpy arrays into the CPU one) and requires the same rows, found masks, return
values, resident keys and counters. Initial rows must match bit for bit; the
optimizer math runs without fused multiply-adds on the GPU, so updated rows
agree to within fp32 rounding (the row-wise mean of RowWiseAdagrad is summed in
another order). Runs only where a CUDA device is visible (scripts/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from recstore.core import CapacityExhausted, DType, InvalidArgument, NonFiniteValues, TableSpec
from recstore.store import Table

from .cuda_device import CUDA_ONLY, to_raw

pytestmark = CUDA_ONLY

DTYPES = ["float32", "float16", "bfloat16"]
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
TORCH_RAW = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


# ---------------------------------------------------------------- conversions
def as_fp32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def from_fp32(rows: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 rows rounded to the table's raw storage (round to nearest even)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if dtype == "float32":
        return rows
    if dtype == "float16":
        return rows.astype(np.float16)
    bits = rows.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def to_cuda(raw: np.ndarray) -> Any:
    """numpy raw storage -> a CUDA tensor of the matching torch dtype."""
    if raw.dtype == np.uint16:
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(np.ascontiguousarray(raw)).cuda()


def cuda_keys(keys: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(keys, dtype=np.int64)).cuda()


def assert_bit_identical(gpu: np.ndarray, cpu: np.ndarray, transcendental: bool) -> None:
    """Equal bits; rows made with log/cos (the normal initializer) may differ by one
    unit in the last place in a rare element, where CUDA's and libm's double results
    straddle a rounding boundary."""
    if not transcendental:
        np.testing.assert_array_equal(gpu, cpu)
        return
    signed = np.int32 if gpu.dtype == np.float32 else np.int16
    ulps = np.abs(gpu.view(signed).astype(np.int64) - cpu.view(signed).astype(np.int64))
    assert ulps.max(initial=0) <= 1
    assert np.count_nonzero(ulps) <= max(1, ulps.size // 10_000)


# ---------------------------------------------------------------- the pair
class Pair:
    """One spec on both devices, with one injectable clock."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.now = 1000.0
        clock: Callable[[], float] = lambda: self.now  # noqa: E731
        self.cpu = Table(spec, device="cpu", clock=clock)
        self.gpu = Table(spec, device="cuda", clock=clock)
        self.dtype = DType(spec.dtype).value

    def rows_close(self, gpu: Any, cpu: Any, exact: bool = False) -> None:
        g, c = to_raw(gpu), to_raw(cpu)
        assert g.shape == c.shape and g.dtype == c.dtype
        if exact:
            assert_bit_identical(g, c, self.spec.initializer.kind == "normal")
            return
        # fp32: a few roundings apart; half tables: one unit in the last place.
        tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[self.dtype]
        np.testing.assert_allclose(
            as_fp32(g, self.dtype), as_fp32(c, self.dtype), rtol=tol, atol=tol / 10
        )

    def pull(self, keys: np.ndarray, exact: bool = False) -> None:
        self.rows_close(self.gpu.pull(cuda_keys(keys)), self.cpu.pull(keys), exact)

    def find(self, keys: np.ndarray) -> None:
        gv, gf = self.gpu.find(cuda_keys(keys))
        cv, cf = self.cpu.find(keys)
        np.testing.assert_array_equal(to_raw(gf), cf)
        self.rows_close(gv, cv)

    def push(self, keys: np.ndarray, rows_fp32: np.ndarray) -> None:
        raw = from_fp32(rows_fp32, self.dtype)
        self.gpu.push(cuda_keys(keys), to_cuda(raw))
        self.cpu.push(keys, raw)

    def update(self, keys: np.ndarray, grads: np.ndarray, lr: float | None = None) -> None:
        self.gpu.update(cuda_keys(keys), to_cuda(grads), lr)
        self.cpu.update(keys, grads, lr)

    def erase(self, keys: np.ndarray) -> None:
        assert self.gpu.erase(cuda_keys(keys)) == self.cpu.erase(keys)

    def exported(self, table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        chunks = list(table.export_chunks(chunk_rows=1000))
        if not chunks:
            w = self.spec.optimizer.state_width(self.spec.embedding_dim)
            empty = from_fp32(np.zeros((0, self.spec.embedding_dim), np.float32), self.dtype)
            return np.zeros(0, np.int64), empty, np.zeros((0, w), np.float32)
        keys = np.concatenate([c.keys for c in chunks])
        order = np.argsort(keys, kind="stable")
        values = np.concatenate([c.values for c in chunks])[order]
        state = np.concatenate([c.state for c in chunks])[order]
        return keys[order], values, state

    def same_contents(self, exact: bool = False) -> None:
        gk, gv, gs = self.exported(self.gpu)
        ck, cv, cs = self.exported(self.cpu)
        np.testing.assert_array_equal(gk, ck)
        self.rows_close(gv, cv, exact)
        np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-7)
        g, c = self.gpu.stats(), self.cpu.stats()
        for name in ("size", "capacity", "inserts", "evictions", "expirations", "erasures", "step"):
            assert g[name] == c[name], name


def spec_of(
    mode: str = "hashed",
    dtype: str = "float32",
    optimizer: str = "sgd",
    dim: int = 8,
    capacity: int = 512,
    eviction: str = "none",
    ttl: float | None = None,
    init: str = "normal",
    weight_decay: float = 0.0,
) -> TableSpec:
    keys: dict[str, Any] = {"mode": mode}
    if mode == "hashed":
        keys.update(capacity=capacity, eviction=eviction, ttl_seconds=ttl)
    return TableSpec.model_validate(
        {
            "name": "t",
            "num_embeddings": capacity if mode == "dense" else 10**6,
            "embedding_dim": dim,
            "dtype": dtype,
            "keys": keys,
            "initializer": {"kind": init, "seed": 7, "std": 0.5, "low": -0.5, "high": 0.5},
            "optimizer": {"kind": optimizer, "lr": 0.05, "weight_decay": weight_decay},
        }
    )


def draw_keys(rng: np.random.Generator, mode: str, n: int, universe: int = 300) -> np.ndarray:
    """Keys drawn from `universe` distinct ones (dense: ids 0..universe-1)."""
    keys = rng.integers(0, universe, size=n, dtype=np.int64)
    if mode == "hashed":  # arbitrary int64 keys, negative ones too, with repeats
        keys = (keys * 0x9E3779B97F4A7C1) - (1 << 40)
    return keys


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("init", ["zeros", "normal", "uniform"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_initial_rows_are_bit_identical(init: str, dtype: str) -> None:
    pair = Pair(spec_of(dtype=dtype, init=init, dim=33, capacity=5000))
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(-(2**62), 2**62, size=4096, dtype=np.int64))
    pair.pull(keys, exact=True)
    pair.same_contents(exact=True)


@pytest.mark.parametrize("mode", ["dense", "hashed"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_operation_sequences_match_the_cpu_engine(
    mode: str, optimizer: str, dtype: str
) -> None:
    dim = 12 if dtype == "float32" else 10  # odd vector widths on the half tables
    pair = Pair(spec_of(mode, dtype, optimizer, dim=dim, capacity=400, weight_decay=0.01))
    rng = np.random.default_rng(
        [["dense", "hashed"].index(mode), OPTIMIZERS.index(optimizer), DTYPES.index(dtype)]
    )
    for step in range(12):
        keys = draw_keys(rng, mode, int(rng.integers(1, 200)))
        op = step % 6
        if op == 0:
            pair.pull(keys)
        elif op == 1:
            pair.update(keys, rng.normal(size=(len(keys), dim)).astype(np.float32))
        elif op == 2:
            pair.push(keys, rng.normal(size=(len(keys), dim)).astype(np.float32))
        elif op == 3:
            pair.find(draw_keys(rng, mode, 150, universe=400 if mode == "dense" else 600))
        elif op == 4:
            grads = from_fp32(rng.normal(size=(len(keys), dim)), dtype)
            pair.update(keys, grads, lr=0.2)
        else:
            pair.erase(keys[: len(keys) // 3])
        pair.same_contents()
    assert pair.gpu.optimizer_state() == pair.cpu.optimizer_state()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_export_import_round_trip_through_the_gpu(optimizer: str) -> None:
    pair = Pair(spec_of("hashed", "bfloat16", optimizer, dim=16, capacity=3000))
    rng = np.random.default_rng(5)
    keys = draw_keys(rng, "hashed", 2000, universe=2500)
    pair.pull(keys)
    pair.update(keys, rng.normal(size=(len(keys), 16)).astype(np.float32))
    pair.same_contents()
    fresh = Table(pair.spec, device="cuda")
    for chunk in pair.gpu.export_chunks(chunk_rows=333):
        fresh.import_chunk(cuda_keys(chunk.keys), to_cuda(chunk.values), to_cuda(chunk.state))
    fresh.load_optimizer_state(pair.gpu.optimizer_state())
    for copied, original in zip(pair.exported(fresh), pair.exported(pair.gpu), strict=True):
        np.testing.assert_array_equal(copied, original)
    assert fresh.size == pair.gpu.size
    assert fresh.optimizer_state() == pair.gpu.optimizer_state()


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
@pytest.mark.parametrize("ttl", [None, 5.0])
def test_eviction_and_expiry_pick_the_same_rows(eviction: str, ttl: float | None) -> None:
    pair = Pair(spec_of("hashed", optimizer="adagrad", capacity=64, eviction=eviction, ttl=ttl))
    rng = np.random.default_rng(11)
    for step in range(30):
        pair.now += float(rng.uniform(0, 2))
        keys = draw_keys(rng, "hashed", int(rng.integers(1, 40)), universe=160)
        if step % 3 == 2:
            pair.update(keys, rng.normal(size=(len(keys), 8)).astype(np.float32))
        elif step % 7 == 6:
            pair.erase(keys)
        elif step % 11 == 10 and ttl is not None:
            assert pair.gpu.expire() == pair.cpu.expire()
        else:
            pair.pull(keys)
        pair.find(draw_keys(rng, "hashed", 50, universe=160))
        pair.same_contents()
    assert pair.gpu.stats()["evictions"] > 0


def test_a_full_table_without_eviction_refuses_and_changes_nothing() -> None:
    pair = Pair(spec_of("hashed", capacity=32))
    keys = np.arange(32, dtype=np.int64)
    pair.pull(keys)
    before = pair.exported(pair.gpu)
    more = np.arange(30, 40, dtype=np.int64)
    with pytest.raises(CapacityExhausted):
        pair.gpu.pull(cuda_keys(more))
    with pytest.raises(CapacityExhausted):
        pair.gpu.update(cuda_keys(more), torch.ones((10, 8), device="cuda"))
    for a, b in zip(pair.exported(pair.gpu), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert pair.gpu.size == 32 and pair.gpu.optimizer_state() == {"step": 0}


def test_bad_dense_ids_are_rejected_and_change_nothing() -> None:
    pair = Pair(spec_of("dense", capacity=100, optimizer="adam"))
    pair.pull(np.arange(0, 100, 3, dtype=np.int64))
    before = pair.exported(pair.gpu)
    bad = cuda_keys(np.array([1, 2, 100], dtype=np.int64))
    grads = torch.ones((3, 8), device="cuda")
    calls = [
        lambda: pair.gpu.pull(bad),
        lambda: pair.gpu.find(bad),
        lambda: pair.gpu.push(bad, grads),
        lambda: pair.gpu.update(bad, grads),
        lambda: pair.gpu.erase(bad),
        lambda: pair.gpu.import_chunk(bad, grads, torch.zeros((3, 16), device="cuda")),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument, match="id 100 at position 2"):
            call()
    for a, b in zip(pair.exported(pair.gpu), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert pair.gpu.optimizer_state() == {"step": 0}
    with pytest.raises(InvalidArgument, match="id -1 at position 0"):
        pair.gpu.pull(cuda_keys(np.array([-1], dtype=np.int64)))


def test_host_buffers_work_on_a_cuda_table() -> None:
    pair = Pair(spec_of("hashed", "float16", "adagrad", dim=6))
    keys = np.array([5, -3, 5, 1 << 50], dtype=np.int64)
    out = pair.gpu.pull(keys)  # numpy in, numpy out, staged through the device
    assert isinstance(out, np.ndarray)
    pair.rows_close(out, pair.cpu.pull(keys), exact=True)
    grads = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    pair.gpu.update(keys, grads)
    pair.cpu.update(keys, grads)
    values, found = pair.gpu.find(np.array([5, 6], dtype=np.int64))
    cpu_values, cpu_found = pair.cpu.find(np.array([5, 6], dtype=np.int64))
    np.testing.assert_array_equal(found, cpu_found)
    pair.rows_close(values, cpu_values)


def test_native_calls_take_device_buffers_and_a_side_stream() -> None:
    spec = spec_of("hashed", dim=64, capacity=100_000, init="uniform")
    pair = Pair(spec)
    engine = pair.gpu._engine
    rng = np.random.default_rng(3)
    keys_np = rng.integers(-(2**40), 2**40, size=50_000, dtype=np.int64)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        keys = cuda_keys(keys_np)
        out = torch.empty((len(keys_np), 64), device="cuda")
        engine.pull(keys, out)  # the current (side) stream
        found = torch.zeros(len(keys_np) + 10, dtype=torch.bool, device="cuda")
        probe = torch.cat([keys, cuda_keys(np.arange(10, dtype=np.int64) + 2**45)])
        again = torch.empty((len(probe), 64), device="cuda")
        engine.find(probe, again, found, stream=side)
    side.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), pair.cpu.pull(keys_np))
    np.testing.assert_array_equal(again[: len(keys_np)].cpu().numpy(), out.cpu().numpy())
    assert found[: len(keys_np)].all() and not found[len(keys_np) :].any()
    assert not again[len(keys_np) :].any()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dense", "hashed"])
def test_large_batches_with_many_duplicates(mode: str) -> None:
    pair = Pair(spec_of(mode, "float32", "adam", dim=32, capacity=200_000))
    rng = np.random.default_rng(9)
    for _ in range(3):
        keys = draw_keys(rng, mode, 300_000, universe=150_000)
        pair.pull(keys)
        pair.update(keys, rng.normal(size=(len(keys), 32)).astype(np.float32))
    pair.find(draw_keys(rng, mode, 100_000, universe=200_000))
    pair.same_contents()


def test_threads_sharing_a_cuda_table_each_see_their_own_rows() -> None:
    from concurrent.futures import ThreadPoolExecutor

    pair = Pair(spec_of("hashed", "float32", "adagrad", dim=16, capacity=20_000, init="uniform"))
    rng = np.random.default_rng(17)
    plans = [
        [(rng.integers(0, 1000, 500) + 1000 * worker, rng.normal(size=(500, 16))) for _ in range(5)]
        for worker in range(4)
    ]

    def run(plan: list[tuple[np.ndarray, np.ndarray]], table: Table, device: bool) -> None:
        for keys, grads in plan:
            k = cuda_keys(keys) if device else keys
            g = to_cuda(grads.astype(np.float32)) if device else grads.astype(np.float32)
            table.pull(k)
            table.update(k, g)
            table.find(k)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda plan: run(plan, pair.gpu, True), plans))
    torch.cuda.synchronize()
    for plan in plans:  # disjoint keys per thread: the order between threads is irrelevant
        run(plan, pair.cpu, False)
    gk, gv, gs = pair.exported(pair.gpu)
    ck, cv, cs = pair.exported(pair.cpu)
    np.testing.assert_array_equal(gk, ck)
    pair.rows_close(gv, cv)
    np.testing.assert_allclose(gs, cs, rtol=1e-5, atol=1e-7)


def _non_finite_spec(policy: str, optimizer: str, dtype: str) -> TableSpec:
    return spec_of("dense", dtype, optimizer, capacity=64).model_copy(update={"non_finite": policy})


@pytest.mark.parametrize("write", ["update", "push", "import"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", ["reject", "skip-rows", "allow"])
def test_non_finite_policies_match_the_cpu_engine(
    policy: str, dtype: str, optimizer: str, write: str
) -> None:
    pair = Pair(_non_finite_spec(policy, optimizer, dtype))
    keys = np.array([1, 3, 11, 4, 20, 4, 7], dtype=np.int64)
    pair.update(keys[:4], np.ones((4, 8), np.float32))  # rows with optimizer state
    rows = np.random.default_rng(5).normal(size=(len(keys), 8)).astype(np.float32)
    rows[2, 1], rows[5, 7] = np.nan, np.inf
    raw = from_fp32(rows, pair.dtype)
    width = pair.spec.optimizer.state_width(8)
    state = np.full((len(keys), width), 0.5, np.float32)
    calls = {
        "update": (lambda t, k, r, _: t.update(k, r), rows),
        "push": (lambda t, k, r, _: t.push(k, r), raw),
        "import": (lambda t, k, r, w: t.import_chunk(k, r, w), raw),
    }
    call, given = calls[write]
    outcomes = []
    for table, k, r, w in (
        (pair.gpu, cuda_keys(keys), to_cuda(given), to_cuda(state)),
        (pair.cpu, keys, given, state),
    ):
        try:
            call(table, k, r, w)
            outcomes.append(None)
        except NonFiniteValues as error:
            outcomes.append(str(error))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] is not None) == (policy == "reject")
    if policy == "allow":  # NaN rows on both: compare where they are
        gv, cv = pair.exported(pair.gpu)[1], pair.exported(pair.cpu)[1]
        np.testing.assert_array_equal(
            np.isnan(as_fp32(to_raw(gv), pair.dtype)), np.isnan(as_fp32(cv, pair.dtype))
        )
        return
    pair.same_contents()
    assert pair.gpu.stats()["nonfinite_skipped"] == pair.cpu.stats()["nonfinite_skipped"]
    assert pair.cpu.stats()["nonfinite_skipped"] == (2 if policy == "skip-rows" else 0)
