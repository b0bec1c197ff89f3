"""The moments of an online move worth recording, and how each is named and worded.

Both provisioners drive a move with ``recstore.core.reshard.drive``, which
calls back at each moment: the move started, a batch committed, the move
finished, it was aborted, a restarted provisioner resumed it, and (operator
only) a second shard change was queued behind a running move. The local
provisioner sends each to the admin API's audit log; the operator sends it
there too and posts it as a Kubernetes Event on the EmbeddingTable. The audit
action, the Event's reason and type, the payload and the message are defined
here once, so both paths record the same facts in the same words.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from recstore.core.reshard.plan import ReshardJob
from recstore.core.reshard.retry import attempt_note, retry_note
from recstore.core.routing import NUM_SLOTS
from recstore.core.spec import MAX_SHARDS

#: the longest reason an event carries (an error's text is cut there)
MAX_REASON_CHARS = 1000

Shards = Annotated[int, Field(ge=1, le=MAX_SHARDS)]
Slots = Annotated[int, Field(ge=0, le=NUM_SLOTS)]
Count = Annotated[int, Field(ge=0)]


class ReshardMoment(str, Enum):
    started = "started"
    batch_committed = "batch_committed"
    finished = "finished"
    aborted = "aborted"
    resumed = "resumed"
    queued = "queued"


#: the Kubernetes Event reason of each moment (CamelCase, as Kubernetes writes them)
_REASONS = {
    ReshardMoment.started: "ReshardStarted",
    ReshardMoment.batch_committed: "ReshardBatchCommitted",
    ReshardMoment.finished: "ReshardFinished",
    ReshardMoment.aborted: "ReshardAborted",
    ReshardMoment.resumed: "ReshardResumed",
    ReshardMoment.queued: "ReshardQueued",
}


class ReshardEvent(BaseModel):
    """One recorded moment of a table's move from ``from_shards`` to ``to_shards``.

    ``epoch`` is the slot map's epoch at that moment (after the commit for a
    committed batch). ``batch``/``batch_slots``/``source``/``target`` describe the
    committed batch; ``reason`` why a move was aborted; ``attempt`` counts the
    tries of one change and ``retry_in_s`` says when it tries again;
    ``queued_shards`` is the count a queued change asks for.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    moment: ReshardMoment
    from_shards: Shards
    to_shards: Shards
    epoch: Annotated[int, Field(ge=1)]
    slots_moved: Slots = 0
    slots_total: Slots = 0
    bytes_moved: Count = 0
    batches: Count = 0
    batch: Count | None = None
    batch_slots: Slots | None = None
    source: Count | None = None
    target: Count | None = None
    reason: Annotated[str, Field(max_length=MAX_REASON_CHARS)] | None = None
    attempt: Annotated[int, Field(ge=1)] = 1
    retry_in_s: Annotated[float, Field(ge=0)] | None = None
    queued_shards: Shards | None = None

    @classmethod
    def of(cls, moment: ReshardMoment, job: ReshardJob, epoch: int, **extra: Any) -> ReshardEvent:
        """The event of ``moment`` for ``job`` (its counts), the map at ``epoch``."""
        fields: dict[str, Any] = {
            "moment": moment, "from_shards": job.from_shards, "to_shards": job.to_shards,
            "epoch": epoch, "slots_moved": job.slots_moved, "slots_total": job.slots_total,
            "bytes_moved": job.bytes_moved, "batches": len(job.batches),
        }  # fmt: skip
        if moment == ReshardMoment.batch_committed:  # the counts include the committed batch
            batch = job.batch
            fields.update(
                batch=job.current, batch_slots=batch.slots, source=batch.source,
                target=batch.target, slots_moved=job.slots_moved + batch.slots,
            )  # fmt: skip
        fields.update(extra)
        if fields.get("reason") is not None:
            fields["reason"] = str(fields["reason"])[:MAX_REASON_CHARS]
        return cls(**fields)

    @property
    def action(self) -> str:
        """The audit log's action (``<resource type>.<verb>``)."""
        return f"reshard.{self.moment.value}"

    @property
    def reason_code(self) -> str:
        """The Kubernetes Event's reason."""
        return _REASONS[self.moment]

    @property
    def warning(self) -> bool:
        """Whether a Kubernetes Event of this moment is a Warning (else Normal)."""
        return self.moment == ReshardMoment.aborted

    def message(self) -> str:
        where = f"{self.from_shards} -> {self.to_shards} shards"
        done = f"{self.slots_moved}/{self.slots_total} slots moved"
        if self.moment == ReshardMoment.started:
            return (
                f"resharding {where} started: {self.slots_total} slots to move in "
                f"{self.batches} batches from slot-map epoch {self.epoch}"
            )
        if self.moment == ReshardMoment.batch_committed:
            assert self.batch is not None
            return (
                f"resharding {where}: batch {self.batch + 1}/{self.batches} committed "
                f"({self.batch_slots} slots, shard {self.source} -> {self.target}), "
                f"slot-map epoch {self.epoch}"
            )
        if self.moment == ReshardMoment.finished:
            return (
                f"resharding {where} finished: {done}, {self.bytes_moved} bytes, "
                f"slot-map epoch {self.epoch}" + attempt_note(self.attempt)
            )
        if self.moment == ReshardMoment.aborted:
            then = retry_note(self.attempt, self.retry_in_s)
            return (
                f"resharding {where} aborted at {done}" + attempt_note(self.attempt)
                + f": {self.reason}{then}"
            )  # fmt: skip
        if self.moment == ReshardMoment.resumed:
            return (
                f"resharding {where} resumed from its stored job at {done}, "
                f"slot-map epoch {self.epoch}" + attempt_note(self.attempt)
            )
        return (
            f"spec.shards is {self.queued_shards} while resharding {where} runs: "
            "queued, it starts when this move ends"
        )

    def to_json(self) -> dict[str, Any]:
        """The body a provisioner posts (``POST /api/v1/tables/{name}/resharding-events``)."""
        return self.model_dump(mode="json", exclude_none=True)

    def payload(self) -> dict[str, Any]:
        """What the audit log stores (the fields set, and the message)."""
        return {**self.to_json(), "message": self.message()}
