"""CPU a PS node spends per MultiPull: the fixed cost of a request and the cost per id.

Node processes on loopback, one float32 table each; a client sends raw
MultiPull bytes (no SDK in the way) one at a time and each server's CPU time,
every thread, is read from the scheduler's per-thread accounting
(``/proc/PID/task/*/schedstat``). Requests: an empty MultiPull (one item of no
keys: what every exact lookup pays per node however few ids it misses) and a
MultiPull of ``--ids`` ids of dim ``--dim``. Servers: a node, a node with a
bearer token (the auth interceptor on every call), and a bare ``grpc.aio``
server with the node's options that answers no bytes (gRPC's own cost per
call, the floor no node-side change goes below). Variants run interleaved in
``--rounds`` rounds; the median round is quoted (the machine is shared). The
client's own CPU per call is shown too.

Usage: python bench/rpc_cost_bench.py [--requests 2000] [--rounds 10] [--ids 4096] [--dim 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from processes import free_port, process_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
METHOD = "/recstore.v1.ParameterServer/MultiPull"
TOKEN = "bench-token"


def start_node(
    root: Path, token: bool, shard: tuple[int, int] = (0, 1)
) -> tuple[subprocess.Popen[bytes], str]:
    """A node process (shard ``shard[0]`` of ``shard[1]``) and its address, once it serves."""
    import grpc

    root.mkdir(parents=True)
    port = free_port()
    command = [sys.executable, "-m", "recstore.ps", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(root / "ps"), "--log-level", "WARNING",
               "--shard-index", str(shard[0]), "--num-shards", str(shard[1])]  # fmt: skip
    if token:
        (root / "token").write_text(TOKEN)
        command += ["--auth-token-file", str(root / "token")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=120)
    channel.close()
    return process, address


class Target:
    """One server process and the raw-bytes requests sent to it (MultiPull unless told)."""

    def __init__(self, label: str, process: subprocess.Popen[Any], address: str, token: bool,
                 requests: dict[str, bytes], method: str = METHOD) -> None:  # fmt: skip
        import grpc

        self.label, self.process, self.token = label, process, token
        self.channel = grpc.insecure_channel(address)
        self.pull = self.channel.unary_unary(method)  # raw bytes both ways
        self.metadata = (("authorization", f"Bearer {TOKEN}"),) if token else ()
        self.requests = requests

    def cost(self, request: bytes, count: int) -> tuple[float, float]:
        """Node and client CPU seconds of ``count`` calls of ``request``."""
        node_before, client_before = process_cpu_seconds(self.process.pid), time.process_time()
        for _ in range(count):
            self.pull(request, metadata=self.metadata)
        return process_cpu_seconds(
            self.process.pid
        ) - node_before, time.process_time() - client_before


def node_target(root: Path, args: argparse.Namespace, token: bool) -> Target:
    import grpc

    from recstore.core import TableSpec
    from recstore.core.proto_convert import create_table_request
    from recstore.v1 import ps_pb2, ps_pb2_grpc

    process, address = start_node(root, token)
    metadata = (("authorization", f"Bearer {TOKEN}"),) if token else ()
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        spec = TableSpec(name="rpc_cost", num_embeddings=1 << 20, embedding_dim=args.dim)
        epoch = stub.CreateTable(create_table_request(spec), metadata=metadata).stats.slot_map.epoch
    keys = np.random.default_rng(0).choice(1 << 20, args.ids, replace=False)
    requests = {}
    for label, ids in (("empty", keys[:0]), (f"{args.ids} ids", keys)):
        requests[label] = ps_pb2.MultiPullRequest(items=[ps_pb2.PullRequest(
            table="rpc_cost", epoch=epoch, keys=ids.astype("<i8").tobytes())]
        ).SerializeToString()  # fmt: skip
    return Target("node, token" if token else "node", process, address, token, requests)


def echo_target() -> Target:
    """A bare grpc.aio server with the node's options answering every call with no bytes:
    what gRPC itself costs per call."""
    import grpc

    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--echo-server", str(port)])
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=120)
    return Target("bare gRPC echo", process, address, False, {"empty": b""})


def echo_server(port: int) -> None:
    import asyncio

    import grpc

    from recstore.core.limits import grpc_options
    from recstore.ps.serve.serving import GRPC_OPTIONS

    async def echo(request: bytes, context: object) -> bytes:
        return b""

    async def serve() -> None:
        options = GRPC_OPTIONS + grpc_options()
        server = grpc.aio.server(options=options)
        handler = grpc.unary_unary_rpc_method_handler(echo)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "recstore.v1.ParameterServer", {"MultiPull": handler}),))  # fmt: skip
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def measure(args: argparse.Namespace) -> list[dict[str, object]]:
    """Every variant in each of ``--rounds`` rounds, interleaved: the median round's cost."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        targets: list[Target] = []
        try:
            targets.append(echo_target())
            targets.append(node_target(Path(tmp) / "plain", args, False))
            if not args.no_auth:
                targets.append(node_target(Path(tmp) / "token", args, True))
            per_round = max(1, args.requests // args.rounds)
            costs: dict[tuple[int, str], list[tuple[float, float]]] = {}
            for target in targets:
                for request in target.requests.values():  # warm: rows inserted, caches hot
                    target.cost(request, per_round)
            for _ in range(args.rounds):
                for index, target in enumerate(targets):
                    for label, request in target.requests.items():
                        costs.setdefault((index, label), []).append(target.cost(request, per_round))
            for (index, label), spent in costs.items():
                target = targets[index]
                node = statistics.median(n for n, _ in spent) / per_round
                client = statistics.median(c for _, c in spent) / per_round
                results.append({
                    "server": target.label, "variant": label, "dim": args.dim,
                    "requests": per_round * args.rounds, "rounds": args.rounds,
                    "node_cpu_us": node * 1e6, "client_cpu_us": client * 1e6,
                })  # fmt: skip
        finally:
            for target in targets:
                target.channel.close()
                target.process.terminate()
                target.process.wait(timeout=60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--ids", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-auth", action="store_true", help="skip the node with a token")
    parser.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)  # the floor's process
    args = parser.parse_args()
    if args.echo_server is not None:
        echo_server(args.echo_server)
        return
    rows = measure(args)
    print(f"{'server':<16} {'request':<10} {'node CPU us':>12} {'client CPU us':>14}")
    for row in rows:
        print(f"{row['server']:<16} {row['variant']:<10} {row['node_cpu_us']:>12.0f} "
              f"{row['client_cpu_us']:>14.0f}")  # fmt: skip
    print(json.dumps({"rpc_cost": rows}))


if __name__ == "__main__":
    main()
