"""The transport floor: what gRPC costs in C++ against Python, and what a node adds on top.

Builds ``bench/transport_floor`` (a C++ callback-API generic echo server and
client, linked against the system gRPC C++ the native module uses) and
measures, in one run, each variant interleaved over ``--rounds`` rounds (the
median round is quoted; the machine is shared):

* **server CPU per empty call** (every thread, ``/proc/PID/task/*/schedstat``),
  one grpcio client calling one server at a time: the C++ echo server, a
  ``grpc.aio`` echo server with the node's options, and a real node's empty
  MultiPull (one item of no keys), without and with a bearer token. Ratios
  are to the C++ echo.
* **the SDK's client CPU per pull** of ``--sdk-ids`` rows (2 MiB at dim 64) from 2
  nodes, its data calls on the native channel against the same calls on grpcio.
* **throughput from 2 servers in parallel** (one call to each at once, both
  awaited, as the SDK sends one request per node): a pull-sized call
  (``--ids`` × 8 bytes of keys out, ``--ids`` × ``--dim`` float32 rows back)
  and a 2 MiB echo, C++ client → C++ servers against grpcio client →
  ``grpc.aio`` servers: GB/s of request and reply bytes, client and server CPU
  per call.

Usage: python bench/transport_floor_bench.py [--rounds 7] [--requests 2000] [--calls 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from processes import free_port, process_cpu_seconds, write_report
from rpc_cost_bench import Target, node_target, start_node

ROOT = Path(__file__).resolve().parents[1]
FLOOR_SOURCE = ROOT / "bench" / "transport_floor"
FLOOR_BUILD = ROOT / "build" / "transport_floor"
ECHO = "/floor.Floor/Echo"
REPLY = "/floor.Floor/Reply"  # the request leads with the reply's size (uint64 LE)
MIB = 1 << 20
CPP_STACK = "C++ -> C++"


def build_floor() -> Path:
    """The floor's programs, (re)built with CMake; their folder."""
    configure = ["cmake", "-S", str(FLOOR_SOURCE), "-B", str(FLOOR_BUILD),
                 "-DCMAKE_BUILD_TYPE=Release"]  # fmt: skip
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(FLOOR_BUILD), "-j2"], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return FLOOR_BUILD


def message_limit() -> int:
    from recstore.core.limits import DEFAULT_MESSAGE_LIMIT

    return DEFAULT_MESSAGE_LIMIT


class Server:
    """One floor server process (C++ or grpc.aio); ``listening`` read before it is used."""

    def __init__(self, label: str, command: list[str]) -> None:
        self.label, self.port = label, free_port()
        self.process = subprocess.Popen([*command, str(self.port)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.split() != ["listening", str(self.port)]:
            raise RuntimeError(f"{label} did not start: {line!r}")
        self.address = f"127.0.0.1:{self.port}"

    def cpu(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # both kinds serve until stdin closes
        self.process.wait(timeout=60)


def cpp_server(floor: Path, pool_bytes: int) -> Server:
    command = [str(floor / "floor_server"), str(message_limit()), str(pool_bytes)]
    return Server("C++ echo", command)


def python_server(pool_bytes: int) -> Server:
    return Server("grpc.aio echo", [sys.executable, __file__, "--python-server",
                                    "--pool", str(pool_bytes), "--port"])  # fmt: skip


def serve_python(port: int, pool_bytes: int) -> None:
    """The grpc.aio floor: the node's server options, Echo and Reply as the C++ floor."""
    import asyncio

    import grpc

    from recstore.core.limits import grpc_options
    from recstore.ps.serve.serving import GRPC_OPTIONS

    replies: dict[int, bytes] = {}

    async def echo(request: bytes, context: object) -> bytes:
        return request

    async def reply(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        size = int.from_bytes(request[:8], "little")
        if len(request) < 8 or size > pool_bytes:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad reply size")
        if size not in replies:  # built once per size: no copy per call, as the C++ pool
            replies[size] = b"\x5a" * size
        return replies[size]

    async def serve() -> None:
        server = grpc.aio.server(options=GRPC_OPTIONS + grpc_options())
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo),
                    "Reply": grpc.unary_unary_rpc_method_handler(reply)}  # fmt: skip
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor.Floor", handlers),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print(f"listening {port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
        await server.stop(None)

    asyncio.run(serve())


def sized_request(method: str, request_bytes: int, reply_bytes: int) -> bytes:
    """The floor's request: a Reply one leads with the size it asks back."""
    if method == REPLY:
        return reply_bytes.to_bytes(8, "little") + b"\x33" * (request_bytes - 8)
    return b"\x33" * request_bytes


class CppClient:
    """The C++ floor client process: one channel per server, ``rounds`` read per line."""

    def __init__(self, floor: Path, method: str, request_bytes: int, reply_bytes: int,
                 servers: list[Server]) -> None:  # fmt: skip
        command = [str(floor / "floor_client"), method, str(request_bytes), str(reply_bytes),
                   str(message_limit()), *(s.address for s in servers)]  # fmt: skip
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)  # fmt: skip

    def run(self, rounds: int) -> tuple[float, float]:
        """Wall and client CPU seconds of ``rounds`` rounds."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{rounds}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"floor_client failed (exit {self.process.wait()})")
        answer = json.loads(line)
        return float(answer["wall_s"]), float(answer["cpu_s"])

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


class PythonClient:
    """A grpcio client as the SDK's: raw bytes, the first servers' calls sent from a
    sender thread, the last one's made on the caller's own thread."""

    def __init__(self, method: str, request: bytes, reply_bytes: int,
                 servers: list[Server]) -> None:  # fmt: skip
        import grpc

        from recstore.core.limits import grpc_options

        self.request, self.reply_bytes = request, reply_bytes
        self.channels = [grpc.insecure_channel(s.address, options=grpc_options())
                         for s in servers]  # fmt: skip
        self.calls = [channel.unary_unary(method) for channel in self.channels]
        self.senders = ThreadPoolExecutor(max(1, len(servers) - 1))

    def run(self, rounds: int) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            futures = [self.senders.submit(call, self.request) for call in self.calls[:-1]]
            replies = [self.calls[-1](self.request), *(f.result() for f in futures)]
            if any(len(reply) != self.reply_bytes for reply in replies):
                raise RuntimeError("a reply of the wrong size")
        return time.perf_counter() - wall, time.process_time() - cpu

    def stop(self) -> None:
        self.senders.shutdown()
        for channel in self.channels:
            channel.close()


def empty_call_costs(args: argparse.Namespace, floor: Path, tmp: Path) -> list[dict[str, Any]]:
    """Server CPU per empty call: the C++ and grpc.aio echoes, a node without and with a token."""
    servers = [cpp_server(floor, 0), python_server(0)]
    targets = [Target(s.label, s.process, s.address, False, {"empty": b""}, method=ECHO)
               for s in servers]  # fmt: skip
    try:
        targets.append(node_target(tmp / "plain", args, False))
        targets.append(node_target(tmp / "token", args, True))
        for target in targets[2:]:
            target.requests = {"empty": target.requests["empty"]}
        per_round = max(1, args.requests // args.rounds)
        for target in targets:  # warm
            target.cost(target.requests["empty"], per_round)
        spent: list[list[tuple[float, float]]] = [[] for _ in targets]
        for _ in range(args.rounds):
            for index, target in enumerate(targets):
                spent[index].append(target.cost(target.requests["empty"], per_round))
    finally:
        for target in targets:
            target.channel.close()
        for server in servers:
            server.stop()
        for target in targets[2:]:
            target.process.terminate()
            target.process.wait(timeout=60)
    rows = []
    for target, costs in zip(targets, spent, strict=True):
        rows.append({"server": target.label,
                     "server_cpu_us": statistics.median([n for n, _ in costs]) / per_round * 1e6,
                     "client_cpu_us": statistics.median([c for _, c in costs]) / per_round * 1e6,
                     "calls": per_round * args.rounds})  # fmt: skip
    floor_cost = rows[0]["server_cpu_us"]
    for row in rows:
        row["vs_cpp_echo"] = row["server_cpu_us"] / floor_cost
    return rows


def throughputs(args: argparse.Namespace, floor: Path) -> list[dict[str, Any]]:
    """Pull-sized calls and 2 MiB echoes from 2 servers at once, C++ and Python."""
    pull_reply = args.ids * args.dim * 4
    payloads = {  # label -> (method, request bytes, reply bytes)
        f"pull {args.ids} x {args.dim}": (REPLY, args.ids * 8 + 8, pull_reply),
        "2 MiB echo": (ECHO, 2 * MIB, 2 * MIB),
    }
    pool = max(pull_reply, 2 * MIB)
    stacks: dict[str, list[Server]] = {
        CPP_STACK: [cpp_server(floor, pool) for _ in range(args.servers)],
        "Python -> Python": [python_server(pool) for _ in range(args.servers)],
    }
    clients: dict[tuple[str, str], Any] = {}
    rows = []
    try:
        for stack, servers in stacks.items():
            for label, (method, request_bytes, reply_bytes) in payloads.items():
                client = (CppClient(floor, method, request_bytes, reply_bytes, servers)
                          if stack == CPP_STACK else
                          PythonClient(method, sized_request(method, request_bytes, reply_bytes),
                                       reply_bytes, servers))  # fmt: skip
                clients[stack, label] = client
                client.run(max(1, args.calls // 10))  # warm: connections, buffers
        samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for _ in range(args.rounds):
            for (stack, label), client in clients.items():
                servers = stacks[stack]
                before = sum(s.cpu() for s in servers)
                wall, client_cpu = client.run(args.calls)
                server_cpu = sum(s.cpu() for s in servers) - before
                samples.setdefault((stack, label), []).append((wall, client_cpu, server_cpu))
    finally:
        for client in clients.values():
            client.stop()
        for servers in stacks.values():
            for server in servers:
                server.stop()
    for (stack, label), runs in samples.items():
        _, request_bytes, reply_bytes = payloads[label]
        calls = args.calls * args.servers
        wall = statistics.median([w for w, _, _ in runs])
        rows.append({
            "stack": stack, "payload": label, "servers": args.servers,
            "request_bytes": request_bytes, "reply_bytes": reply_bytes,
            "calls": calls * args.rounds,
            "gb_per_s": calls * (request_bytes + reply_bytes) / wall / 1e9,
            "client_cpu_us": statistics.median(c for _, c, _ in runs) / calls * 1e6,
            "server_cpu_us": statistics.median(s for _, _, s in runs) / calls * 1e6,
        })  # fmt: skip
    for row in rows:
        same = (r for r in rows if r["payload"] == row["payload"] and r["stack"] == CPP_STACK)
        row["vs_cpp"] = row["gb_per_s"] / next(same)["gb_per_s"]
    return rows


class GrpcioData:
    """The SDK's data calls on grpcio's channel (what they went through before the native
    channel): the baseline of the SDK's client CPU per pull."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def call(
        self, method: str, request: bytes | tuple[bytes, ...], unreachable_after: float = 0.0,
        **options: Any,
    ) -> bytes:  # fmt: skip
        """grpcio's call; a request in parts joined (grpcio sends one buffer), and no
        unreachable-node patience (grpcio has no such knob)."""
        return self.start(method, request, **options).wait()

    def start(self, method: str, request: bytes | tuple[bytes, ...], **options: Any) -> Any:
        """grpcio's call in flight (its future): ``wait`` answers it."""
        whole = b"".join(request) if isinstance(request, tuple) else request
        return _GrpcioPending(self.channel.unary_unary(method).future(whole, **options))

    def close(self) -> None:
        pass


class _GrpcioPending:
    def __init__(self, future: Any) -> None:
        self.future = future

    def wait(self, unreachable_after: float = 0.0) -> bytes:
        reply: bytes = self.future.result()
        return reply


def sdk_pulls(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The SDK's client CPU per pull of ``--sdk-ids`` rows of dim ``--dim`` from 2 nodes,
    its data calls on the native channel against grpcio's."""
    import numpy as np
    import torch

    from recstore.client.remote.backend import GrpcBackend
    from recstore.core import TableSpec

    nodes = [start_node(tmp / f"sdk{i}", False, (i, args.servers)) for i in range(args.servers)]
    endpoints = tuple(address for _, address in nodes)
    backends = {"native (C++)": GrpcBackend(endpoints=endpoints),
                "grpcio": GrpcBackend(endpoints=endpoints)}  # fmt: skip
    rows = 1 << 20
    spec = TableSpec(name="sdk_pull", num_embeddings=rows, embedding_dim=args.dim)
    keys = torch.from_numpy(np.random.default_rng(0).choice(rows, args.sdk_ids, replace=False))
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in backends}
    try:
        backends["grpcio"].create_table(spec)
        for label, backend in backends.items():
            backend.pull("sdk_pull", keys)  # warm: channels, rows inserted
            if label == "grpcio":
                for node in backend._nodes.values():
                    node.data = GrpcioData(node.channel)  # type: ignore[assignment]
        for _ in range(args.rounds):
            for label, backend in backends.items():
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(args.calls):
                    backend.pull("sdk_pull", keys)
                samples[label].append((time.perf_counter() - wall, time.process_time() - cpu))
    finally:
        for backend in backends.values():
            backend.close()
        for process, _ in nodes:
            process.terminate()
            process.wait(timeout=60)
    pulled = args.sdk_ids * args.dim * 4
    out = [{
        "client": label, "ids": args.sdk_ids, "dim": args.dim, "pulled_bytes": pulled,
        "pulls": args.calls * args.rounds,
        "client_cpu_us": statistics.median(c for _, c in runs) / args.calls * 1e6,
        "wall_us": statistics.median(w for w, _ in runs) / args.calls * 1e6,
    } for label, runs in samples.items()]  # fmt: skip
    for row in out:
        row["cpu_vs_grpcio"] = row["client_cpu_us"] / out[-1]["client_cpu_us"]
    return out


def report(
    empty: list[dict[str, Any]], moved: list[dict[str, Any]], sdk: list[dict[str, Any]]
) -> None:
    print(f"{'server (empty call)':<20} {'server CPU us':>14} {'vs C++ echo':>12} "
          f"{'client CPU us':>14}")  # fmt: skip
    for row in empty:
        print(f"{row['server']:<20} {row['server_cpu_us']:>14.0f} {row['vs_cpp_echo']:>11.2f}x "
              f"{row['client_cpu_us']:>14.0f}")  # fmt: skip
    print()
    print(f"{'client -> servers':<18} {'payload':<16} {'GB/s':>6} {'vs C++':>7} "
          f"{'client CPU us/call':>19} {'server CPU us/call':>19}")  # fmt: skip
    for row in moved:
        print(f"{row['stack']:<18} {row['payload']:<16} {row['gb_per_s']:>6.2f} "
              f"{row['vs_cpp']:>6.2f}x {row['client_cpu_us']:>19.0f} "
              f"{row['server_cpu_us']:>19.0f}")  # fmt: skip
    print()
    print(f"{'SDK pull, data calls on':<24} {'MiB':>5} {'client CPU us':>14} {'vs grpcio':>10} "
          f"{'wall us':>9}")  # fmt: skip
    for row in sdk:
        print(f"{row['client']:<24} {row['pulled_bytes'] / MIB:>5.1f} "
              f"{row['client_cpu_us']:>14.0f} {row['cpu_vs_grpcio']:>9.2f}x "
              f"{row['wall_us']:>9.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000, help="empty calls per server")
    parser.add_argument("--calls", type=int, default=100, help="calls per server per round")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--ids", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--sdk-ids", type=int, default=8192, help="ids of the SDK's pull")
    default_out = ROOT / "bench" / "results" / "transport_floor_bench.json"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--python-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pool", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.python_server:
        serve_python(args.port, args.pool)
        return
    floor = build_floor()
    with tempfile.TemporaryDirectory() as tmp:
        empty = empty_call_costs(args, floor, Path(tmp))
        sdk = sdk_pulls(args, Path(tmp))
    moved = throughputs(args, floor)
    report(empty, moved, sdk)
    write_report(args.out, {"empty_call": empty, "throughput": moved, "sdk_pull": sdk, "args": {
        k: v for k, v in vars(args).items() if k not in ("out", "python_server", "pool", "port")
    }})  # fmt: skip


if __name__ == "__main__":
    main()
