"""Memory of a DCP save of a recstore.nn table: row blocks against the whole tensor.

For each table size, a local-backend ``recstore.nn.EmbeddingBag`` (its rows in
this process's store) is saved twice into a fresh directory: with
``recstore.client.checkpoint.save`` (row blocks) and, as the baseline in the
same run, with ``dcp.save(model.state_dict())`` (the table materialised as
one tensor). Each save's peak resident memory above the memory before it is
read from the kernel (``VmHWM`` after resetting it through
``/proc/self/clear_refs``), so no sampling is involved. The table's own
memory per row is measured too; together they give the largest table a save
handles on this machine (``MemAvailable`` before the run). Prints a table and
writes bench/results/dcp_bench.json.

Usage: python bench/dcp_bench.py [--gib 0.5,1,2] [--dim 128] [--dir /tmp/dcp_bench]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from recstore import RecStoreClient
from recstore import nn as rnn
from recstore.client import checkpoint

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def _status_kib(field: str, path: str = "/proc/self/status") -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _meminfo_kib(field: str) -> int:
    return _status_kib(field, "/proc/meminfo")


def _peak_above(run) -> int:
    """Bytes of resident memory ``run()`` needed above what the process held before it."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed buffers go back: they would hide a peak
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    run()
    return (_status_kib("VmHWM") - before) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", default="0.5,1,2")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dir", default="/tmp/dcp_bench")
    parser.add_argument("--out", default=str(ROOT / "bench/results/dcp_bench.json"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # DCP without a process group says so each time
    available = _meminfo_kib("MemAvailable") * 1024
    client = RecStoreClient(role="dcp_bench")
    client.set_ps_backend("local")
    results = []
    for gib in (float(g) for g in args.gib.split(",")):
        rows = int(gib * GIB) // (args.dim * 4)
        resident = _status_kib("VmRSS") * 1024
        bag = rnn.EmbeddingBag(rows, args.dim, client=client, name=f"bench_{rows}")
        weight = bag.table_weight()
        for start, end in weight.blocks():  # a dense table's rows come into being when read
            weight.read(start, end)
        table_bytes = _status_kib("VmRSS") * 1024 - resident
        model = torch.nn.ModuleDict({"bag": bag})
        target = Path(args.dir)
        shutil.rmtree(target, ignore_errors=True)
        blocks = _peak_above(lambda: checkpoint.save(model, target / "blocks"))  # noqa: B023
        shutil.rmtree(target, ignore_errors=True)
        whole = _peak_above(
            lambda: dcp.save(model.state_dict(), checkpoint_id=target / "whole")  # noqa: B023
        )
        shutil.rmtree(target, ignore_errors=True)
        client.delete_data(bag.table_name)
        results.append(
            {
                "table_gib": gib,
                "rows": rows,
                "dim": args.dim,
                "table_resident_bytes": table_bytes,
                "save_peak_blocks_bytes": blocks,
                "save_peak_whole_bytes": whole,
                "ratio_whole_over_blocks": whole / max(blocks, 1),
            }
        )
    worst_blocks = max(r["save_peak_blocks_bytes"] for r in results)
    biggest = max(results, key=lambda r: r["rows"])  # the store's overhead per row settles
    per_table_byte = biggest["table_resident_bytes"] / (biggest["table_gib"] * GIB)
    largest_local = (available - worst_blocks) / per_table_byte
    largest_whole = available / (per_table_byte + 1)  # the table twice: store + one tensor
    print(
        f"{'table GiB':>9} {'resident GiB':>12} {'blocks MiB':>10} {'whole MiB':>10} {'ratio':>6}"
    )
    for r in results:
        print(
            f"{r['table_gib']:>9.2f} {r['table_resident_bytes'] / GIB:>12.2f} "
            f"{r['save_peak_blocks_bytes'] / 2**20:>10.1f} "
            f"{r['save_peak_whole_bytes'] / 2**20:>10.1f} {r['ratio_whole_over_blocks']:>6.1f}"
        )
    print(
        f"MemAvailable {available / GIB:.1f} GiB: largest table a local-backend save handles "
        f"~{largest_local / GIB:.1f} GiB in row blocks, "
        f"~{largest_whole / GIB:.1f} GiB whole"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "available_bytes": available,
                "results": results,
                "largest_local_blocks_bytes": largest_local,
                "largest_local_whole_bytes": largest_whole,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
