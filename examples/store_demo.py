"""A tour of the native store engine through its Python facade (what `make demo` runs).

Creates a dense and a hashed table, pulls rows (created from the initializer on
first touch), trains them a few steps with Adagrad and Adam, exports them as
checkpoint chunks and imports them into fresh tables, and prints a summary.
Runs in a few seconds on a laptop CPU.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from recstore import _native
from recstore.core import TableSpec
from recstore.store import Store


def main() -> None:
    started = time.perf_counter()
    store = Store()
    dense = store.create(
        TableSpec(
            name="user_emb",
            num_embeddings=1_000_000,
            embedding_dim=64,
            initializer={"kind": "normal", "std": 0.01, "seed": 7},
            optimizer={"kind": "adagrad", "lr": 0.002},
        )
    )
    hashed = store.create(
        TableSpec(
            name="item_emb",
            num_embeddings=2**62,
            embedding_dim=32,
            dtype="bfloat16",
            keys={"mode": "hashed", "capacity": 200_000, "eviction": "lru"},
            initializer={"kind": "uniform", "low": -0.05, "high": 0.05},
            optimizer={"kind": "adam", "lr": 0.01},
        )
    )
    rng = np.random.default_rng(0)
    print(
        f"tables: {store.names()}  (CUDA build: {_native.built_with_cuda()}, "
        f"GPU usable: {_native.cuda_available()})"
    )

    # Training-like loop: pull a batch, compute a gradient, push it back through the optimizer.
    for step in range(20):
        users = torch.from_numpy(rng.integers(0, 50_000, 65_536))
        items = torch.from_numpy(rng.integers(-(2**62), 2**62, 16_384))
        u = dense.pull(users)  # torch in -> torch out
        it = hashed.pull(items)
        dense.update(users, 2 * u)  # gradient of sum(u^2): rows shrink towards zero
        hashed.update(items, it.float())
        if step == 0:
            first_norm = float(u.norm(dim=1).mean())
    last_norm = float(dense.pull(users).norm(dim=1).mean())
    print(f"user_emb: mean row norm {first_norm:.4f} -> {last_norm:.4f} after 20 Adagrad steps")
    for t in (dense, hashed):
        s = t.stats()
        print(
            f"{t.name}: {s['size']:,} rows of {s['capacity']:,}, "
            f"{s['memory_bytes'] / 2**20:.1f} MiB, inserts {s['inserts']:,}, "
            f"evictions {s['evictions']:,}, optimizer {t.optimizer_state()}"
        )

    # Checkpoint round trip: chunks of keys + raw values + optimizer state.
    for t in (dense, hashed):
        copy = store.create(t.spec.model_copy(update={"name": t.name + "-restored"}))
        chunks = 0
        for chunk in t.export_chunks(chunk_rows=65_536):
            copy.import_chunk(chunk.keys, chunk.values, chunk.state)
            chunks += 1
        copy.load_optimizer_state(t.optimizer_state())
        probe = np.array(next(iter(t.export_chunks(chunk_rows=8))).keys)
        same = np.array_equal(t.find(probe)[0], copy.find(probe)[0])
        print(f"{t.name}: exported {chunks} chunks into {copy.name}; rows identical: {same}")
    print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
