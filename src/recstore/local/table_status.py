"""What the local provisioner reports of a table: its nodes observed, its status computed.

The poller (and a move, after each commit) observes every shard of a table:
whether its node serves the table (a node without it is given it with
CreateTable, unless a refusal's back-off runs), its rows and memory for the
node heartbeat, the slot map it routes by. The reconcile core turns that into
the table's phase and conditions, which go to the admin API when they change.
Kept apart from provisioning so the provisioner's own module stays about
starting and stopping tables.
"""

from __future__ import annotations

import datetime as dt
import logging

import httpx

from recstore.core.reconcile import Observation, ShardState, compute_status
from recstore.core.status import SlotMapStatus, TableStatus
from recstore.local.reporting import Reporter
from recstore.local.shard_client import ShardClient, TableRefused
from recstore.local.table import LocalTable

log = logging.getLogger(__name__)


def ensure(table: LocalTable, shard: int, client: ShardClient, now: float) -> bool:
    """CreateTable on a node without the table, unless a refusal's backoff is running."""
    with table.ensuring:
        if not table.retry.due(now):
            return False
        try:
            # a table moved online: a node without it (a new shard) joins the moving map
            created = client.ensure_table(table.spec, table.create_map())
        except TableRefused as error:
            if error.reason != table.refused_reason:  # said once, not at every poll or shard
                table.refused_reason = error.reason
                table.refused = f"shard {shard} ({error.endpoint}) refused it: {error.reason}"
                log.error("table %r: %s (asking again after a back-off)", table.spec.name,
                          table.refused)  # fmt: skip
            table.retry.failed(now)
            return False
        if created:
            _forget_refusal(table)
        return created


def clear_refusal(table: LocalTable) -> None:
    """Forget a node's refusal once every shard serves the table: it no longer holds."""
    with table.ensuring:
        _forget_refusal(table)


def _forget_refusal(table: LocalTable) -> None:
    table.refused = table.refused_reason = None
    table.retry.succeeded()


def report(table: LocalTable, reporter: Reporter, now: float) -> None:
    """Observe the table's nodes and report its status if it changed (``now``: the
    provisioner's clock, for the refusal back-off)."""
    with table.reporting:
        _report_locked(table, reporter, now)


def _report_locked(table: LocalTable, reporter: Reporter, now: float) -> None:
    if table.held:  # on a pool that is not there, or too large for it: nothing runs
        _report(table, reporter, Observation(pool=table.placing, refused=table.unfit))
        return
    committed = table.store.slot_map() if table.store is not None else None
    # a shard being emptied for removal, which the committed map no longer names, is not
    # shown, and its node is not reported: the catalogue forgets it (the status's width)
    shown = (
        len(table.clients) if committed is None else max(committed.num_shards, table.spec.shards)
    )
    shards, served_maps = [], set()
    for shard, client in enumerate(table.clients):
        stats = client.stats(table.spec.name)
        if stats is None and ensure(table, shard, client, now):
            stats = client.stats(table.spec.name)
        shards.append(ShardState(shard, table.endpoint(shard), ready=stats is not None))
        if shard >= shown:
            continue
        node_id = table.node_ids[shard]
        if node_id is None:
            node_id = table.node_ids[shard] = reporter.register_node(
                table.spec.name,
                shard,
                table.endpoint(shard),
                f"127.0.0.1:{table.ports[shard][1]}",
            )
        if stats is not None:
            served_maps.add(stats.slot_map)
        if node_id is not None:
            rows, memory = (stats.rows, stats.memory_bytes) if stats is not None else (0, 0)
            reporter.heartbeat(node_id, stats is not None, rows, memory)
    if table.refused is not None and all(s.ready for s in shards):
        clear_refusal(table)  # e.g. a stats call timed out on a node that had the table
    status = compute_status(
        problem=None,
        declared_shards=table.spec.shards,
        observation=Observation(
            running_shards=len(table.ports),
            shards=tuple(shards),
            refused=table.refused,
            resharding=table.moving,
            last_checkpoint=table.last_checkpoint,
            checkpoint_request=table.checkpoint_request,
            pool=table.placing,
        ),
        generation=table.generation,
        previous=table.status,
        now=dt.datetime.now(dt.timezone.utc),
    )
    served = served_maps.pop() if len(served_maps) == 1 else None
    if committed is not None:  # moved online: the committed map is the truth
        kept = [s for s in status.shards if s.index < shown]
        status = status.model_copy(update={
            "slot_map": SlotMapStatus.model_validate(committed.to_dict()),
            "slot_map_epoch": committed.epoch,
            "shards": kept,
            "ready_shards": sum(s.ready for s in kept),
        })  # fmt: skip
    elif served is not None and all(s.ready for s in shards):
        # the nodes' map is the truth: after an offline reshard it is not the catalogue's
        status = status.model_copy(
            update={"slot_map": SlotMapStatus.model_validate(served.to_dict())}
        )
    _send(table, reporter, status)


def _report(table: LocalTable, reporter: Reporter, observation: Observation) -> None:
    status = compute_status(
        problem=None,
        declared_shards=table.spec.shards,
        observation=observation,
        generation=table.generation,
        previous=table.status,
        now=dt.datetime.now(dt.timezone.utc),
    )
    _send(table, reporter, status)


def _send(table: LocalTable, reporter: Reporter, status: TableStatus) -> None:
    if status != table.status:
        reporter.report_status(table.spec.name, status.to_wire())
        table.status = status


def report_polled(table: LocalTable, reporter: Reporter, now: float) -> None:
    """``report`` for the poller: nothing that fails stops it (the next round reports)."""
    try:
        report(table, reporter, now)
    except httpx.HTTPStatusError as error:
        if error.response.status_code == 404:
            # the admin API has not committed this table yet: next round
            log.debug("status report for %s: table not in the catalogue yet", table.spec.name)
        else:
            log.warning("status report for %s refused: %s", table.spec.name, error)
    except httpx.TransportError as error:
        log.warning("status report for %s failed: %s", table.spec.name, error)
    except Exception:  # a bug must show, but must not stop the provisioner
        log.exception("status report for %s failed", table.spec.name)


def report_committed(table: LocalTable, reporter: Reporter, now: float) -> None:
    """``report`` after a move's commit: an admin API that refuses it or cannot be reached
    is logged, and the move goes on."""
    try:
        report(table, reporter, now)
    except httpx.HTTPStatusError as error:
        log.warning("status report for %s refused: %s %s", table.spec.name, error,
                    error.response.text)  # fmt: skip
    except (httpx.HTTPError, RuntimeError) as error:
        log.warning("status report for %s failed: %s", table.spec.name, error)
