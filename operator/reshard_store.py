"""The operator's durable record of a table's slot map and reshard job: the CR status.

``recstore.core.reshard.protocol`` needs a ``JobStore`` whose ``commit`` is the
move's one commit point. On Kubernetes that is the EmbeddingTable's status
subresource: ``status.slotMap`` is the committed map and ``status.migrationJob``
the job a restarted operator resumes from. A commit is a PUT of the status
carrying the resourceVersion it was read at (compare-and-swap): a 409 means
someone else wrote in between, so the status is read again and the commit
decided from the epoch stored there. The resharder runs in a thread; the calls
go to the operator's asyncio client on kopf's loop.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Coroutine
from typing import Any, TypeVar

from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap
from recstore.operator.kube import Kube, KubeError, path

T = TypeVar("T")

#: how long one API call from the resharder thread may take
CALL_TIMEOUT_S = 60.0
#: commits retried after a 409 whose re-read still shows the expected epoch
COMMIT_ATTEMPTS = 8


def call_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on kopf's loop from the resharder's thread and wait for its result.

    Its error is raised here, in the resharder's thread, and never left in a task of kopf's
    loop: kopf, when it stops, re-raises the error of any task of its loop, and a resharder's
    call that fails because the operator is stopping (its API client already closed)
    would otherwise make the operator's own exit fail.
    """
    if loop.is_closed():
        coro.close()  # the operator has stopped: nothing will run it
        raise RuntimeError("the operator's event loop is closed")
    done, value = asyncio.run_coroutine_threadsafe(_outcome(coro), loop).result(CALL_TIMEOUT_S)
    if not done:
        raise value
    result: T = value
    return result


async def _outcome(coro: Coroutine[Any, Any, T]) -> tuple[bool, Any]:
    """(True, result) or (False, the error to raise in the caller's thread)."""
    try:
        return True, await coro
    except asyncio.CancelledError:  # the loop stopping: the task ends, the caller is told
        return False, RuntimeError("the operator stopped during the call")
    except Exception as error:
        return False, error


class StatusJobStore:
    """``recstore.core.reshard.drive.JobRecord`` over an EmbeddingTable's status."""

    def __init__(
        self, kube: Kube, loop: asyncio.AbstractEventLoop, namespace: str, name: str
    ) -> None:
        self.kube, self.loop = kube, loop
        self.url = path("EmbeddingTable", namespace, name)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return call_on(self.loop, coro)

    def _body(self) -> dict[str, Any]:
        body = self._call(self.kube.get(self.url))
        if body is None:
            raise KubeError(404, f"EmbeddingTable {self.url} is gone")
        return body

    def stored_map(self) -> SlotMap | None:
        raw = (self._body().get("status") or {}).get("slotMap")
        return SlotMap.from_dict(raw) if raw else None

    def slot_map(self) -> SlotMap:
        stored = self.stored_map()
        if stored is None:
            raise KubeError(409, f"{self.url}: no slot map stored yet (call initialise)")
        return stored

    def job(self) -> ReshardJob | None:
        raw = (self._body().get("status") or {}).get("migrationJob")
        return ReshardJob.from_dict(raw) if raw else None

    def save_job(self, job: ReshardJob | None) -> None:
        # one merge patch: the job's keys are fixed, so it replaces the stored record whole
        status = {"migrationJob": None if job is None else job.to_dict()}
        self._call(self.kube.patch(f"{self.url}/status", {"status": status}))

    def initialise(self, served: SlotMap) -> SlotMap:
        """Store the nodes' map before a first move (kept if one is stored already)."""
        stored = self.stored_map()
        if stored is not None:
            return stored
        self._swap(lambda current: current is None, served)
        return self.slot_map()

    def commit(self, expected_epoch: int, slot_map: SlotMap) -> bool:
        return self._swap(
            lambda current: current is not None and current.epoch == expected_epoch, slot_map
        )

    def _swap(self, expected: Any, slot_map: SlotMap) -> bool:
        for _ in range(COMMIT_ATTEMPTS):
            body = self._body()
            status = body.get("status") or {}
            raw = status.get("slotMap")
            if not expected(SlotMap.from_dict(raw) if raw else None):
                return False
            replaced = copy.deepcopy(body)
            replaced["status"] = {
                **status, "slotMap": slot_map.to_dict(), "slotMapEpoch": slot_map.epoch
            }  # fmt: skip
            try:
                self._call(self.kube.replace(f"{self.url}/status", replaced))
            except KubeError as error:
                if error.status == 409:  # written meanwhile: read again and decide
                    continue
                raise
            return True
        return False
