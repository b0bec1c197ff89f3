"""The table status model and the checkpoint decisions every provisioner shares."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from recstore.core.checkpoint_status import (
    CheckpointState,
    ShardCheckpoint,
    TableCheckpoint,
    clip,
    in_flight,
    outcome,
    parse_request,
    requested_checkpoint_id,
    running,
)
from recstore.core.errors import InvalidArgument
from recstore.core.resource import CHECKPOINT_REQUEST_ANNOTATION, waiting_request
from recstore.core.status import EmbeddingTableStatus, TableStatus, validate_endpoint

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
OK0 = ShardCheckpoint(index=0, endpoint="h0:1", rows=3, bytes=24)
OK1 = ShardCheckpoint(index=1, endpoint="h1:1", rows=4, bytes=32)
BAD1 = ShardCheckpoint(index=1, endpoint="h1:1", error="UNAVAILABLE: refused")
BAD2 = ShardCheckpoint(index=2, error="the shard does not serve: its pod is not ready")


@pytest.mark.parametrize(
    ("shards", "state", "message"),
    [
        ([OK1, OK0], "Completed", None),
        ([OK0, BAD1], "Failed", "shard 1 (h1:1): UNAVAILABLE: refused"),
        ([BAD2, OK0, BAD1], "Failed", "shard 1 (h1:1): UNAVAILABLE: refused; "
         "shard 2: the shard does not serve: its pod is not ready"),
        ([], "Failed", "no shard to save: the table has no running shard"),
    ],
)  # fmt: skip
def test_outcome(shards, state, message):
    result = outcome("request-4", shards, now=T0, request_id=4)
    assert (result.state, result.message) == (state, message)
    assert [s.index for s in result.shards] == sorted(s.index for s in shards)
    assert (result.id, result.request_id, result.at) == ("request-4", 4, "2026-01-01T12:00:00Z")
    assert result.finished


def test_a_long_failure_is_cut_to_the_bound():
    many = [ShardCheckpoint(index=i, error="e" * 300) for i in range(8)]
    message = outcome("c", many, now=T0).message
    assert message is not None and len(message) == 1024 and message.endswith("…")


def test_running_is_the_request_taken():
    taken = running(12)
    assert (taken.id, taken.request_id, taken.state) == ("request-12", 12, "Running")
    assert not taken.finished and requested_checkpoint_id(12) == "request-12"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("1", 1), ("2147483647", 2147483647), (" 7 ", 7)],
)
def test_parse_request(value, expected):
    assert parse_request(value) == expected


@pytest.mark.parametrize("value", ["", "0", "-3", "2147483648", "seven", "1.5"])
def test_parse_request_refuses_what_is_no_request_id(value):
    with pytest.raises(InvalidArgument, match=r"is not an id in 1\.\.2147483647"):
        parse_request(value)


def _reported(request_id: int, state: CheckpointState) -> TableCheckpoint:
    return TableCheckpoint(id=f"request-{request_id}", request_id=request_id, state=state)


@pytest.mark.parametrize(
    ("requested", "reported", "waits"),
    [
        (None, None, False),
        (None, _reported(3, CheckpointState.running), False),
        (3, None, True),
        (3, _reported(3, CheckpointState.running), True),
        (3, _reported(3, CheckpointState.completed), False),
        (3, _reported(3, CheckpointState.failed), False),
        (4, _reported(3, CheckpointState.completed), True),
    ],
)
def test_in_flight(requested, reported, waits):
    assert in_flight(requested, reported) is waits


def _resource(annotation: str | None, reported: dict[str, Any] | None) -> dict[str, Any]:
    annotations = {CHECKPOINT_REQUEST_ANNOTATION: annotation} if annotation is not None else {}
    status = {"phase": "Ready", "checkpointRequest": reported} if reported else None
    return {"metadata": {"annotations": annotations}, "status": status}


@pytest.mark.parametrize(
    ("resource", "waiting"),
    [
        ({}, None),
        (_resource(None, None), None),
        (_resource("5", None), 5),
        (_resource("5", {"id": "request-5", "requestId": 5, "state": "Running"}), 5),
        (_resource("5", {"id": "request-5", "requestId": 5, "state": "Completed"}), None),
        (_resource("5", {"id": "request-4", "requestId": 4, "state": "Failed"}), 5),
        # a status an older version wrote (a bare id) reports no request
        ({**_resource("5", None), "status": {"phase": "Ready", "checkpointRequest": "x"}}, 5),
    ],
)
def test_waiting_request_reads_the_annotation_against_the_status(resource, waiting):
    assert waiting_request(resource) == waiting


def test_clip_keeps_what_fits():
    assert clip("short") == "short" and clip("x" * 1024) == "x" * 1024
    assert clip("abcdef", 4) == "abc…"


def test_ready_shards_are_the_ready_shards_counted():
    shards = [{"index": 0, "ready": True}, {"index": 1, "ready": False}]
    assert TableStatus.model_validate({"phase": "Ready", "shards": shards}).ready_shards is None
    TableStatus.model_validate({"phase": "Ready", "readyShards": 1, "shards": shards})
    with pytest.raises(ValidationError, match="readyShards is 2 but 1 of the shards are ready"):
        TableStatus.model_validate({"phase": "Ready", "readyShards": 2, "shards": shards})


def test_the_wire_form_sends_a_slot_map_only_when_there_is_one():
    bare = TableStatus(phase="Ready").to_wire()
    assert "slotMap" not in bare and bare["lastCheckpoint"] is None
    moved = TableStatus.model_validate(
        {"phase": "Ready", "slotMap": {"epoch": 3, "ranges": [[0, 16384, 0]]}}
    )
    assert moved.to_wire()["slotMap"] == {"epoch": 3, "ranges": [[0, 16384, 0]]}
    job = EmbeddingTableStatus(phase="Ready").to_wire()
    assert "migrationJob" not in job


@pytest.mark.parametrize(
    ("stored", "kept"),
    [
        (None, None),
        ({}, None),
        ({"slotMap": {"epoch": 2, "ranges": []}}, None),  # no phase: nothing to go on
        ({"phase": "Sleeping"}, None),
        ({"phase": "Ready", "slotMapEpoch": 3}, {"phase": "Ready", "slotMapEpoch": 3}),
        # written by an older version, or by another part: what does not fit is left out
        ({"phase": "Ready", "lastCheckpoint": "final-20260101T000000Z", "slotMapEpoch": 3},
         {"phase": "Ready", "slotMapEpoch": 3}),
        ({"phase": "Ready", "migrationJob": {"phase": "copy"}, "readyShards": 4},
         {"phase": "Ready"}),
    ],
)  # fmt: skip
def test_from_stored_keeps_what_fits(stored, kept):
    found = TableStatus.from_stored(stored)
    assert found == (TableStatus.model_validate(kept) if kept is not None else None)


@pytest.mark.parametrize(
    ("endpoint", "ok"),
    [("h:1", True), ("10.0.0.1:65535", True), ("[::1]:50051", True), ("h:0", False),
     ("h:65536", False), ("h", False), ("-h:1", False)],
)  # fmt: skip
def test_validate_endpoint(endpoint, ok):
    if ok:
        assert validate_endpoint(endpoint) == endpoint
    else:
        with pytest.raises(ValueError, match="host:port"):
            validate_endpoint(endpoint)
