"""A pool's reshard steps: grow first, move the tables, shrink last, never below a table."""

from __future__ import annotations

import pytest

from recstore.core.pool import PoolResharding, PoolSpec
from recstore.core.pool_capacity import NODE_BYTES, footprint
from recstore.core.pool_reshard import TableSpan, pool_step, shrink_refusal, table_span
from recstore.core.reshard.plan import ReshardJob
from recstore.core.routing import SlotMap
from recstore.core.spec import TableSpec

MiB = 2**20
AT2, AT3 = TableSpan(2, True), TableSpan(3, True)
MOVING = TableSpan(3, False)  # a move between 2 and 3 nodes, unfinished


def test_a_span_counts_an_unfinished_moves_nodes() -> None:
    two = SlotMap.initial(2)
    job = ReshardJob.start("t", two, 3, 1024)
    assert table_span(two.to_dict(), None) == AT2
    assert table_span(two.to_dict(), job.to_dict()) == MOVING
    assert table_span(SlotMap.initial(3).to_dict(), {**job.to_dict(), "phase": "done"}) == AT3


@pytest.mark.parametrize(
    ("replicas", "tables", "busy", "failed", "scale_to", "move", "moved"),
    [
        # grow: the nodes first, every table moves
        (2, {"a": AT2, "b": AT2}, (), (), 3, ("a", "b"), 0),
        # grown: the moves started are left running; none starts twice
        (3, {"a": MOVING, "b": AT2}, ("a",), (), None, ("b",), 0),
        (3, {"a": AT3, "b": AT3}, (), (), None, (), 2),
        # a failed table waiting for its retry is neither moved again nor in the way
        (3, {"a": AT3, "b": AT2}, ("b",), ("b",), None, (), 1),
    ],
)
def test_growing(
    replicas: int,
    tables: dict[str, TableSpan],
    busy: tuple[str, ...],
    failed: tuple[str, ...],
    scale_to: int | None,
    move: tuple[str, ...],
    moved: int,
) -> None:
    step = pool_step(target=3, replicas=replicas, tables=tables, busy=busy, failed=failed,
                     previous=PoolResharding(from_shards=2, to_shards=3, tables_moved=0,
                                             tables_total=2))  # fmt: skip
    assert (step.scale_to, step.move) == (scale_to, move)
    assert step.progress is not None and step.progress.tables_moved == moved
    assert (step.progress.from_shards, step.progress.to_shards, step.progress.tables_total) == (
        2, 3, 2
    )  # fmt: skip
    assert step.progress.failed == sorted(failed)


@pytest.mark.parametrize(
    ("tables", "busy", "failed", "scale_to", "move"),
    [
        ({"a": AT3, "b": AT3}, (), (), None, ("a", "b")),  # the moves first, the nodes stay
        ({"a": AT2, "b": MOVING}, ("b",), (), None, ()),  # b still spans 3 nodes
        ({"a": AT2, "b": AT2}, (), (), 2, ()),  # every table moved: the nodes go
        # b's move failed for good: it keeps its 3 nodes, the pool keeps them for it
        ({"a": AT2, "b": AT3}, (), ("b",), None, ()),
    ],
)
def test_shrinking(
    tables: dict[str, TableSpan],
    busy: tuple[str, ...],
    failed: tuple[str, ...],
    scale_to: int | None,
    move: tuple[str, ...],
) -> None:
    started = PoolResharding(from_shards=3, to_shards=2, tables_moved=0, tables_total=2)
    step = pool_step(
        target=2, replicas=3, tables=tables, busy=busy, failed=failed, previous=started
    )
    assert (step.scale_to, step.move) == (scale_to, move)
    assert step.progress is not None and step.progress.failed == sorted(failed)
    assert (step.progress.from_shards, step.progress.to_shards) == (3, 2)


def test_a_finished_change_stays_shown_and_nothing_asked_shows_nothing() -> None:
    assert pool_step(target=2, replicas=2, tables={"a": AT2}) == (
        pool_step(target=2, replicas=2, tables={"a": AT2}, previous=None)
    )
    assert pool_step(target=2, replicas=2, tables={"a": AT2}).progress is None
    done = PoolResharding(from_shards=2, to_shards=3, tables_moved=1, tables_total=1)
    step = pool_step(target=3, replicas=3, tables={"a": AT3}, previous=done)
    assert (step.scale_to, step.move, step.progress) == (None, (), done)
    # grown already when nothing was stored yet: the change started where the tables were
    grown = pool_step(target=3, replicas=3, tables={"a": AT2, "b": MOVING})
    assert grown.progress is not None and grown.progress.from_shards == 3
    assert pool_step(target=3, replicas=3, tables={"a": AT2}).progress == PoolResharding(
        from_shards=2, to_shards=3, tables_moved=0, tables_total=1
    )
    # back to 2 after 2 -> 3: a new change, from the 3 nodes running
    back = pool_step(target=2, replicas=3, tables={"a": AT3}, previous=done)
    assert back.progress is not None and back.progress.from_shards == 3


def test_a_shrink_is_refused_when_the_tables_would_not_fit_the_fewer_nodes() -> None:
    table = TableSpec(name="t", num_embeddings=200_000, embedding_dim=16)
    on3, on2 = footprint(table, 3).host, footprint(table, 2).host
    memory = (NODE_BYTES + 2 * on3 + (2 * on2 - 2 * on3) // 2) // MiB  # 2 fit on 3, not on 2
    pool = PoolSpec.model_validate({"placement": {"resources": {"memory": f"{memory}Mi"}}})
    tables = [("a", table), ("b", table)]
    refusal = shrink_refusal("p", pool, tables, running=3, target=2)
    assert refusal is not None
    assert refusal.startswith("shrinking pool 'p' from 3 to 2 nodes is refused and nothing moved")
    assert "table 'b' needs" in refusal and "on each of 2 nodes" in refusal
    assert "'a'" not in refusal  # a alone fits
    assert shrink_refusal("p", pool, tables[:1], running=3, target=2) is None
    assert shrink_refusal("p", pool, tables, running=3, target=4) is None  # a grow
