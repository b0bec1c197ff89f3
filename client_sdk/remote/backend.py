"""The gRPC backend: a table's shards on PS nodes, called in parallel.

Shard endpoints come from the admin API's discovery document or from an
explicit ``host:port`` list in shard order (``tables``). Pulls send each
distinct key once, to its owner shard (``routing``), in batches of bounded
size; every shard's request is in flight before any reply is awaited, and
results come back in input order. Updates of an adam table reach every shard
on every step (an empty update where a shard owns none of the keys) because
adam's step count is per table. Updates may be left in flight (``wait=False``,
what the torch modules' backward does): the ``Step`` holds them to ride on the
next module pull and keeps every later read of the table consistent.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc
import numpy as np
import torch

from recstore.client.backends.base import CreateResult, PullRequest, RowChunk, UpdateRequest
from recstore.client.errors import BackendError, TableNotInitialized
from recstore.client.native import share_torch_threads
from recstore.client.remote import rows
from recstore.client.remote.nodes import NodeCalls
from recstore.client.remote.requests import TableCall
from recstore.client.remote.routing import BEHIND_WAIT_S, Patience, ShardRouter
from recstore.client.remote.single_table import push_issue, update_issue
from recstore.client.remote.step import Step
from recstore.client.remote.tables import (
    Discovery,
    RemoteTable,
    check_shard_order,
    discover,
    transport_of,
)
from recstore.client.remote.updates import (
    CARRY_ENV,
    DEFAULT_MAX_DELAY,
    DEFAULT_MAX_IN_FLIGHT,
    MAX_IN_FLIGHT_ENV,
)
from recstore.client.specs import same_layout
from recstore.client.tensors import (
    distinct_keys,
    keys_to_numpy,
    rows_from_numpy,
    rows_to_numpy,
    spread,
)
from recstore.core import DType, SlotMap, TableSpec, malloc_tuning, wire
from recstore.core.cache_figures import ClientCache
from recstore.core.control import (
    Rpc,
    cache_report_rpc,
    create_table_rpc,
    drop_table_rpc,
    stats_rpc,
)
from recstore.core.proto_convert import TableStats, bearer_metadata
from recstore.core.request_id import RequestIds
from recstore.core.tls import ClientTls

PS_TOKEN_ENV = "RECSTORE_PS_TOKEN"
RPC_TIMEOUT_ENV = "RECSTORE_RPC_TIMEOUT"
DEFAULT_BATCH_BYTES = 8 << 20
SENDERS = 16
R = TypeVar("R")


def _newest(maps: Iterable[SlotMap | None]) -> SlotMap | None:
    """The slot map of the highest epoch among the nodes' (None: no node has one)."""
    known = [m for m in maps if m is not None]
    return max(known, key=lambda m: m.epoch) if known else None


def _check_order(
    endpoints: tuple[str, ...], stats: Sequence[TableStats], newest: SlotMap | None
) -> None:
    """Each endpoint's node is the shard it is listed as (``check_shard_order``)."""
    for index, shard in enumerate(stats):
        check_shard_order(endpoints, index, shard.shard_index, newest)


class GrpcBackend:
    kind = "grpc"

    def __init__(
        self,
        *,
        endpoints: tuple[str, ...] | None = None,
        admin_url: str | None = None,
        token: str | None = None,
        admin_token: str | None = None,
        rpc_timeout: float | None = None,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
        max_pending_updates: int | None = None,
        carry_delay: float | None = None,
        tls: ClientTls | None = None,
        transport_dtype: str | None = None,
    ) -> None:
        if not endpoints and not admin_url:
            raise ValueError("the grpc backend needs PS endpoints or an admin API URL")
        # a step's requests and replies reuse heap memory instead of faulting in fresh pages
        malloc_tuning.apply_once()
        share_torch_threads()
        self._endpoints = tuple(endpoints or ())
        self._admin_url = admin_url
        self._admin_token = admin_token
        # PS nodes get the PS token only: the admin token is for the admin API alone.
        token = token or os.environ.get(PS_TOKEN_ENV)
        self._metadata = bearer_metadata(token)
        # TLS to the nodes and the admin API: given, else RECSTORE_TLS_*, else plaintext
        self._tls = tls or ClientTls.from_environment()
        self._timeout = rpc_timeout or float(os.environ.get(RPC_TIMEOUT_ENV, "60"))
        self._max_batch_bytes = max_batch_bytes
        # float32 tables' rows on the wire (None: each spec's transport_dtype)
        self._transport = DType(transport_dtype).value if transport_dtype else None
        self._nodes: dict[str, NodeCalls] = {}
        #: names this client's writes, on every node (recstore.core.request_id)
        self._request_ids = RequestIds()
        self._tables: dict[str, RemoteTable] = {}
        self._lock = threading.Lock()
        # senders: every request but the one the caller's thread makes itself
        self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="recstore-rpc")
        if max_pending_updates is None:
            max_pending_updates = int(os.environ.get(MAX_IN_FLIGHT_ENV, DEFAULT_MAX_IN_FLIGHT))
        # Updates left in flight ride on the next MultiPull; a delay of 0 sends them at once.
        if carry_delay is None:
            carry_delay = float(os.environ.get(CARRY_ENV, DEFAULT_MAX_DELAY * 1e3)) / 1e3
        self._step = Step(
            locate=self._locate, node=self._node, max_bytes=lambda: self._max_batch_bytes,
            carry_delay=carry_delay, max_in_flight=max_pending_updates,
        )  # fmt: skip

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._endpoints

    # -- plumbing -----------------------------------------------------------------------

    def _node(self, endpoint: str) -> NodeCalls:
        node = self._nodes.get(endpoint)
        if node is None:
            with self._lock:
                node = self._nodes.get(endpoint)
                if node is None:
                    node = NodeCalls(
                        endpoint, self._metadata, self._timeout, self._pool, self._tls,
                        self._request_ids, self._moved_away if self._admin_url else None,
                    )  # fmt: skip
                    self._nodes[endpoint] = node
        return node

    def _call(self, endpoint: str, rpc: Rpc[R], table: str) -> R:
        return rpc.read(self._node(endpoint).control(rpc.method, rpc.request, table))

    def _each_endpoint(self, endpoints: tuple[str, ...], rpc: Rpc[R], table: str) -> list[R]:
        """``rpc`` on every node at once; raises the first failure once all are done."""
        futures = [self._pool.submit(self._call, endpoint, rpc, table) for endpoint in endpoints]
        errors = [f.exception() for f in futures]
        failure = next((e for e in errors if e is not None), None)
        if failure is not None:
            raise failure
        return [f.result() for f in futures]

    def _router(self, name: str, slot_map: SlotMap, spec: TableSpec) -> ShardRouter:
        max_rows = max(1, self._max_batch_bytes // spec.row_bytes)
        return ShardRouter(
            slot_map,
            max_rows=max_rows,
            refresh=lambda epoch: self._refresh(name, epoch),
        )

    # -- where tables are ---------------------------------------------------------------

    def _discover(self, name: str) -> Discovery:
        if self._admin_url:
            return discover(self._admin_url, name, self._admin_token, self._tls)
        stats = self._each_endpoint(self._endpoints, stats_rpc(name), name)
        spec = stats[0].spec
        if spec is None:
            raise BackendError(
                f"PS node {self._endpoints[0]} answered no spec for table {name!r}",
                code=grpc.StatusCode.DATA_LOSS,
            )
        newest = _newest(s.slot_map for s in stats)
        _check_order(self._endpoints, stats, newest)
        return Discovery(spec, self._endpoints, newest or SlotMap.initial(len(self._endpoints)))

    def _locate(self, name: str) -> RemoteTable:
        table = self._tables.get(name)
        if table is None:
            found = self._discover(name)
            assert found.spec is not None
            table = RemoteTable(
                found.spec, found.endpoints, self._router(name, found.slot_map, found.spec),
                transport_of(found.spec, self._transport),
            )  # fmt: skip
            self._tables[name] = table
        return table

    def _moved_away(self, endpoint: str, names: list[str]) -> int | None:
        """The slot-map epoch of one of ``names`` whose shards no longer include
        ``endpoint`` (a node a move took out), else None. Read from the admin API."""
        for name in names:
            if name not in self._tables:
                continue
            try:
                found = self._discover(name)
            except BackendError:
                return None  # no answer: the node is waited for, as before
            if endpoint not in found.endpoints:
                return found.slot_map.epoch
        return None

    def _refresh(self, name: str, node_epoch: int) -> SlotMap:
        patience = Patience(BEHIND_WAIT_S)
        while True:
            try:
                found = self._discover(name)
                break
            except BackendError as error:
                # refused keys wait out a restart of the admin API (nothing of them applied)
                if error.status is not grpc.StatusCode.UNAVAILABLE or not patience.wait():
                    raise
        if found.slot_map.epoch < node_epoch:
            raise BackendError(
                f"slot map of {name!r} is at epoch {found.slot_map.epoch} but a node is at "
                f"{node_epoch}; the table is being resharded, retry later",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )
        self._tables[name].endpoints = found.endpoints
        return found.slot_map

    # -- Backend ------------------------------------------------------------------------

    def create_table(self, spec: TableSpec) -> CreateResult:
        slot_map: SlotMap | None = None  # explicit endpoints: each node's default map
        if self._admin_url:
            found = discover(self._admin_url, spec.name, self._admin_token, self._tls)
            assert found.spec is not None
            if not same_layout(spec, found.spec):  # the caller refuses it: create nothing
                return CreateResult(found.spec, created=False)
            spec, endpoints, slot_map = found.spec, found.endpoints, found.slot_map
        else:
            endpoints = self._endpoints
            spec = spec.model_copy(update={"shards": len(endpoints)})
        try:
            replies = self._each_endpoint(endpoints, create_table_rpc(spec, slot_map), spec.name)
        except BackendError as error:
            # a read-only token may not create, but it may open a table that exists
            attachable = error.status in (
                grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.PERMISSION_DENIED,
            )
            existing = self.describe(spec.name) if attachable else None
            if existing is None:
                raise
            return CreateResult(existing, created=False)
        newest = _newest(r.stats.slot_map for r in replies)
        _check_order(endpoints, [r.stats for r in replies], newest)
        if slot_map is None:
            slot_map = newest or SlotMap.initial(len(endpoints))
        self._tables[spec.name] = RemoteTable(
            spec, endpoints, self._router(spec.name, slot_map, spec),
            transport_of(spec, self._transport),
        )  # fmt: skip
        return CreateResult(spec, created=any(reply.created for reply in replies))

    def describe(self, name: str) -> TableSpec | None:
        try:
            return self._discover(name).spec
        except TableNotInitialized:
            return None

    def drop_table(self, name: str) -> None:
        self._step.forget(name)  # nothing of ours still in flight when the table goes
        table = self._locate(name)
        self._each_endpoint(table.endpoints, drop_table_rpc(name), name)
        self._tables.pop(name, None)

    def _node_of(self, table: RemoteTable) -> Callable[[int], NodeCalls]:
        return lambda shard: self._node(table.endpoints[shard])

    def pull(self, name: str, keys: torch.Tensor, *, unique: bool = False) -> torch.Tensor:
        self._step.settle([name])  # read-your-writes: this table's updates land first
        table = self._locate(name)
        distinct, inverse = (keys, None) if unique else distinct_keys(keys)
        rows, _ = self._pull_rows(table, keys_to_numpy(distinct), frozenset())
        return rows if unique else spread(rows, inverse, keys.shape)

    def pull_versioned(
        self, name: str, keys: torch.Tensor, *, skip: frozenset[str] = frozenset()
    ) -> tuple[torch.Tensor, dict[str, int] | None]:
        """``pull`` of unique ``keys`` and the table's version on each node, read before the rows.

        One MultiPull per node, as ``pull_many``: every node of the table is asked
        (an empty item where it owns none of the keys) except those in ``skip``,
        which are asked only for their keys. Versions: node -> version, for every
        node that answered; None when some items had to be resent after a slot-map
        change (the nodes that answered them are not known to be all of them).
        """
        self._step.settle([name])
        table = self._locate(name)
        return self._pull_rows(table, keys_to_numpy(keys), frozenset(table.endpoints) - skip)

    def _pull_rows(
        self, table: RemoteTable, keys: np.ndarray, ask: frozenset[str]
    ) -> tuple[torch.Tensor, dict[str, int] | None]:
        """The rows of distinct ``keys`` in one MultiPull per node (routed, encoded and
        scattered natively), and the versions ``pull_versioned`` describes; ``ask``: the
        nodes asked even where they own none of the keys."""
        dtype = DType(table.spec.dtype)
        out = np.empty((len(keys), table.spec.embedding_dim), dtype=wire.wire_dtype(dtype))
        call = self._step.multi_call(
            "MultiPull", [TableCall(table, keys, out, also_ask=ask)], blocking=True
        )
        call.wait()
        versions = None if call.resent else call.versions[0]
        return rows_from_numpy(out, dtype), versions

    def push(self, name: str, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._step.settle([name])
        table = self._locate(name)
        keys_np, values_np = keys_to_numpy(keys), rows_to_numpy(values)
        issue = push_issue(table.spec, keys_np, values_np, self._node_of(table))
        table.router.start(keys_np, issue).wait()

    def update(
        self,
        name: str,
        keys: torch.Tensor,
        grads: torch.Tensor,
        lr: float | None,
        *,
        wait: bool = True,
    ) -> None:
        """Apply gradients; ``wait=False`` returns once every request is sent."""
        self._step.settle([name])  # one update in flight per table: applied in order
        table = self._locate(name)
        keys_np, grads_np = keys_to_numpy(keys), rows_to_numpy(grads)
        issue = update_issue(
            table.spec, keys_np, grads_np, lr, self._node_of(table), table.transport
        )
        every_shard = table.spec.optimizer.kind == "adam"
        call = table.router.start(keys_np, issue, every_shard=every_shard, blocking=wait)
        if wait:
            call.wait()
        else:
            self._step.track(name, call)

    def pull_many(self, requests: Sequence[PullRequest]) -> list[torch.Tensor]:
        """Several tables' pulls with one MultiPull per node (each table as ``pull``).

        Updates held for carrying ride along (each node applies its share
        first); rows prefetched by ``lookahead_many`` are used when still current.
        """
        return self._step.pull_many(requests)

    def lookahead_many(self, requests: Sequence[PullRequest]) -> None:
        """Name the next ``pull_many``: it goes out with the next updates (``Step``)."""
        self._step.lookahead(requests)

    def update_many(self, updates: Sequence[UpdateRequest], *, wait: bool = True) -> None:
        """Several tables' updates with one MultiUpdate per node (each table as ``update``).

        ``wait=False`` leaves them in flight (or held, to ride on the next
        ``pull_many``); each table then has this call as its update in flight,
        and reports only a failure of its own rows.
        """
        names = [name for name, _, _, _ in updates]
        if wait:  # a call of its own: held updates go first, prefetched rows go stale
            self._step.settle(names)
        else:  # the step's own: one sent update in flight per table
            self._step.settle_in_flight(names)
        calls = []
        for name, keys, grads, lr in updates:
            table = self._locate(name)
            every_shard = table.spec.optimizer.kind == "adam"
            calls.append(
                TableCall(table, keys_to_numpy(keys), rows_to_numpy(grads), lr, every_shard)
            )
        if wait:
            self._step.multi_call("MultiUpdate", calls, blocking=True).wait()
        else:
            self._step.updates_ready(calls)

    def export_rows(
        self,
        name: str,
        *,
        with_state: bool = False,
        slots: np.ndarray | None = None,
        keys: torch.Tensor | None = None,
    ) -> Iterator[RowChunk]:
        self._step.settle([name])
        mask, table = rows.slot_mask_bytes(slots), self._locate(name)
        if keys is not None:
            return rows.export_keys(table, self._node, with_state, mask, keys_to_numpy(keys))
        return rows.export_table(table, self._node, with_state, mask)

    def report_caches(self, name: str, caches: Sequence[ClientCache]) -> None:
        """CacheReport to every node of the table (each node's view then shows them)."""
        table = self._locate(name)
        self._each_endpoint(table.endpoints, cache_report_rpc(name, caches), name)

    def optimizer_step(self, name: str) -> int:
        self._step.settle([name])
        table = self._locate(name)  # every shard counts every step (see update)
        return int(self._call(table.endpoints[0], stats_rpc(name), name).engine["step"])

    def set_optimizer_step(self, name: str, step: int) -> None:
        self._step.settle([name])
        table = self._locate(name)
        for endpoint in table.endpoints:
            self._node(endpoint).import_rows(rows.step_message(table, step), name)

    def import_rows(self, name: str, chunks: Iterable[RowChunk]) -> int:
        self._step.settle([name])
        table = self._locate(name)
        return sum(rows.import_chunk(table, chunk, self._node) for chunk in chunks)

    @property
    def updates_in_flight(self) -> int:
        return self._step.updates_in_flight

    def flush(self) -> None:
        """Wait for every update in flight; raise the first failure not yet reported."""
        self._step.settle_all()

    def close(self) -> None:
        try:
            self._step.close()
        finally:
            self._pool.shutdown(wait=True)
            with self._lock:
                for node in self._nodes.values():
                    node.close()
                self._nodes.clear()
            self._tables.clear()
