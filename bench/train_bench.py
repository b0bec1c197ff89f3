"""Training throughput of the DLRM example: RecStore embedding bags vs torch's own.

The same model and data (examples/dlrm_synthetic.py) train with
``torch.nn.EmbeddingBag(sparse=True)`` + SGD (the baseline), with
``recstore.nn.EmbeddingBag`` on the local backend, and over gRPC to two PS node
processes on loopback twice: one module per bag (one Pull and one Update per
table and node: 32 RPCs a step) and the bags as one
``recstore.nn.EmbeddingBagCollection`` (one MultiPull per node, carrying the
previous step's updates: 2 RPCs a step). A last variant, ``transport-floor``,
is torch's step plus, per node, one gRPC request of the bytes the collection
variant sends per node and step, echoed back with the bytes it receives (echo
servers on loopback, no work behind them): the step time a remote variant
would have if the SDK and the nodes cost nothing beyond moving those bytes
through gRPC on this machine. ``recstore-local-compiled`` is the local
variant's model under ``torch.compile`` (inductor; compiled in the untimed
warm-up), the local variant's own model object, so both train the same tables
with the same optimizers (two models with tables of their own compared their
memory, not compilation: measured on 8 tables of 200k x 64, the same engine
calls ran ~25% slower on the tables of whichever model was built second). It
steps in turns with the eager local variant on the same batches
(``paired_steps``), and the median over those pairs of compiled / eager step
time is reported (target: <= 1.0, not slower). ``--clock cpu`` times steps by
this process's CPU time instead of the wall clock (with ``--no-grpc``): on a
loaded machine the wait for a core is the neighbours' load, not the step's.
The variants run interleaved, a few steps each per
round, so load on a shared machine hits them alike; the figure of merit is the
ratio of median step times to the baseline's (targets: local <= 1.2x, remote
<= 2x). By default an untimed pass over the batches first makes
every row they touch resident, so the timing is steady-state training (torch's
weights are all allocated up front); ``--cold`` times first touches as well
(each new id's row is created from the initializer on its first pull).
Prints a table, writes bench/results/train_bench.json.

``--tbe`` runs multi-hot embedding steps instead (``tbe_workloads``: 8 tables of
200k rows x 64, batch 2048; uniform ids with SGD, Zipf(1.05) ids with row-wise
Adagrad, one id per bag with SGD) for torch, FBGEMM's CPU TBE (when
``fbgemm-gpu-cpu`` is installed; skipped with a message otherwise), RecStore
local (eager and compiled) and over gRPC, with each one's speed relative to
FBGEMM's median step in the same run (target: RecStore local >= 1.0x) and a
check that RecStore local and FBGEMM tables agree after 3 steps. FBGEMM and
RecStore local (eager and compiled) step in turns on the same batches, so the
"paired" column (the median of FBGEMM's step / RecStore's, step by step) is
the load-robust figure. Torch's own model is also compiled and stepped in
turns with its eager self, as RecStore's is: the cost ``torch.compile`` adds
to a model with nothing for inductor to fuse, in the same run. The Criteo
Kaggle workload (``tbe_workloads.CRITEO``: 26 tables, dim 16, one id a bag,
skewed ids, row-wise Adagrad; cardinalities above 1M times ``--criteo-scale``)
runs FBGEMM, RecStore local and over gRPC (no torch), and profiles the collection's Python time
per step with its 26 tables and with each split in 10 (same rows).
``--tbe-no-torch`` leaves torch's model out of the other workloads. Writes
bench/results/train_bench_tbe.json.

    python bench/train_bench.py [--rounds 8 --steps-per-round 5 --no-grpc --no-compile --cold]
    python bench/train_bench.py --tbe [--rounds 5 --steps-per-round 4 --no-grpc --no-compile]
    python bench/train_bench.py --tbe --no-grpc --tbe-no-torch --tbe-rows 1000000 --threads 2
    python bench/train_bench.py [--tbe] --no-grpc --clock cpu
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import paired_steps as paired  # noqa: E402
from dlrm_synthetic import (  # noqa: E402
    DLRM,
    DataConfig,
    SyntheticClicks,
    dense_optimizer,
    recstore_bags,
    torch_bags,
    train_step,
)
from processes import free_port  # noqa: E402

from recstore import _native  # noqa: E402
from recstore.client import RecStoreClient  # noqa: E402
from recstore.client.remote.nodes import CHANNEL_OPTIONS, NodeCalls  # noqa: E402
from recstore.v1 import ps_pb2, ps_pb2_grpc  # noqa: E402

#: reply size (little-endian uint64) at the head of an echo request
ECHO_HEADER = struct.Struct("<Q")
ECHO_METHOD = "/bench.Echo/Echo"

PIPELINED = "recstore-grpc-2-shards-collection-pipelined"
LOCAL = "recstore-local"
COMPILED = "recstore-local-compiled"
#: torch's own TBE model under torch.compile: what compiling costs a model inductor
#: cannot fuse anything in, beside RecStore's figure
TORCH_COMPILED = "torch-compiled"
#: the TBE report's key and the printed label of each (eager, compiled) pair
COMPILE_KEYS = ("compiled_vs_eager", "torch_compiled_vs_eager")
COMPILE_WHAT = ("same model, local backend; target <= 1.0x", "torch.nn.EmbeddingBag model")
#: ``--clock``: wall time, or the CPU time of this process (on a loaded machine, time spent
#: waiting for a core is the neighbours' load, not the step's cost)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
TARGETS = {
    LOCAL: 1.2,
    COMPILED: 1.2,
    "recstore-grpc-2-shards": 2.0,
    "recstore-grpc-2-shards-collection": 2.0,
    PIPELINED: 2.0,
}


def _wait_ready(address: str, deadline: float) -> None:
    stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(address))
    while True:
        try:
            stub.ListTables(ps_pb2.ListTablesRequest(), timeout=1)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PS node at {address} did not start") from None
            time.sleep(0.1)


@contextlib.contextmanager
def ps_nodes(count: int) -> Iterator[list[str]]:
    """``count`` PS node processes (shards of one fleet) on loopback."""
    with tempfile.TemporaryDirectory() as data_dir:
        procs, addresses = [], []
        try:
            for index in range(count):
                port = free_port()
                command = [
                    sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1",
                    "--port", str(port), "--shard-index", str(index),
                    "--num-shards", str(count), "--data-dir", f"{data_dir}/{index}",
                ]  # fmt: skip
                procs.append(
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
                addresses.append(f"127.0.0.1:{port}")
            for address in addresses:
                _wait_ready(address, time.monotonic() + 60)
            yield addresses
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)


# -- the transport floor: the same bytes through gRPC, no work behind them ------------
async def _echo_server(port_file: Path) -> None:
    """A node that answers each request with as many zero bytes as its header asks for."""
    replies: dict[int, bytes] = {}

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        (size,) = ECHO_HEADER.unpack_from(request)
        if size not in replies:
            replies[size] = bytes(size)
        return replies[size]

    handler = grpc.unary_unary_rpc_method_handler(echo)
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


@contextlib.contextmanager
def echo_nodes(count: int) -> Iterator[list[str]]:
    with tempfile.TemporaryDirectory() as work:
        files = [Path(work) / f"echo{i}.port" for i in range(count)]
        procs = [
            subprocess.Popen([sys.executable, __file__, "--echo-server", str(f)]) for f in files
        ]
        try:
            deadline = time.monotonic() + 60
            while not all(f.exists() and f.read_text() for f in files):
                if time.monotonic() > deadline:
                    raise RuntimeError("echo servers did not start")
                time.sleep(0.05)
            yield [f"127.0.0.1:{f.read_text()}" for f in files]
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)


class TrafficMeter:
    """Bytes and data-path requests a client sends and receives (NodeCalls.start wrapped)."""

    def __init__(self) -> None:
        self.requests = self.sent = self.received = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        original = NodeCalls.start

        def start(calls: NodeCalls, method: str, request: bytes, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
            waiter = original(calls, method, request, *args, **kwargs)

            def wait() -> bytes:
                reply = waiter()
                with self._lock:
                    self.requests += 1
                    self.sent += len(request)
                    self.received += len(reply)
                return reply

            return wait

        setattr(NodeCalls, "start", start)  # noqa: B010 (a method swapped for the measurement)
        try:
            yield
        finally:
            setattr(NodeCalls, "start", original)  # noqa: B010


class TransportFloor(nn.Module):
    """torch's model, plus per step the remote variant's bytes echoed by each node.

    Before each forward every echo node gets one request of the measured mean
    size and answers with the measured mean reply size (both nodes at once, one
    call in a sender thread): what a remote step would cost if neither the SDK
    nor the nodes did any work beyond moving the same bytes through gRPC.
    """

    def __init__(self, model: DLRM, endpoints: list[str], sent: int, received: int) -> None:
        super().__init__()
        self.model = model
        self.bags = model.bags
        self._channels = [grpc.insecure_channel(e, options=CHANNEL_OPTIONS) for e in endpoints]
        self._calls = [c.unary_unary(ECHO_METHOD) for c in self._channels]
        self._request = ECHO_HEADER.pack(received) + bytes(max(0, sent - ECHO_HEADER.size))
        self._sender = ThreadPoolExecutor(max_workers=len(endpoints))

    def forward(self, *inputs: Any) -> torch.Tensor:
        others = [self._sender.submit(call, self._request) for call in self._calls[1:]]
        self._calls[0](self._request)
        for other in others:
            other.result()
        return self.model(*inputs)

    def close(self) -> None:
        self._sender.shutdown()
        for channel in self._channels:
            channel.close()


# -- multi-hot steps against FBGEMM's CPU TBE (--tbe) --------------------------------------
def run_tbe(args: argparse.Namespace) -> None:
    """The workloads of ``tbe_workloads``: per-step medians and speed relative to FBGEMM."""
    import tbe_workloads as tw

    _native.set_num_threads(args.threads)  # the engine's pool: as many threads as torch's
    clock = CLOCKS[args.clock]
    missing = tw.fbgemm_available()
    if missing:
        print(f"fbgemm-gpu-cpu not usable ({missing}): the FBGEMM peer is skipped")
    report: dict[str, Any] = {"config": {k: str(v) for k, v in vars(args).items()}, "workloads": {}}
    with contextlib.ExitStack() as stack:
        endpoints = None if args.no_grpc else stack.enter_context(ps_nodes(2))
        for work in tw.WORKLOADS:
            if args.tbe_workloads and work.name not in args.tbe_workloads.split(","):
                continue
            # a workload of its own tables (Criteo) runs without torch's variant
            rows = (
                tw.scaled(work.rows, args.criteo_scale)
                if work.rows
                else [args.tbe_rows] * args.tbe_tables
            )
            dim = work.dim or args.tbe_dim
            shape = (rows, dim)
            data = tw.batches(work, rows, args.tbe_batch, dim, args.steps_per_round)
            variants: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {}
            clients: list[RecStoreClient] = []
            torch.manual_seed(0)
            model = None
            if not work.rows and not args.tbe_no_torch:
                model = tw.TorchBags(*shape)
                variants["torch"] = (model, tw.torch_optimizer(model, work))
            if not missing:
                variants["fbgemm"] = (tw.FbgemmBags(work, *shape), None)
            kinds = [(LOCAL, "local")]
            if endpoints is not None:
                kinds.append(("recstore-grpc-2-shards-collection", "grpc"))
            for name, backend in kinds:
                client = RecStoreClient(role=f"tbe-{name}-{work.name}")
                if backend == "local":
                    client.set_ps_backend("local")
                else:
                    client.set_ps_endpoints(endpoints)
                clients.append(client)
                variants[name] = (tw.RecStoreBags(client, work, *shape, args.tbe_join), None)
            # stepped in turns: FBGEMM beside RecStore local, each model beside its compiled self
            groups = [[name for name in ("fbgemm", LOCAL) if name in variants]]
            if not args.no_compile:  # the local model itself (module docstring)
                variants[COMPILED] = (torch.compile(variants[LOCAL][0]), None)
                groups = [[*groups[0], COMPILED]]
                if model is not None:  # torch's own model and optimizer: compile's cost there
                    variants[TORCH_COMPILED] = (torch.compile(model), variants["torch"][1])
                    groups.append(["torch", TORCH_COMPILED])
            for model, optimizer in variants.values():  # warm-up: every row resident
                for batch in data:
                    tw.step(model, optimizer, batch)
            for client in clients:
                client.flush()
            times: dict[str, list[float]] = {name: [] for name in variants}

            def tbe_step(name: str, index: int, variants: dict[str, Any] = variants,
                         data: list[Any] = data) -> float:  # fmt: skip
                model, optimizer = variants[name]
                start = clock()
                tw.step(model, optimizer, data[index])
                return clock() - start

            for round_index in range(args.rounds):
                paired.timed_round(list(variants), groups, len(data), tbe_step, times, round_index)
            python_times = None
            if work.rows:  # the collection's Python time: 26 tables against 10 x as many
                python_times = _python_times(work, rows, dim, args, variants[LOCAL][0], data)
            for client in clients:
                client.flush()
                for table in client.data_name_list():
                    client.delete_data(table)
                client.close()
            del variants
            numerics = None
            if not missing:

                def local_client(work: tw.Workload = work) -> RecStoreClient:
                    client = RecStoreClient(role=f"tbe-check-{work.name}")
                    client.set_ps_backend("local")
                    return client

                numerics = tw.check_numerics(work, *shape, data[:3], local_client)
            report["workloads"][work.name] = _tbe_table(work.name, times, numerics)
            report["workloads"][work.name]["tables_rows_dim"] = [rows, dim]
            if python_times is not None:
                report["workloads"][work.name]["python_time_per_step"] = python_times
            compiled = [(LOCAL, COMPILED), ("torch", TORCH_COMPILED)]
            for pair, key, what in zip(compiled, COMPILE_KEYS, COMPILE_WHAT, strict=True):
                if not args.no_compile and pair[1] in times:
                    figures = paired.summary(times, *pair)
                    print("  " + paired.describe(figures, what))
                    report["workloads"][work.name][key] = figures
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


def _python_times(
    work: Any,
    rows: list[int],
    dim: int,
    args: argparse.Namespace,
    model: nn.Module,
    data: list[Any],
) -> dict[str, Any]:
    """Python time per step (``tbe_workloads.python_time``) of the local collection with
    these tables and with each split in 10 (10 x the tables, the same rows): at the same
    batch (10 x the ids) and at a tenth of it (the same ids). The Python work does not
    depend on the ids, but its time does: the engine's pass over 10 x the rows leaves
    the interpreter's own memory out of the caches, so the same-ids figure is the one
    that isolates the number of tables."""
    import tbe_workloads as tw

    more = tw.split_tables(rows, 10)
    client = RecStoreClient(role=f"tbe-profile-{work.name}")
    client.set_ps_backend("local")
    wide = tw.RecStoreBags(client, work, more, dim, args.tbe_join)
    wide_data = tw.batches(work, more, args.tbe_batch, dim, 2)
    same_ids = tw.batches(work, more, max(1, args.tbe_batch // 10), dim, 2)
    for batch in wide_data + same_ids:  # warm-up: rows resident, plans cached
        tw.step(wide, None, batch)
    steps = max(10, args.steps_per_round * 2)
    (few, few_calls), (many, many_calls), (thin, _) = (
        tw.python_time(model, data, steps),
        tw.python_time(wide, wide_data, steps),
        tw.python_time(wide, same_ids, steps),
    )
    for table in client.data_name_list():
        client.delete_data(table)
    client.close()
    figures = {
        "tables": [len(rows), len(more)],
        "python_s": [few, many],
        "python_calls": [few_calls, many_calls],
        "ratio": many / few,
        "python_s_same_ids": thin,
        "ratio_same_ids": thin / few,
    }
    print(
        f"  collection Python time per step: {few * 1e6:.0f} us ({len(rows)} tables), "
        f"{many * 1e6:.0f} us ({len(more)} tables, same rows): {many / few:.2f}x, "
        f"{thin * 1e6:.0f} us ({len(more)} tables, same rows and ids): {thin / few:.2f}x; "
        f"Python calls per step {few_calls:.0f} and {many_calls:.0f}"
    )
    return figures


def _tbe_table(
    workload: str, times: dict[str, list[float]], numerics: float | None
) -> dict[str, Any]:
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    peer = medians.get("fbgemm")
    print(
        f"\n{workload}: {'variant':<40}{'median step ms':>16}{'speed vs FBGEMM':>18}{'paired':>9}"
    )
    rows = []
    for name, median in medians.items():
        speed = None if peer is None else peer / median
        # stepped in turns with FBGEMM: the median of FBGEMM's time / its time, step by step
        turns = None
        if peer is not None and name in (LOCAL, COMPILED) and name in times:
            turns = 1 / paired.paired_ratio(times, "fbgemm", name)
        rows.append({
            "variant": name, "median_step_s": median, "speed_vs_fbgemm": speed,
            "paired_speed_vs_fbgemm": turns,
        })  # fmt: skip
        shown = "" if speed is None else f"{speed:.2f}x"
        paired_shown = "" if turns is None else f"{turns:.2f}x"
        print(
            f"{'':<{len(workload) + 2}}{name:<40}{median * 1e3:>16.2f}{shown:>18}{paired_shown:>9}"
        )
    if numerics is not None:
        print(f"  RecStore local vs FBGEMM after 3 steps: max |weight difference| {numerics:.2e}")
    return {"results": rows, "max_weight_difference_vs_fbgemm": numerics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--num-features", type=int, default=8)
    parser.add_argument("--cardinality", type=int, default=100_000)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--bag-size", type=int, default=4, help="ids per sample and feature")
    parser.add_argument(
        "--transport-dtype",
        choices=["float16", "bfloat16"],
        help="also run the collection variant with rows and gradients in this dtype on the wire",
    )
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="time steps by wall clock or by this process's CPU time (with --no-grpc)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--no-grpc", action="store_true", help="skip the 2-shard gRPC variants")
    parser.add_argument(
        "--no-compile", action="store_true", help="skip the torch.compile (inductor) variant"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="time first touches too: skip the untimed pass that makes the rows resident",
    )
    parser.add_argument(
        "--tbe",
        action="store_true",
        help="multi-hot steps against FBGEMM's CPU TBE instead of the DLRM model",
    )
    parser.add_argument("--tbe-tables", type=int, default=8)
    parser.add_argument("--tbe-rows", type=int, default=200_000)
    parser.add_argument("--tbe-dim", type=int, default=64)
    parser.add_argument("--tbe-batch", type=int, default=2048)
    parser.add_argument("--tbe-workloads", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--tbe-no-torch",
        action="store_true",
        help="leave out torch's own model (its Adagrad keeps state for every row)",
    )
    parser.add_argument(
        "--criteo-scale",
        type=float,
        default=0.25,
        help="the Criteo workload's cardinalities above 1M times this (to fit memory)",
    )
    parser.add_argument(
        "--tbe-join",
        choices=("concat", "cat"),
        default="concat",
        help="how the RecStore model joins its tables' outputs: collection.concat (pooled "
        "into one output) or torch.cat of the collection's outputs",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--echo-server", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(_echo_server(args.echo_server))
        return
    if args.clock == "cpu" and not args.no_grpc:
        parser.error("--clock cpu counts this process only: use it with --no-grpc")
    # One intra-op thread: on a shared machine, spinning thread pools measure the neighbours.
    torch.set_num_threads(args.threads)
    if args.tbe:
        args.json = args.json or ROOT / "bench/results/train_bench_tbe.json"
        run_tbe(args)
        return
    args.json = args.json or ROOT / "bench/results/train_bench.json"
    clock = CLOCKS[args.clock]

    config = DataConfig(
        args.num_features, args.cardinality, args.bag_size, batch_size=args.batch_size, seed=1
    )
    data = SyntheticClicks(config)
    steps = args.rounds * args.steps_per_round
    batches = [data.batch(step) for step in range(steps + 1)]  # data generation is not timed

    with contextlib.ExitStack() as stack:
        variants: dict[str, tuple[DLRM, list, RecStoreClient | None]] = {}
        torch.manual_seed(0)
        baseline = DLRM(config, args.embedding_dim, torch_bags)
        variants["torch"] = (baseline, dense_optimizer(baseline, args.lr), None)
        local = RecStoreClient(role="bench-local")
        local.set_ps_backend("local")
        torch.manual_seed(0)
        model = DLRM(config, args.embedding_dim, recstore_bags(local, args.lr))
        variants[LOCAL] = (model, dense_optimizer(model, args.lr), local)
        if not args.no_compile:
            # the local model itself (its tables, its optimizers), traced by torch.compile
            # (inductor; the warm-up below compiles it, so compile time is not in the timed
            # steps); why the same tables: the module docstring
            eager_model, eager_optimizers, _ = variants[LOCAL]
            variants[COMPILED] = (torch.compile(eager_model), eager_optimizers, None)
        if not args.no_grpc:
            endpoints = stack.enter_context(ps_nodes(2))
            remote = RecStoreClient(role="bench-grpc")
            remote.set_ps_endpoints(endpoints)
            torch.manual_seed(0)
            model = DLRM(config, args.embedding_dim, recstore_bags(remote, args.lr))
            variants["recstore-grpc-2-shards"] = (model, dense_optimizer(model, args.lr), remote)
            grouped = RecStoreClient(role="bench-grpc-collection")
            grouped.set_ps_endpoints(endpoints)
            torch.manual_seed(0)
            model = DLRM(
                config, args.embedding_dim, recstore_bags(grouped, args.lr), collection=True
            )
            variants["recstore-grpc-2-shards-collection"] = (
                model, dense_optimizer(model, args.lr), grouped,
            )  # fmt: skip
            if args.transport_dtype:  # the same variant, 16-bit rows and gradients on the wire
                narrow = RecStoreClient(role="bench-grpc-collection-narrow")
                narrow.set_ps_endpoints(endpoints)
                narrow.set_transport_dtype(args.transport_dtype)
                torch.manual_seed(0)
                model = DLRM(
                    config, args.embedding_dim, recstore_bags(narrow, args.lr), collection=True
                )
                variants[f"recstore-grpc-2-shards-collection-{args.transport_dtype}"] = (
                    model, dense_optimizer(model, args.lr), narrow,
                )  # fmt: skip
            ahead = RecStoreClient(role="bench-grpc-pipelined")
            ahead.set_ps_endpoints(endpoints)
            torch.manual_seed(0)
            model = DLRM(config, args.embedding_dim, recstore_bags(ahead, args.lr), collection=True)
            variants[PIPELINED] = (model, dense_optimizer(model, args.lr), ahead)

        # Warm-up: allocations, connections; unless --cold, one untimed pass over the
        # batches, so every row they touch is resident (torch allocates all its rows
        # up front, RecStore creates a row from its initializer on first touch).
        warm_up = batches[-1:] if args.cold else batches
        for name, (model, optimizers, client) in variants.items():
            for i, batch in enumerate(warm_up):
                following = warm_up[i + 1] if name == PIPELINED and i + 1 < len(warm_up) else None
                train_step(model, optimizers, batch, following)
            if client is not None:
                client.flush()
        traffic: dict[str, float] = {}
        if not args.no_grpc:
            # The floor: what the collection variant moves per node and step, echoed.
            meter = TrafficMeter()
            model, optimizers, client = variants["recstore-grpc-2-shards-collection"]
            with meter.watching():
                for batch in warm_up:
                    train_step(model, optimizers, batch)
                assert client is not None
                client.flush()
            node_steps = 2 * len(warm_up)
            traffic = {
                "requests_per_node_and_step": meter.requests / node_steps,
                "bytes_sent_per_node_and_step": meter.sent / node_steps,
                "bytes_received_per_node_and_step": meter.received / node_steps,
            }
            narrow_name = f"recstore-grpc-2-shards-collection-{args.transport_dtype}"
            if narrow_name in variants:  # the same steps' bytes with 16-bit rows and gradients
                narrow_meter = TrafficMeter()
                model, optimizers, client = variants[narrow_name]
                with narrow_meter.watching():
                    for batch in warm_up:
                        train_step(model, optimizers, batch)
                    assert client is not None
                    client.flush()
                traffic["narrow_bytes_sent_per_node_and_step"] = narrow_meter.sent / node_steps
                traffic["narrow_bytes_received_per_node_and_step"] = (
                    narrow_meter.received / node_steps
                )
            torch.manual_seed(0)
            floor = TransportFloor(
                DLRM(config, args.embedding_dim, torch_bags), stack.enter_context(echo_nodes(2)),
                round(traffic["bytes_sent_per_node_and_step"]),
                round(traffic["bytes_received_per_node_and_step"]),
            )  # fmt: skip
            stack.callback(floor.close)
            variants["transport-floor"] = (floor, dense_optimizer(floor.model, args.lr), None)
            for batch in warm_up:
                train_step(floor, variants["transport-floor"][1], batch)
        times: dict[str, list[float]] = {name: [] for name in variants}
        losses: dict[str, list[float]] = {name: [] for name in variants}
        groups = [[LOCAL, COMPILED]] if COMPILED in variants else []
        for round_index in range(args.rounds):
            first = round_index * args.steps_per_round

            def dlrm_step(name: str, i: int, first: int = first) -> float:
                model, optimizers, _ = variants[name]
                # Pipelined: the next batch is named before backward; not across
                # rounds, so each round's first step pays its whole round trip.
                following = None
                if name == PIPELINED and i + 1 < args.steps_per_round:
                    following = batches[first + i + 1]
                start = clock()
                losses[name].append(train_step(model, optimizers, batches[first + i], following))
                return clock() - start

            paired.timed_round(
                list(variants), groups, args.steps_per_round, dlrm_step, times, round_index
            )
        for model, _, client in variants.values():
            if client is not None:
                client.flush()  # updates still in flight are part of the work
                for bag in model.bags:
                    client.delete_data(bag.table_name)
                client.close()

    base = statistics.median(times["torch"])
    results = []
    print(
        f"{'variant':<45}{'median step ms':>16}{'p25-p75 ms':>14}{'steps/s':>10}"
        f"{'vs torch':>10}{'target':>8}"
    )
    for name, samples in times.items():
        median = statistics.median(samples)
        quartiles = statistics.quantiles(samples, n=4)
        ratio = median / base
        target = TARGETS.get(name)
        results.append({
            "variant": name, "median_step_s": median, "steps_per_s": 1 / median,
            "p25_step_s": quartiles[0], "p75_step_s": quartiles[2],
            "ratio_vs_torch": ratio, "target_ratio": target,
            "meets_target": None if target is None else ratio <= target,
            "first_loss": losses[name][0], "last_loss": losses[name][-1],
        })  # fmt: skip
        target_text = f"<={target}" if target else ""
        spread = f"{quartiles[0] * 1e3:.2f}-{quartiles[2] * 1e3:.2f}"
        print(
            f"{name:<45}{median * 1e3:>16.2f}{spread:>14}{1 / median:>10.1f}{ratio:>9.2f}x"
            f"{target_text:>8}"
        )
    compiled_figures = None
    if groups:
        compiled_figures = paired.summary(times, LOCAL, COMPILED)
        print(paired.describe(compiled_figures) + "; target <= 1.0x")
    if traffic:
        print(
            f"collection traffic per node and step: {traffic['requests_per_node_and_step']:.2f} "
            f"requests, {traffic['bytes_sent_per_node_and_step'] / 1e3:.0f} kB sent, "
            f"{traffic['bytes_received_per_node_and_step'] / 1e3:.0f} kB received "
            "(transport-floor: torch's step plus those bytes echoed by 2 gRPC nodes)"
        )
        if "narrow_bytes_sent_per_node_and_step" in traffic:
            print(
                f"with {args.transport_dtype} transport: "
                f"{traffic['narrow_bytes_sent_per_node_and_step'] / 1e3:.0f} kB sent, "
                f"{traffic['narrow_bytes_received_per_node_and_step'] / 1e3:.0f} kB received"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "steps": steps,
        "collection_traffic": traffic,
        "compiled_vs_eager": compiled_figures,
        "results": results,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
