"""PS-node throughput over loopback against two baselines measured in the same run.

For N = 1k / 10k / 100k keys at dim 64 (float32): remote Pull and Update
against one ``recstore ps-node`` process, a raw gRPC bytes echo of identical
payload sizes (the transport's ceiling), and Redis MGET of the same rows
(redis-server on loopback, redis-py with hiredis). Prints a table and writes
bench/results/ps_bench.json. Targets: pull >= 0.8x echo, >= 10x Redis MGET.

The PS side is measured twice: the generated-stub client (protobuf classes,
as any gRPC client would use) and ``recstore.core.wire.WireClient`` (the
zero-copy codec; the targets are judged on it). The engine's own pull and
update (an in-process ``Table``) show how much of each call is transport.
Every path of one size runs interleaved, call by call, in this process.

Usage: python bench/ps_bench.py [--sizes 1000,10000,100000] [--runs 3] [--reps 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DIM = 64
OPTIONS = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]


# -- raw bytes echo server (run as a child process) ----------------------------
async def _echo_server(port_file: Path) -> None:
    replies: dict[int, bytes] = {}

    async def pull(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        rows = len(request) // 8
        if rows not in replies:
            replies[rows] = bytes(rows * DIM * 4)
        return replies[rows]

    async def update(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    handlers = {
        "Pull": grpc.unary_unary_rpc_method_handler(pull),
        "Update": grpc.unary_unary_rpc_method_handler(update),
    }
    server = grpc.aio.server(options=OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


# -- helpers ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not start")


def interleaved(paths: dict[str, Callable[[], object]], reps: int, seconds: float) -> dict:
    """Median seconds per call of each path, calls taken round-robin (one warm-up each).

    Interleaving spreads the machine's noise over every path alike, so the
    ratios between them hold even when absolute times drift; the order changes
    every round so no path always runs right after the same other one.
    """
    for call in paths.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in paths}
    order = list(paths)
    shuffle = np.random.default_rng(1).shuffle
    started = time.perf_counter()
    for rep in range(reps):
        if rep >= 3 and time.perf_counter() - started > seconds:
            break
        shuffle(order)  # no path always follows the same neighbour
        for name in order:
            call = paths[name]
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def start_ps(data_dir: Path, tuning: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data_dir), "--log-level", "WARNING",
         "--malloc-tuning" if tuning else "--no-malloc-tuning"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address, options=OPTIONS)
    grpc.channel_ready_future(channel).result(timeout=60)
    channel.close()
    return process, address


def measure(stub, fast, echo, store, engine, keys, grads, rows_all, reps, seconds):  # type: ignore[no-untyped-def]
    """One row of the report: every path moves the same ``len(keys)`` rows of dim 64."""
    from recstore.v1 import ps_pb2

    n = len(keys)
    key_bytes = keys.tobytes()
    names = [f"k{k}" for k in keys.tolist()]
    pull_req = ps_pb2.PullRequest(table="bench", keys=key_bytes)
    update_req = ps_pb2.UpdateRequest(table="upd", keys=key_bytes, grads=grads.tobytes())
    echo_pull = echo.unary_unary("/bench.Echo/Pull")
    echo_update = echo.unary_unary("/bench.Echo/Update")
    update_payload = key_bytes + grads.tobytes()
    out = np.empty((n, DIM), np.float32)

    def stub_pull() -> np.ndarray:
        return np.frombuffer(stub.Pull(pull_req).values, np.float32).reshape(n, DIM)

    def fast_pull() -> np.ndarray:
        return fast.pull("bench", keys)[0]

    def redis_mget() -> np.ndarray:
        return np.frombuffer(b"".join(store.mget(names)), np.float32).reshape(n, DIM)

    expected = rows_all[keys]
    for path in (stub_pull, fast_pull, redis_mget):
        assert np.array_equal(path(), expected), path.__name__
    pulls = interleaved(
        {
            "pull_fast": fast_pull,
            "pull_stub": stub_pull,
            "echo_pull": lambda: echo_pull(key_bytes),
            "redis_mget": redis_mget,
        },
        reps,
        seconds,
    )
    updates = interleaved(
        {
            "update_fast": lambda: fast.update("upd", keys, grads),
            "update_stub": lambda: stub.Update(update_req),
            "echo_update": lambda: echo_update(update_payload),
        },
        reps,
        seconds,
    )
    # The engine alone, in this process: its worker threads must not overlap the above.
    engine_only = interleaved(
        {
            "engine_pull": lambda: engine.pull(keys, out=out),
            "engine_update": lambda: engine.update(keys, grads),
        },
        reps,
        seconds,
    )
    updates |= engine_only
    row: dict[str, float] = {"keys": n, "dim": DIM}
    for name, t in (pulls | updates).items():  # engine_pull is reported with the updates
        row[f"{name}_ms"] = t * 1e3
        row[f"{name}_rows_per_s"] = n / t
    row["pull_fast_vs_echo"] = pulls["echo_pull"] / pulls["pull_fast"]
    row["pull_stub_vs_echo"] = pulls["echo_pull"] / pulls["pull_stub"]
    row["pull_fast_vs_redis"] = pulls["redis_mget"] / pulls["pull_fast"]
    row["update_fast_vs_echo"] = updates["echo_update"] / updates["update_fast"]
    row["update_stub_vs_echo"] = updates["echo_update"] / updates["update_stub"]
    # the ceiling of a serial server: the transport's time plus the engine's own
    row["update_fast_vs_echo_plus_engine"] = (
        updates["echo_update"] + updates["engine_update"]
    ) / updates["update_fast"]
    row["pull_gb_per_s"] = row["pull_fast_rows_per_s"] * DIM * 4 / 1e9
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--seconds", type=float, default=1.5, help="time budget per size and run")
    parser.add_argument("--reps", type=int, default=15, help="calls per path per size and run")
    parser.add_argument("--runs", type=int, default=3, help="runs; each figure is their median")
    parser.add_argument("--no-malloc-tuning", action="store_true", help="client and node")
    parser.add_argument("--echo-server", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ps_bench.json")
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(_echo_server(args.echo_server))
        return 0

    import redis

    from recstore.core import TableSpec, malloc_tuning
    from recstore.core.proto_convert import create_table_request
    from recstore.core.wire import WireClient
    from recstore.store import Table

    # Large protobuf messages are parsed here too: the client wants the same tuning.
    if not args.no_malloc_tuning:
        malloc_tuning.apply()
    from recstore.v1 import ps_pb2, ps_pb2_grpc

    sizes = [int(s) for s in args.sizes.split(",")]
    largest = max(sizes)
    work = Path(tempfile.mkdtemp(prefix="ps-bench-"))
    children: list[subprocess.Popen[bytes]] = []
    try:
        ps, address = start_ps(work / "ps", not args.no_malloc_tuning)
        children.append(ps)
        port_file = work / "echo.port"
        children.append(
            subprocess.Popen([sys.executable, __file__, "--echo-server", str(port_file)])
        )
        wait_until(port_file.exists, 60, "echo server")
        redis_port = free_port()
        children.append(subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL))  # fmt: skip
        store = redis.Redis(port=redis_port, protocol=2)
        wait_until(lambda: _pings(store), 30, "redis-server")

        channel = grpc.insecure_channel(address, options=OPTIONS)
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        spec = TableSpec(name="bench", num_embeddings=largest, embedding_dim=DIM)
        stub.CreateTable(create_table_request(spec))
        echo = grpc.insecure_channel(f"127.0.0.1:{port_file.read_text()}", options=OPTIONS)

        rng = np.random.default_rng(0)
        rows_all = rng.standard_normal((largest, DIM)).astype(np.float32)
        keys_all = np.arange(largest, dtype="<i8")
        stub.Push(
            ps_pb2.PushRequest(table="bench", keys=keys_all.tobytes(), values=rows_all.tobytes())
        )
        pipe = store.pipeline(transaction=False)
        for start in range(0, largest, 10_000):
            pipe.mset(
                {f"k{i}": rows_all[i].tobytes() for i in range(start, min(start + 10_000, largest))}
            )
        pipe.execute()

        stub.CreateTable(create_table_request(spec.model_copy(update={"name": "upd"})))
        fast = WireClient(channel)
        engine = Table(spec.model_copy(update={"name": "engine"}))  # in this process
        inputs = []
        for n in sizes:
            keys = rng.permutation(largest)[:n].astype("<i8")
            inputs.append((keys, rng.standard_normal((n, DIM)).astype(np.float32)))
        runs: list[list[dict[str, float]]] = [[] for _ in sizes]
        for _ in range(args.runs):
            for i, (keys, grads) in enumerate(inputs):
                runs[i].append(measure(
                    stub, fast, echo, store, engine, keys, grads, rows_all, args.reps, args.seconds
                ))  # fmt: skip
        results = [{k: float(np.median([r[k] for r in rs])) for k in rs[0]} for rs in runs]
        channel.close()
        echo.close()
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)

    print_report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "ps_bench",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpc": grpc.__version__,
        },
        "malloc_tuning": not args.no_malloc_tuning,
        "runs": args.runs,
        "targets": {"pull_fast_vs_echo": 0.8, "pull_fast_vs_redis": 10.0},
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


COLUMNS = (  # (heading, key, format)
    ("keys", "keys", ">7.0f"),
    ("pull fast", "pull_fast_rows_per_s", ">10.3g"),
    ("pull stub", "pull_stub_rows_per_s", ">10.3g"),
    ("echo", "echo_pull_rows_per_s", ">10.3g"),
    ("redis", "redis_mget_rows_per_s", ">10.3g"),
    ("fast/echo", "pull_fast_vs_echo", ">9.2f"),
    ("stub/echo", "pull_stub_vs_echo", ">9.2f"),
    ("fast/redis", "pull_fast_vs_redis", ">10.1f"),
    ("upd fast", "update_fast_rows_per_s", ">10.3g"),
    ("upd stub", "update_stub_rows_per_s", ">10.3g"),
    ("echo upd", "echo_update_rows_per_s", ">10.3g"),
    ("engine upd", "engine_update_rows_per_s", ">10.3g"),
    ("upd/echo", "update_fast_vs_echo", ">8.2f"),
    ("upd/(echo+eng)", "update_fast_vs_echo_plus_engine", ">14.2f"),
)


def print_report(results: list[dict[str, float]]) -> None:
    """Rows per second (medians) and ratios; ratios above 1 beat the baseline."""
    print(" ".join(f"{h:>{f[1:].split('.')[0]}}" for h, _, f in COLUMNS))
    for r in results:
        print(" ".join(f"{r[k]:{f}}" for _, k, f in COLUMNS))


def _pings(store: object) -> bool:
    try:
        return bool(store.ping())  # type: ignore[attr-defined]
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
