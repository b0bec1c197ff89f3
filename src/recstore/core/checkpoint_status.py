"""A table's checkpoint as its status reports it: asked for, running, completed or failed.

A checkpoint of a table is every shard saving under one id: the final one the operator
takes before deleting a table (``final-<time>``) and the ones asked for on demand
(``POST /api/v1/tables/{name}/checkpoints``, saved as ``request-<id>``). Both provisioners
report it in the one shape of this module, in the table status (``lastCheckpoint``: the
newest one every shard wrote; ``checkpointRequest``: the newest on-demand one, however it
went), and the admin API completes or fails its record of the request from it. The pure
decisions around a request live here too, so the operator, the local provisioner and the
admin API decide alike.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from enum import Enum
from typing import Annotated

from pydantic import Field

from recstore.core.errors import InvalidArgument
from recstore.core.spec import MAX_SHARDS, WireModel

#: the longest message a status carries (longer ones are cut, never refused)
MESSAGE_MAX = 1024
#: the ids the admin API gives requests (a database integer key)
REQUEST_ID_MAX = 2**31 - 1
REQUEST_PREFIX = "request-"
#: a time as a status holds it: RFC 3339, UTC (``rfc3339``)
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class CheckpointState(str, Enum):
    requested = "Requested"  # recorded by the admin API; no provisioner has taken it yet
    running = "Running"  # the shards are saving
    completed = "Completed"  # every shard saved under the checkpoint's id
    failed = "Failed"  # some shard did not: ``message`` says which and why


FINISHED = (CheckpointState.completed, CheckpointState.failed)


class ShardCheckpoint(WireModel):
    """One shard's part of a checkpoint: what it saved, or why it did not."""

    index: Annotated[int, Field(ge=0, lt=MAX_SHARDS)]
    #: where the shard was asked (host:port)
    endpoint: Annotated[str, Field(max_length=255)] | None = None
    rows: Annotated[int, Field(ge=0)] | None = None
    bytes: Annotated[int, Field(ge=0)] | None = None
    #: why this shard wrote no checkpoint; None when it did
    error: Annotated[str, Field(max_length=MESSAGE_MAX)] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class TableCheckpoint(WireModel):
    """A checkpoint of the whole table: its id, how it went, and every shard's part."""

    #: the id every shard saves under
    id: Annotated[str, Field(min_length=1, max_length=128)]
    #: the admin API's record it answers; None for the final checkpoint on delete
    request_id: Annotated[int, Field(ge=1, le=REQUEST_ID_MAX)] | None = None
    state: CheckpointState
    #: why it failed (the failed shards and their errors); None otherwise
    message: Annotated[str, Field(max_length=MESSAGE_MAX)] | None = None
    #: when it finished (RFC 3339); None while it runs
    at: Timestamp | None = None
    shards: list[ShardCheckpoint] = Field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


def final_checkpoint_id(when: dt.datetime) -> str:
    """The id a deleted table's last checkpoint is saved under: when deletion was asked."""
    return f"final-{when.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}"


def requested_checkpoint_id(request_id: int) -> str:
    """The id the shards save an on-demand checkpoint under."""
    return f"{REQUEST_PREFIX}{request_id}"


def running(request_id: int) -> TableCheckpoint:
    """A request taken: its shards are saving."""
    return TableCheckpoint(
        id=requested_checkpoint_id(request_id), request_id=request_id, state=CheckpointState.running
    )


def outcome(
    checkpoint_id: str,
    shards: Sequence[ShardCheckpoint],
    *,
    now: dt.datetime,
    request_id: int | None = None,
) -> TableCheckpoint:
    """Completed when there are shards and every one saved; else Failed, naming each that did
    not (with its error)."""
    ordered = sorted(shards, key=lambda s: s.index)
    failed = [s for s in ordered if not s.ok]
    if not ordered:
        message: str | None = "no shard to save: the table has no running shard"
    elif failed:
        message = "; ".join(
            f"shard {s.index}{f' ({s.endpoint})' if s.endpoint else ''}: {s.error}" for s in failed
        )
    else:
        message = None
    return TableCheckpoint(
        id=checkpoint_id,
        request_id=request_id,
        state=CheckpointState.failed if message else CheckpointState.completed,
        message=clip(message) if message else None,
        at=rfc3339(now),
        shards=ordered,
    )


def parse_request(value: str | None) -> int | None:
    """The request id an annotation holds (None: none asked); InvalidArgument when it is
    not one the admin API gives."""
    if value is None:
        return None
    try:
        request_id = int(value)
    except ValueError:
        request_id = 0
    if not 1 <= request_id <= REQUEST_ID_MAX:
        raise InvalidArgument(f"checkpoint request {value!r} is not an id in 1..{REQUEST_ID_MAX}")
    return request_id


def in_flight(requested: int | None, reported: TableCheckpoint | None) -> bool:
    """Whether request ``requested`` still waits for its outcome: asked, and the status
    reports no finished checkpoint for it."""
    if requested is None:
        return False
    return reported is None or reported.request_id != requested or not reported.finished


def clip(message: str, limit: int = MESSAGE_MAX) -> str:
    """``message`` cut to ``limit`` characters (a status must stay within its schema)."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def rfc3339(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
