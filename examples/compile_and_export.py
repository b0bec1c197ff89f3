"""torch.compile and export for serving with RecStore embeddings (local backend).

Trains the DLRM example a few steps in eager and, from the same start, compiled
with ``torch.compile``; checks that both give the same losses and tables; then
saves the compiled-trained model with ``recstore.export.save`` (the batch size
symbolic) and serves it back with ``recstore.export.load`` at two batch sizes.

    python examples/compile_and_export.py [--steps 5 --backend aot_eager --out /tmp/ranker]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from dlrm_synthetic import DLRM, DataConfig, SyntheticClicks, dense_optimizer, recstore_bags
from dlrm_synthetic import train_step as step
from torch.export import Dim

from recstore import RecStoreClient, export


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--out", type=Path, help="package directory (default: a temporary one)")
    args = parser.parse_args(argv)

    client = RecStoreClient(role="compile-example")
    client.set_ps_backend("local")
    config = DataConfig(num_features=3, cardinality=1000, batch_size=64, seed=5)
    data = SyntheticClicks(config)
    batches = [data.batch(i) for i in range(args.steps)]
    models = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = DLRM(config, 8, recstore_bags(client, lr=0.5))
        runner = torch.compile(model, backend=args.backend) if compiled else model
        optimizers = dense_optimizer(model, 0.5)
        losses = [step(runner, optimizers, batch) for batch in batches]  # type: ignore[arg-type]
        models.append((model, losses))
    (eager, eager_losses), (trained, compiled_losses) = models
    print("eager losses:   ", " ".join(f"{x:.5f}" for x in eager_losses))
    print("compiled losses:", " ".join(f"{x:.5f}" for x in compiled_losses))
    worst = max(
        float((a.weight - b.weight).abs().max())
        for a, b in zip(eager.bags, trained.bags, strict=True)  # type: ignore[union-attr]
    )
    print(f"largest table difference eager vs compiled: {worst:.2e}")

    dense, sparse, offsets, _ = data.batch(args.steps)
    # any batch size: the batch and id counts are symbolic in the exported program
    batch, ids = Dim("batch", min=1, max=1 << 16), Dim("ids", min=1, max=1 << 24)
    shapes = ({0: batch}, [{0: ids}] * len(sparse), {0: batch})
    small = (dense[:5], [s[: 5 * config.bag_size] for s in sparse], offsets[:5])
    with tempfile.TemporaryDirectory() as scratch:
        out = export.save(trained, (dense, sparse, offsets), args.out or Path(scratch) / "ranker",
                          dynamic_shapes=shapes)  # fmt: skip
        print(f"saved {sorted(p.name for p in out.iterdir())} to {out}")
        served = export.load(out)
        with torch.no_grad():
            difference = max(
                float((served(*inputs) - trained(*inputs)).abs().max())
                for inputs in ((dense, sparse, offsets), small)
            )
        served.close()
    print(f"served vs eager output (batches of {len(dense)} and 5): "
          f"largest difference {difference:.2e}")  # fmt: skip
    same_losses = all(
        abs(a - b) <= 1e-5 for a, b in zip(eager_losses, compiled_losses, strict=True)
    )
    if not same_losses or worst > 1e-5 or difference > 1e-6:
        raise SystemExit("compiled training or the served model differs from eager")
    for model, _ in models:
        for bag in model.bags:
            client.delete_data(str(bag.table_name))


if __name__ == "__main__":
    main()
