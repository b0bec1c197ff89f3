"""The operator writes a status only when it changes: compared as the API server stores it.

A status goes as a merge patch, whose nulls delete; the stored status then lacks the null
fields of its checkpoints, and reading it back must not look like a change (else every
refresh would write the status and mirror it to the admin API again)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from recstore.core.checkpoint_status import ShardCheckpoint, outcome
from recstore.core.status import TableStatus
from recstore.operator.status import status_changed

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
DONE = outcome("request-3", [ShardCheckpoint(index=0, rows=3)], now=T0, request_id=3)
STATUS = TableStatus(phase="Ready", slot_map_epoch=1, last_checkpoint=DONE, checkpoint_request=DONE)


def _merged(stored: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386: what the API server keeps after a merge patch."""
    out = dict(stored)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = _merged(out.get(key) or {}, value)
        else:
            out[key] = value
    return out


def test_a_status_read_back_as_stored_is_no_change() -> None:
    wire = STATUS.to_wire()
    stored = _merged({}, wire)
    assert "message" not in stored["checkpointRequest"]  # the null went
    assert not status_changed(stored, wire)


@pytest.mark.parametrize(
    "update",
    [
        {"phase": "Degraded"},
        {"checkpoint_request": DONE.model_copy(update={"state": "Failed", "message": "x"})},
        {"last_checkpoint": None},
    ],
)
def test_a_real_change_is_one(update: dict[str, Any]) -> None:
    stored = _merged({}, STATUS.to_wire())
    assert status_changed(stored, STATUS.model_copy(update=update).to_wire())
