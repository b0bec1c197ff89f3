"""The NV Embedding Cache reference's inference sample, on recstore.nve.

Same command line as the reference's ``inference_sample.py``::

    python examples/nve_inference.py --batch-size 1024 --hotness 32 \
        --num-iterations 1000 --cache-size 1024 --data-type float32

Bags of ``--hotness`` keys are pooled (sum) by an inference ``NVEmbeddingBag``
whose rows sit behind a cache of ``--cache-size`` bytes: a ``LinearUVM`` layer
(host rows, GPU cache) on a machine with a GPU, else a ``Hierarchical`` layer
over an in-process RecStore table with a host cache of that size. Each output
is checked against ``torch.nn.functional.embedding_bag`` on the same weights
(within the rounding of a sum in another order);
the run prints lookups per second and the cache's counters.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import recstore.nve as nve
from recstore import RecStoreClient

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: the rows come back exact; a bag's sum may round in another order than torch's
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def build_layer(args: argparse.Namespace, weight: torch.Tensor) -> nve.NVEmbeddingBag:
    dtype = DTYPES[args.data_type]
    if torch.cuda.is_available():
        return nve.NVEmbeddingBag(
            args.num_embeddings, args.embedding_size, dtype, nve.LayerType.LinearUVM,
            gpu_cache_size=args.cache_size, weight_init=weight, optimize_for_training=False,
        )  # fmt: skip
    client = RecStoreClient(role="nve-inference-sample")
    client.set_ps_backend("local")
    return nve.NVEmbeddingBag(
        args.num_embeddings, args.embedding_size, dtype, nve.LayerType.Hierarchical,
        weight_init=weight, optimize_for_training=False, device="cpu",
        storage=nve.RemoteTable(client, f"nve_inference_{args.seed}"),
        config={"host_cache_size": args.cache_size},
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1024, help="bags per lookup")
    parser.add_argument("--hotness", type=int, default=32, help="keys per bag")
    parser.add_argument("--num-iterations", type=int, default=1000)
    parser.add_argument("--cache-size", type=int, default=1024, help="cache bytes")
    parser.add_argument("--data-type", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--num-embeddings", type=int, default=1 << 20)
    parser.add_argument("--embedding-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(args.seed)
    dtype = DTYPES[args.data_type]
    weight = torch.randn(args.num_embeddings, args.embedding_size, generator=generator).to(dtype)
    layer = build_layer(args, weight)
    device = layer.device
    keys_per_lookup = args.batch_size * args.hotness
    offsets = torch.arange(0, keys_per_lookup, args.hotness, device=device)
    reference_weight = weight.to(device)
    mismatches = 0
    elapsed = 0.0
    for _ in range(args.num_iterations):
        keys = torch.randint(0, args.num_embeddings, (keys_per_lookup,), generator=generator)
        keys = keys.to(device)
        started = time.perf_counter()
        with torch.no_grad():
            out = layer(keys, offsets)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - started
        expected = torch.nn.functional.embedding_bag(keys, reference_weight, offsets, mode="sum")
        if not torch.allclose(out, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]):
            mismatches += 1
    stats = layer.cache_stats()
    print(
        f"{layer.layer_type.name} on {device}: {args.num_iterations} lookups of "
        f"{args.batch_size} bags x {args.hotness} keys, {args.data_type}, "
        f"cache {args.cache_size} bytes"
    )
    print(f"{args.num_iterations * keys_per_lookup / elapsed:.3e} keys/s")
    print(
        f"cache: hits {stats['hits']} misses {stats['misses']} "
        f"hit rate {float(stats['hit_rate']):.4f}"  # type: ignore[arg-type]
    )
    if mismatches:
        print(f"{mismatches} of {args.num_iterations} outputs differ from embedding_bag")
        return 1
    print("every output agrees with torch.nn.functional.embedding_bag")
    return 0


if __name__ == "__main__":
    sys.exit(main())
