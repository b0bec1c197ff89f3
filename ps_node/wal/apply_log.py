"""Which node applied writes to which slots, at which slot-map epoch: read from the WAL.

Online resharding is correct only if, for every slot, exactly one node applies
writes at any epoch and a slot's writes never go back to an older epoch. Every
write record of a node's write-ahead log says the epoch it was applied under
(``recstore.ps.wal.records.FLAG_EPOCH``), and a named update its request id, so the logs
of a table's nodes, read together after a move, show whether that held:

- one owner: no (slot, epoch) written by two nodes;
- epochs never going down: along each node's log, and along each client's
  requests (a client's request ids only grow), a slot's epoch never decreases;
- exactly once: no request applied twice (by one node or two).

``python -m recstore.ps.wal.apply_log TABLE DATA_DIR...`` audits the nodes whose
data directories are given (WAL durability; segments a checkpoint let go of
are no longer there to read) and exits 1 when a rule is broken.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recstore.core import NUM_SLOTS, slots_touched
from recstore.ps import catalogue
from recstore.ps.wal import records as wal
from recstore.ps.wal import segments as wal_segments

#: the records that are a client's writes (an import or a step count moves rows or state)
CLIENT_WRITES = frozenset({wal.OP_PUSH, wal.OP_UPDATE})
#: problems of one kind listed at most (the count of the rest is said)
SHOWN = 10


@dataclass(frozen=True)
class Applied:
    """One logged client write: the distinct slots it touched, the epoch it was applied at."""

    epoch: int
    slots: np.ndarray  # sorted distinct slots
    client: str = ""  # of its request id; "" when unnamed
    seq: int = 0


@dataclass(frozen=True)
class NodeLog:
    """The client writes of one node's log of a table, in log (apply) order."""

    node: str
    writes: tuple[Applied, ...]
    unattributed: int = 0  # records of logs written before epochs were logged


def table_wal_dir(data_dir: Path, table: str) -> Path:
    """The log directory of ``table`` on the node keeping ``data_dir`` (its incarnation's)."""
    entry = (catalogue.load(data_dir) or {}).get(table)
    if entry is None:
        raise LookupError(f"no table {table!r} in the catalogue of {data_dir}")
    return data_dir / "wal" / f"{table}-{entry.incarnation}"


def read(directory: Path, node: str) -> NodeLog:
    """The client writes logged in ``directory``, every segment still there."""
    writes: list[Applied] = []
    unattributed = 0

    def note(record: wal.WalRecord) -> None:
        nonlocal unattributed
        if record.op not in CLIENT_WRITES:
            return
        if record.epoch is None:
            unattributed += 1
            return
        named = record.request.request_id if record.request is not None else None
        slots = slots_touched(record.keys)
        if named is None:
            writes.append(Applied(record.epoch, slots))
        else:
            writes.append(Applied(record.epoch, slots, named.client, named.seq))

    present = wal_segments.generations(directory)  # from the oldest segment a checkpoint kept
    wal_segments.replay(directory, present[0] if present else 0, note)
    return NodeLog(node, tuple(writes), unattributed)


def audit(logs: Sequence[NodeLog]) -> list[str]:
    """Every broken rule over the logs of all the nodes of one table."""
    clients: dict[str, int] = {}
    columns = [_columns(log, n, clients) for n, log in enumerate(logs)]
    slot, epoch, node, client, seq, order = (
        np.concatenate([c[i] for c in columns]) if columns else np.empty(0, np.int64)
        for i in range(6)
    )
    names = [log.node for log in logs]
    client_names = list(clients)
    problems: list[str] = []
    # one owner per (slot, epoch)
    owners = np.unique(np.stack([epoch * NUM_SLOTS + slot, node]), axis=1)
    keys, counts = np.unique(owners[0], return_counts=True)
    problems += _listed(
        f"slot {key % NUM_SLOTS} at epoch {key // NUM_SLOTS} written by "
        f"{sorted(names[n] for n in owners[1][owners[0] == key])}"
        for key in keys[counts > 1]
    )
    # epochs never going down, along each node's log and along each client's requests
    for group, along, label in (
        (node, order, lambda g: f"node {names[g]}"),
        (client, seq, lambda g: f"client {client_names[g]}"),
    ):
        named = group >= 0
        g, s, o, e = group[named], slot[named], along[named], epoch[named]
        ranked = np.lexsort((o, s, g))
        g, s, e = g[ranked], s[ranked], e[ranked]
        down = np.flatnonzero((g[1:] == g[:-1]) & (s[1:] == s[:-1]) & (e[1:] < e[:-1]))
        problems += _listed(
            f"slot {s[i]}: epoch went down from {e[i]} to {e[i + 1]} along {label(g[i])}"
            for i in down
        )
    # exactly once: the records of a request (one per item of its table) are appended
    # together, so a request applied twice shows as a second run of its records
    runs = [
        (clients[w.client], w.seq)
        for log in logs
        for previous, w in zip((None, *log.writes), log.writes, strict=False)
        if w.client and (previous is None or (previous.client, previous.seq) != (w.client, w.seq))
    ]
    requests, times = np.unique(np.array(runs, np.int64).reshape(-1, 2), axis=0, return_counts=True)
    problems += _listed(
        f"request {q} of client {client_names[c]} applied {n} times"
        for (c, q), n in zip(requests[times > 1], times[times > 1], strict=True)
    )
    return problems


def _columns(log: NodeLog, node: int, clients: dict[str, int]) -> tuple[np.ndarray, ...]:
    """A row per (write, slot) of one node's log: slot, epoch, node, client, seq, log order."""
    writes = log.writes
    per_write = np.array([len(w.slots) for w in writes], np.int64)
    client_ids = [clients.setdefault(w.client, len(clients)) if w.client else -1 for w in writes]

    def spread(values: list[int]) -> np.ndarray:
        return np.repeat(np.array(values, np.int64), per_write)

    slots = [w.slots.astype(np.int64) for w in writes]
    return (
        np.concatenate(slots) if slots else np.empty(0, np.int64),
        spread([w.epoch for w in writes]),
        np.full(int(per_write.sum()), node, np.int64),
        spread(client_ids),
        spread([w.seq for w in writes]),
        spread(list(range(len(writes)))),
    )


def _listed(problems: Iterable[str]) -> list[str]:
    found = list(problems)
    if len(found) > SHOWN:
        return [*found[:SHOWN], f"... and {len(found) - SHOWN} more like these"]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recstore.ps.wal.apply_log",
        description="Audit the slot, epoch and node of every write in a table's logs.",
    )
    parser.add_argument("table")
    parser.add_argument("data_dirs", nargs="+", type=Path, metavar="DATA_DIR")
    args = parser.parse_args(argv)
    try:
        logs = [read(table_wal_dir(d, args.table), str(d)) for d in args.data_dirs]
    except LookupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    problems = audit(logs)
    writes = sum(len(log.writes) for log in logs)
    unattributed = sum(log.unattributed for log in logs)
    print(f"{writes} writes on {len(logs)} nodes, {unattributed} logged without an epoch")
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
