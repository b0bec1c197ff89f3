"""Updates left in flight: ordered per table, bounded, failures reported once, read-your-writes."""

from __future__ import annotations

import threading

import pytest
import torch

from recstore.client.remote.updates import FAILED_NOTE, UpdatesInFlight

from .conftest import unique_name


class Gate:
    """A completion that finishes when the test opens it (or fails with ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()  # somebody waits on it
        self.error = error
        self.waits = 0

    def wait(self) -> object:
        self.waits += 1
        self.entered.set()
        assert self.opened.wait(10), "gate never opened"
        if self.error is not None:
            raise self.error
        return None


def test_settle_waits_for_that_tables_update_only() -> None:
    pending = UpdatesInFlight(threading.RLock(), max_in_flight=8)
    first, other = Gate(), Gate()
    pending.add("a", first)
    pending.add("b", other)
    settled = threading.Event()

    def read() -> None:
        pending.settle("a")
        settled.set()

    thread = threading.Thread(target=read)
    thread.start()
    assert not settled.wait(0.05)  # "a" still in flight: the reader waits
    first.opened.set()
    thread.join(5)
    assert settled.is_set() and len(pending) == 1  # "b" untouched
    pending.settle("never-updated")  # nothing in flight: returns at once
    other.opened.set()
    pending.settle_all()
    assert len(pending) == 0


def test_failure_is_raised_once_by_the_next_call_on_that_table() -> None:
    pending = UpdatesInFlight(threading.RLock())
    failing = Gate(RuntimeError("node refused the gradients"))
    failing.opened.set()
    pending.add("a", failing)
    pending.settle("b")  # another table does not see it
    with pytest.raises(RuntimeError, match="node refused") as caught:
        pending.settle("a")
    assert FAILED_NOTE in getattr(caught.value, "__notes__", [])
    pending.settle("a")  # reported once
    assert len(pending) == 0


def test_settle_all_reports_every_failed_table() -> None:
    pending = UpdatesInFlight(threading.RLock())
    for name in ("a", "b"):
        gate = Gate(RuntimeError(f"{name} failed"))
        gate.opened.set()
        pending.add(name, gate)
    with pytest.raises(RuntimeError, match="a failed") as caught:
        pending.settle_all()
    assert any("1 more" in note for note in caught.value.__notes__)
    pending.settle_all()  # nothing left to report


def test_in_flight_updates_are_bounded() -> None:
    pending = UpdatesInFlight(threading.RLock(), max_in_flight=2)
    gates = [Gate() for _ in range(3)]
    pending.add("t0", gates[0])
    pending.add("t1", gates[1])
    added = threading.Event()

    def add_third() -> None:
        pending.add("t2", gates[2])
        added.set()

    thread = threading.Thread(target=add_third)
    thread.start()
    assert gates[0].entered.wait(60)  # the third waits for the oldest
    assert gates[0].waits == 1
    assert not added.is_set()
    gates[0].opened.set()
    thread.join(5)
    assert added.is_set() and len(pending) == 2
    for gate in gates[1:]:
        gate.opened.set()
    pending.settle_all()


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        UpdatesInFlight(threading.RLock(), max_in_flight=0)


# -- against two real PS nodes -------------------------------------------------------------


def test_background_updates_are_seen_by_the_next_pull(grpc_client) -> None:
    """Many updates sent without waiting give exactly the rows of waiting for each one."""
    name = unique_name()
    weights = torch.randn(400, 4, generator=torch.Generator().manual_seed(3))
    grpc_client.init_data(
        name, (400, 4), torch.float32, init_func=lambda s, d: weights.clone(),
        optimizer={"kind": "adagrad", "lr": 0.1},
    )  # fmt: skip
    reference = torch.nn.Parameter(weights.clone())
    optimizer = torch.optim.Adagrad([reference], lr=0.1)
    g = torch.Generator().manual_seed(4)
    for _ in range(6):
        ids = torch.unique(torch.randint(0, 400, (150,), generator=g))
        grads = torch.randn(len(ids), 4, generator=g)
        grpc_client._for_modules.apply_gradients([(name, ids, grads, True)])  # not waited for
        optimizer.zero_grad()
        reference.grad = torch.sparse_coo_tensor(
            ids.unsqueeze(0), grads, (400, 4), check_invariants=True
        )
        optimizer.step()
        # read-your-writes after every step (adagrad is order-sensitive)
        torch.testing.assert_close(
            grpc_client.pull(name, ids), reference.detach()[ids], atol=1e-5, rtol=0
        )
    grpc_client.flush()
    assert grpc_client.ops.updates_in_flight == 0


def test_failed_background_update_raises_at_the_next_call(grpc_client) -> None:
    name = unique_name()
    grpc_client.init_data(name, (50, 4), torch.float32)
    before = grpc_client.pull(name, torch.arange(50))
    # rows of the wrong width: the nodes refuse them (the modules never send such a thing)
    grpc_client._for_modules.apply_gradients([(name, torch.arange(10), torch.ones(10, 3), True)])
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT") as caught:
        grpc_client.pull(name, torch.arange(50))
    assert FAILED_NOTE in caught.value.__notes__
    torch.testing.assert_close(grpc_client.pull(name, torch.arange(50)), before)  # nothing applied
    grpc_client._for_modules.apply_gradients([(name, torch.arange(10), torch.ones(10, 3), True)])
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):
        grpc_client.flush()
    grpc_client.flush()  # reported once


def test_local_updates_are_applied_at_once(local_client) -> None:
    name = unique_name()
    local_client.init_data(name, (10, 2), torch.float32, init_func=lambda s, d: torch.ones(s))
    local_client._for_modules.apply_gradients(
        [(name, torch.tensor([1, 1]), torch.ones(2, 2), False)]
    )
    local_client.flush()
    torch.testing.assert_close(local_client.pull(name, torch.tensor([1])), torch.full((1, 2), 0.98))
