"""The (slot, epoch, node) of every write, read back from a node's log, and its audit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recstore.core import SlotMap, slot_of
from recstore.core.control import ControlClient
from recstore.core.reshard.messages import set_slot_map_rpc
from recstore.core.routing import SlotRange
from recstore.ps.serve.server import start_in_thread
from recstore.ps.wal import apply_log
from recstore.ps.wal.apply_log import Applied, NodeLog

from .conftest import Client, spec


def _slots(*slots: int) -> np.ndarray:
    return np.array(slots, np.uint16)


def test_logs_of_a_correct_move_pass() -> None:
    source = NodeLog("0", (Applied(1, _slots(5, 6), "t", 1), Applied(1, _slots(5), "t", 3)))
    target = NodeLog("1", (Applied(2, _slots(5), "t", 4), Applied(3, _slots(5, 9))))
    assert apply_log.audit([source, target]) == []


def test_two_owners_of_a_slot_at_one_epoch_are_found() -> None:
    logs = [NodeLog("a", (Applied(4, _slots(7, 8)),)), NodeLog("b", (Applied(4, _slots(8)),))]
    assert apply_log.audit(logs) == ["slot 8 at epoch 4 written by ['a', 'b']"]


def test_an_epoch_going_down_is_found_along_a_node_and_along_a_client() -> None:
    node = NodeLog("a", (Applied(3, _slots(1)), Applied(2, _slots(1))))
    assert apply_log.audit([node]) == ["slot 1: epoch went down from 3 to 2 along node a"]
    # each node's log is in order; the client's requests show slot 2 going back to epoch 1
    later = NodeLog("a", (Applied(1, _slots(2), "t", 9),))
    earlier = NodeLog("b", (Applied(2, _slots(2), "t", 8),))
    assert apply_log.audit([later, earlier]) == [
        "slot 2: epoch went down from 2 to 1 along client t"
    ]


def test_a_request_applied_twice_is_found() -> None:
    twice = Applied(1, _slots(3), "t", 5)
    other = Applied(1, _slots(4), "t", 6)
    on_two_nodes = [NodeLog("a", (twice,)), NodeLog("b", (Applied(2, _slots(3), "t", 5),))]
    assert apply_log.audit(on_two_nodes) == ["request 5 of client t applied 2 times"]
    on_one = [NodeLog("a", (twice, other, twice))]
    assert apply_log.audit(on_one) == ["request 5 of client t applied 2 times"]


def test_the_records_of_one_request_in_a_row_are_one_application() -> None:
    """A MultiUpdate with two items for one table: two records of one request."""
    items = (Applied(1, _slots(3), "t", 5), Applied(1, _slots(3, 4), "t", 5))
    assert apply_log.audit([NodeLog("a", items)]) == []


def test_a_long_list_of_problems_is_cut_short() -> None:
    logs = [NodeLog(n, (Applied(1, np.arange(20, dtype=np.uint16)),)) for n in "ab"]
    problems = apply_log.audit(logs)
    assert len(problems) == apply_log.SHOWN + 1 and problems[-1] == "... and 10 more like these"


def test_a_node_logs_each_write_with_its_epoch_and_request(tmp_path: Path) -> None:
    """Writes before and after a new slot map: each logged with the epoch it was applied at."""
    handle = start_in_thread(data_dir=tmp_path / "node", durability="wal")
    client, control = Client(handle.address), ControlClient(handle.address, timeout=30)
    try:
        client.create(spec("t", num_embeddings=100, embedding_dim=2))
        keys = np.arange(10)
        client.update("t", keys, np.ones((10, 2), "<f4"), lr=1.0)
        client.push("t", keys[:3], np.zeros((3, 2), "<f4"))
        later = SlotMap(2, (SlotRange(0, 16384, 0),))
        control.call(set_slot_map_rpc("t", 1, later))
        client.update("t", keys[5:], np.ones((5, 2), "<f4"), lr=1.0)
        log = apply_log.read(apply_log.table_wal_dir(tmp_path / "node", "t"), "0")
    finally:
        control.close()
        client.close()
        handle.stop(final_checkpoint=False)
    assert [w.epoch for w in log.writes] == [1, 1, 2] and log.unattributed == 0
    assert log.writes[0].slots.tolist() == sorted(set(slot_of(keys).tolist()))
    assert log.writes[2].slots.tolist() == sorted(set(slot_of(keys[5:]).tolist()))


def test_the_command_audits_data_dirs_and_says_what_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = start_in_thread(data_dir=tmp_path / "node", durability="wal")
    client = Client(handle.address)
    try:
        client.create(spec("t", num_embeddings=100, embedding_dim=2))
        client.update("t", np.arange(4), np.ones((4, 2), "<f4"))
    finally:
        client.close()
        handle.stop(final_checkpoint=False)
    assert apply_log.main(["t", str(tmp_path / "node")]) == 0
    assert capsys.readouterr().out == "1 writes on 1 nodes, 0 logged without an epoch\n"
    assert apply_log.main(["other", str(tmp_path / "node")]) == 2
    assert "no table 'other'" in capsys.readouterr().err


def test_a_log_a_checkpoint_trimmed_is_read_from_its_oldest_segment(tmp_path: Path) -> None:
    handle = start_in_thread(data_dir=tmp_path / "node", durability="wal")
    client = Client(handle.address)
    try:
        client.create(spec("t", num_embeddings=100, embedding_dim=2))
        client.update("t", np.arange(4), np.ones((4, 2), "<f4"))
        client.save()  # segment 0 is let go of
        client.update("t", np.arange(2), np.ones((2, 2), "<f4"))
    finally:
        client.close()
        handle.stop(final_checkpoint=False)
    log = apply_log.read(apply_log.table_wal_dir(tmp_path / "node", "t"), "0")
    assert len(log.writes) == 1 and log.writes[0].slots.tolist() == sorted(
        set(slot_of(np.arange(2)).tolist())
    )
