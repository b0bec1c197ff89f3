"""The de-dup window as pure logic, its log records, and request ids on the wire."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from recstore.core import InvalidArgument, wire
from recstore.core.errors import RequestOutcomeUnknown
from recstore.core.request_id import RequestId, RequestIds, read, with_request_id
from recstore.ps.wal import dedup
from recstore.ps.wal import records as wal
from recstore.ps.wal.dedup import DedupWindow, Entry, RequestIdReused

DIGEST = b"d" * 16
OTHER = b"o" * 16


def entry(seq: int, client: str = "c", slots: tuple[int, ...] = (1,), digest: bytes = DIGEST):
    return Entry(RequestId(client, seq), digest, (len(slots),), np.array(slots, np.uint16))


def applied(window: DedupWindow, e: Entry) -> None:
    assert window.begin(e.request_id, e.digest) is None
    window.finish(e)


@pytest.mark.parametrize(
    ("resend", "digest", "outcome"),
    [
        (1, DIGEST, "answered"),  # a resend of an applied id: its entry
        (1, OTHER, RequestIdReused),  # the same id, other content: refused
        (3, DIGEST, "apply"),  # a new id
    ],
)
def test_begin_decides_by_id_and_digest(resend: int, digest: bytes, outcome: object) -> None:
    window = DedupWindow(capacity=8)
    applied(window, entry(1))
    applied(window, entry(2))
    rid = RequestId("c", resend)
    if outcome == "answered":
        assert window.begin(rid, digest) == entry(1)
    elif outcome == "apply":
        assert window.begin(rid, digest) is None
    else:
        with pytest.raises(RequestIdReused, match="other content"):
            window.begin(rid, digest)


def test_eviction_bound_and_low_water_mark() -> None:
    window = DedupWindow(capacity=2)
    for seq in (1, 2, 3):
        applied(window, entry(seq))
    assert len(window) == 2 and [e.request_id.seq for e in window.entries()] == [2, 3]
    with pytest.raises(RequestOutcomeUnknown, match="older than this node's de-dup window"):
        window.begin(RequestId("c", 1), DIGEST)  # evicted: never applied a second time
    assert window.begin(RequestId("c", 2), DIGEST) == entry(2)  # still held
    assert window.begin(RequestId("other", 1), DIGEST) is None  # another client's marks


def test_client_marks_are_bounded_too() -> None:
    window = DedupWindow(capacity=1)
    for client in ("a", "b", "c"):
        applied(window, entry(1, client))
    assert len(window._low_water) == 1  # only the last client that lost an entry


def test_an_id_being_applied_waits_for_the_outcome() -> None:
    window = DedupWindow()
    e = entry(1)
    assert window.begin(e.request_id, DIGEST) is None  # the first sender applies it
    seen: list[Entry | None] = []
    resend = threading.Thread(target=lambda: seen.append(window.begin(e.request_id, DIGEST)))
    resend.start()
    assert window.wait_for_waiters(1, timeout=30)
    window.finish(e)
    resend.join(30)
    assert seen == [e]


def test_an_abandoned_id_lets_the_waiting_resend_apply() -> None:
    window = DedupWindow()
    rid = RequestId("c", 1)
    assert window.begin(rid, DIGEST) is None
    seen: list[Entry | None] = []
    resend = threading.Thread(target=lambda: seen.append(window.begin(rid, DIGEST)))
    resend.start()
    assert window.wait_for_waiters(1, timeout=30)
    window.abandon(rid)  # refused before anything was applied
    resend.join(30)
    assert seen == [None]


def test_entries_touching_and_absorb_move_entries_with_their_slots() -> None:
    source, target = DedupWindow(), DedupWindow()
    applied(source, entry(1, slots=(5, 9)))
    applied(source, entry(2, slots=(100,)))
    moving = np.zeros(16384, bool)
    moving[9] = True
    moved = source.entries_touching(moving)
    assert [e.request_id.seq for e in moved] == [1]
    target.absorb(moved)
    assert target.begin(RequestId("c", 1), DIGEST) is not None  # a resend there is answered
    assert target.begin(RequestId("c", 2), DIGEST) is None
    target.absorb([entry(1, slots=(7,))])  # the same id again: slots merged
    assert target.entries()[0].slots.tolist() == [5, 7, 9]


def test_changes_touching_lists_what_changed_since_a_version() -> None:
    window = DedupWindow(capacity=3)
    moving = np.zeros(16384, bool)
    moving[[5, 9]] = True
    applied(window, entry(1, slots=(5,)))
    applied(window, entry(2, slots=(100,)))  # another slot: never listed
    first, version = window.changes_touching(moving, 0)
    assert [(v, e.request_id.seq) for v, e in first] == [(1, 1)] and version == 2
    assert window.changes_touching(moving, version) == ([], version)
    window.absorb([entry(1, slots=(9,))])  # a merge changes entry 1: listed again, merged
    applied(window, entry(3, slots=(9,)))
    changed, later = window.changes_touching(moving, version)
    assert [(e.request_id.seq, e.slots.tolist()) for _, e in changed] == [(1, [5, 9]), (3, [9])]
    assert [v for v, _ in changed] == [3, 4]  # each entry's version: where a page may stop
    assert [e.request_id.seq for _, e in window.changes_touching(moving, 3)[0]] == [3]
    applied(window, entry(4, slots=(5,)))  # evicts entry 1: a merge does not make it younger
    assert [e.request_id.seq for _, e in window.changes_touching(moving, later)[0]] == [4]
    assert [e.request_id.seq for _, e in window.changes_touching(moving, 0)[0]] == [3, 4]
    assert [e.request_id.seq for e in window.entries()] == [2, 3, 4]


def test_begin_all_refuses_an_id_known_to_some_tables_only() -> None:
    first, second = DedupWindow(), DedupWindow()
    applied(first, entry(1))
    with pytest.raises(RequestOutcomeUnknown, match="known to 1 of the 2 tables"):
        dedup.begin_all([first, second], RequestId("c", 1), DIGEST)
    assert second.begin(RequestId("c", 1), DIGEST) is None  # abandoned there, not stuck


def test_window_capacity_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dedup.WINDOW_ENV, "7")
    assert dedup.capacity_from_env() == 7
    monkeypatch.setenv(dedup.WINDOW_ENV, "0")
    with pytest.raises(ValueError, match="positive integer"):
        dedup.capacity_from_env()


# -- log records -------------------------------------------------------------------
def test_a_named_record_and_a_window_record_round_trip() -> None:
    keys = np.array([3, 4], "<i8")
    grads = np.ones((2, 4), "<f4")
    named = entry(5)
    payload = wal.encode_record(
        wal.OP_UPDATE, keys.tobytes(), grads.tobytes(), "float32", 2, 4, 1.0, request=named
    )
    record = wal.decode_payload(payload)
    assert record.request is not None and record.request.request_id == RequestId("c", 5)
    assert record.request.rows == named.rows and len(record.request.slots) == 0
    np.testing.assert_array_equal(record.values, grads)
    window = wal.encode_window_record([entry(1, slots=(2, 3)), entry(2, "x")])
    opening = wal.decode_payload(window)
    assert opening.op == wal.OP_WINDOW
    assert [(e.request_id, e.slots.tolist()) for e in opening.window] == [
        (RequestId("c", 1), [2, 3]),
        (RequestId("x", 2), [1]),
    ]


def test_records_without_a_request_read_as_before() -> None:
    """A log written before request ids: flags 0, nothing after the values."""
    keys, grads = np.array([1], "<i8"), np.ones((1, 2), "<f4")
    payload = wal.encode_record(
        wal.OP_UPDATE, keys.tobytes(), grads.tobytes(), "float32", 1, 2, None
    )
    assert wal.HEAD.unpack_from(payload)[2] == 0
    record = wal.decode_payload(payload)
    assert record.request is None and record.lr is None


# -- request ids on the wire ---------------------------------------------------------
def test_an_appended_id_is_read_back_and_the_native_decoder_skips_it() -> None:
    body = wire.encode_update_request("emb", np.arange(3, dtype="<i8"), np.ones((3, 2), "<f4"))
    ids = RequestIds("trainer-0")
    named_body = with_request_id("Update", body, ids.next())
    named = read("Update", named_body)
    assert named is not None and named.request_id == RequestId("trainer-0", 1)
    assert read("Update", body) is None
    assert ids.next().seq == 2
    assert wire.decode_update_request(named_body).table == "emb"
    other = wire.encode_update_request("emb", np.arange(3, dtype="<i8"), np.zeros((3, 2), "<f4"))
    assert read("Update", with_request_id("Update", other, RequestId("t", 1))).digest != (
        read("Update", with_request_id("Update", body, RequestId("t", 1))).digest
    )


@pytest.mark.parametrize("method", ["Update", "MultiUpdate"])
def test_gradients_of_another_step_change_the_sampled_digest(method: str) -> None:
    keys = np.arange(4096, dtype="<i8")
    rng = np.random.default_rng(0)
    digests = set()
    for grads in (rng.standard_normal((4096, 16)), rng.standard_normal((4096, 16))):
        grads = grads.astype("<f4")
        if method == "Update":
            body = wire.encode_update_request("emb", keys, grads)
        else:
            item = wire.UpdateRequest("emb", 0, keys.data, grads.data)
            body = wire.encode_multi_update_request([item])
        named = read(method, with_request_id(method, body, RequestId("t", 1)))
        assert named is not None
        digests.add(named.digest)
    assert len(digests) == 2


def test_a_multi_pull_digests_only_its_carried_updates() -> None:
    pull = wire.PullRequest("emb", 0, np.arange(2, dtype="<i8").data)
    update = wire.UpdateRequest(
        "emb", 0, np.arange(2, dtype="<i8").data, np.ones((2, 2), "<f4").data
    )
    rid = RequestId("t", 1)
    one = read(
        "MultiPull",
        with_request_id("MultiPull", wire.encode_multi_pull_request([pull], [update]), rid),
    )
    pull_other = wire.PullRequest("emb", 0, np.arange(5, dtype="<i8").data)
    two = read(
        "MultiPull",
        with_request_id("MultiPull", wire.encode_multi_pull_request([pull_other], [update]), rid),
    )
    assert one is not None and two is not None and one.digest == two.digest
    assert wire.decode_multi_pull_carrying(one.rest)[1] == []  # the pulls alone remain


@pytest.mark.parametrize(("client", "seq"), [("", 1), ("x" * 129, 1), ("c", 0)])
def test_bad_request_ids_are_refused(client: str, seq: int) -> None:
    with pytest.raises(InvalidArgument, match="request id"):
        RequestId(client, seq)
