"""On-demand checkpoints on Kubernetes: the admin API's request, taken from the resource.

``POST /api/v1/tables/{name}/checkpoints`` writes the request's id into the
EmbeddingTable's annotation ``recstore.io/checkpoint-request``. The operator takes it at
its next status refresh: every shard saves under one id (``request-<id>``), as the final
checkpoint on delete does, and the outcome — running, completed with every shard's
checkpoint, or failed with the reason — becomes ``status.checkpointRequest`` (a completed
one ``status.lastCheckpoint`` too). The status goes to the admin API like every status,
which completes or fails its record of the request from it.

One request at a time per table: the admin API refuses a second while one is in flight,
and an annotation changed by hand while one runs is taken once that one is reported. The
saves run in tasks on kopf's loop, so the refresh that starts one returns at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from recstore.core.checkpoint_status import (
    CheckpointState,
    ShardCheckpoint,
    TableCheckpoint,
    clip,
    outcome,
    requested_checkpoint_id,
    rfc3339,
    running,
)
from recstore.core.errors import InvalidArgument
from recstore.core.resource import CHECKPOINT_REQUEST_ANNOTATION, reported_request, waiting_request
from recstore.operator.render import Owner

Logger = logging.Logger | logging.LoggerAdapter
#: saves every shard of a table under a checkpoint id: one result per shard
SaveShards = Callable[[Owner, str, Logger], Awaitable[list[ShardCheckpoint]]]


@dataclass
class _Taken:
    progress: TableCheckpoint
    task: asyncio.Task[None]


class CheckpointRequests:
    """The request each table's shards are saving, or saved last, until the status says so."""

    def __init__(self, save: SaveShards) -> None:
        self._save = save
        #: by table uid
        self._taken: dict[str, _Taken] = {}

    def take(self, owner: Owner, body: Mapping[str, Any], logger: Logger) -> None:
        """Start the request the resource's annotation asks for, unless it is taken or its
        outcome is reported, or another one still runs or awaits its report."""
        try:
            waiting = waiting_request(body)
        except InvalidArgument as error:
            logger.warning(f"annotation {CHECKPOINT_REQUEST_ANNOTATION} ignored: {error}")
            return
        taken = self._taken.get(owner.uid)
        if taken is not None and not (taken.task.done() and _reported(taken, body)):
            return  # one at a time: the next is taken once this one's outcome is in the status
        if waiting is not None:
            task = asyncio.create_task(self._run(owner, waiting, logger))
            self._taken[owner.uid] = _Taken(running(waiting), task)

    async def _run(self, owner: Owner, request_id: int, logger: Logger) -> None:
        checkpoint_id = requested_checkpoint_id(request_id)
        logger.info(f"checkpoint {checkpoint_id} of {owner.name}: every shard saves")
        try:
            shards = await self._save(owner, checkpoint_id, logger)
            result = outcome(checkpoint_id, shards, now=_now(), request_id=request_id)
        except Exception as error:  # e.g. the API server unreachable: reported, not lost
            result = TableCheckpoint(
                id=checkpoint_id,
                request_id=request_id,
                state=CheckpointState.failed,
                message=clip(f"the shards could not be asked: {error}"),
                at=rfc3339(_now()),
            )
        (logger.info if result.state == CheckpointState.completed else logger.warning)(
            f"checkpoint {checkpoint_id} of {owner.name}: {result.state}"
            + (f": {result.message}" if result.message else "")
        )
        self._taken[owner.uid].progress = result

    def progress(self, uid: str) -> tuple[TableCheckpoint | None, TableCheckpoint | None]:
        """(the request taken for the table, the checkpoint it completed) for its status."""
        taken = self._taken.get(uid)
        if taken is None:
            return None, None
        done = taken.progress if taken.progress.state == CheckpointState.completed else None
        return taken.progress, done

    def abandon(self, owner: Owner, body: Mapping[str, Any]) -> TableCheckpoint | None:
        """The table is being deleted: its request stops. The request still waiting for its
        outcome, Failed with why, for the last status; None when none waits."""
        taken = self._taken.pop(owner.uid, None)
        if taken is not None:
            taken.task.cancel()
        try:
            waiting = waiting_request(body)
        except InvalidArgument:
            return None
        if waiting is None:
            return None
        return TableCheckpoint(
            id=requested_checkpoint_id(waiting),
            request_id=waiting,
            state=CheckpointState.failed,
            message="the table is being deleted: its final checkpoint saves the shards instead",
            at=rfc3339(_now()),
        )

    def stop(self) -> None:
        """The operator stops: every request's saves stop (a restart takes it again)."""
        for taken in self._taken.values():
            taken.task.cancel()
        self._taken.clear()


def _reported(taken: _Taken, body: Mapping[str, Any]) -> bool:
    """Whether the resource's status holds the outcome of the request taken."""
    reported = reported_request(body)
    return reported is not None and (reported.request_id, reported.state) == (
        taken.progress.request_id, taken.progress.state
    )  # fmt: skip


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
