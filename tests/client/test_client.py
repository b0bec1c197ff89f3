"""RecStoreClient as documented, against both backends, checked against plain torch."""

from __future__ import annotations

import pytest
import torch

from recstore.client import RecStoreClient, TableNotInitialized
from recstore.client import initial_data as initial_data_module

from .conftest import unique_name


def _table(
    client: RecStoreClient, rows: int = 200, dim: int = 8, **kwargs
) -> tuple[str, torch.Tensor]:
    name = unique_name()
    weights = torch.randn(rows, dim, generator=torch.Generator().manual_seed(rows + dim))
    client.init_data(
        name, (rows, dim), torch.float32, init_func=lambda s, d: weights.clone(), **kwargs
    )
    return name, weights


def test_init_data_writes_init_func_rows(any_client) -> None:
    name, weights = _table(any_client)
    assert any_client.get_data_meta(name) == (torch.float32, (200, 8))
    assert name in any_client.data_name_list() and name in any_client.gdata_name_list()
    torch.testing.assert_close(any_client.pull(name, torch.arange(200)), weights)


def test_without_init_func_rows_start_at_zero(any_client) -> None:
    name = unique_name()
    any_client.init_data(name, (50, 4), torch.float32, is_gdata=False)
    assert torch.count_nonzero(any_client.pull(name, torch.arange(50))) == 0
    assert name not in any_client.gdata_name_list()


def test_pull_converts_ids_and_keeps_input_order(any_client) -> None:
    name, weights = _table(any_client)
    ids = torch.tensor([7, 3, 7, 199, 0, 3], dtype=torch.int32)
    torch.testing.assert_close(any_client.pull(name, ids), weights[ids.long()])
    assert any_client.pull(name, torch.empty(0, dtype=torch.int64)).shape == (0, 8)


def test_push_assigns_rows_last_duplicate_wins(any_client) -> None:
    name, weights = _table(any_client)
    ids = torch.tensor([4, 9, 4])
    data = torch.arange(24, dtype=torch.float32).view(3, 8)
    any_client.push(name, ids, data)
    expected = weights.clone()
    expected[9], expected[4] = data[1], data[2]
    torch.testing.assert_close(any_client.pull(name, torch.arange(200)), expected)


def test_update_is_sgd_with_summed_duplicates(any_client) -> None:
    name, weights = _table(any_client)
    ids = torch.tensor([1, 5, 1, 150])
    grads = torch.randn(4, 8)
    any_client.update(name, ids, grads)
    expected = weights.clone().index_add_(0, ids, grads, alpha=-0.01)
    torch.testing.assert_close(
        any_client.pull(name, torch.arange(200)), expected, atol=1e-6, rtol=0
    )


def test_set_learning_rate_changes_later_updates(any_client) -> None:
    name, weights = _table(any_client)
    any_client.set_learning_rate(0.5)
    ids, grads = torch.tensor([2]), torch.ones(1, 8)
    any_client.update(name, ids, grads)
    torch.testing.assert_close(any_client.pull(name, ids), weights[2:3] - 0.5)
    any_client.update(name, ids, grads, lr=0.25)  # a per-call rate wins
    torch.testing.assert_close(any_client.pull(name, ids), weights[2:3] - 0.75)


def test_adagrad_table_matches_torch(any_client) -> None:
    name, weights = _table(any_client, optimizer={"kind": "adagrad", "lr": 0.1})
    reference = torch.nn.Parameter(weights.clone())
    optimizer = torch.optim.Adagrad([reference], lr=0.1)
    for step in range(4):
        ids = torch.randint(0, 200, (30,), generator=torch.Generator().manual_seed(step))
        grads = torch.randn(30, 8, generator=torch.Generator().manual_seed(100 + step))
        any_client.update(name, ids, grads)
        optimizer.zero_grad()
        reference.grad = torch.zeros_like(reference).index_add_(0, ids, grads)
        optimizer.step()
    torch.testing.assert_close(
        any_client.pull(name, torch.arange(200)), reference.detach(), atol=1e-5, rtol=0
    )


def test_base_offset_addresses_ids_from_the_offset(any_client) -> None:
    name, weights = _table(any_client, rows=20, base_offset=1000)
    torch.testing.assert_close(any_client.pull(name, torch.tensor([1000, 1019])), weights[[0, 19]])
    with pytest.raises(ValueError, match="out of range"):
        any_client.pull(name, torch.tensor([999]))


def test_prefetch_returns_what_pull_returns(any_client) -> None:
    name, weights = _table(any_client)
    ids = torch.tensor([10, 11, 10])
    prefetch_id = any_client.prefetch(ids)  # defaults to the table used last
    torch.testing.assert_close(any_client.wait_for_prefetch(prefetch_id, timeout=10), weights[ids])
    other, other_weights = _table(any_client, rows=30)
    prefetch_id = any_client.prefetch(ids, name=name)
    assert isinstance(any_client.is_prefetch_done(prefetch_id), bool)
    torch.testing.assert_close(any_client.wait_for_prefetch(prefetch_id, timeout=10), weights[ids])
    prefetch_id = any_client.prefetch(torch.tensor([1]))  # `name` was used last
    torch.testing.assert_close(any_client.wait_for_prefetch(prefetch_id, timeout=10), weights[[1]])
    any_client.pull(other, torch.tensor([0]))
    prefetch_id = any_client.prefetch(torch.tensor([1]))
    torch.testing.assert_close(
        any_client.wait_for_prefetch(prefetch_id, timeout=10), other_weights[[1]]
    )


def test_unknown_table_is_a_runtime_error(any_client) -> None:
    for call in (
        lambda: any_client.pull("missing", torch.tensor([1])),
        lambda: any_client.push("missing", torch.tensor([1]), torch.zeros(1, 8)),
        lambda: any_client.update("missing", torch.tensor([1]), torch.zeros(1, 8)),
        lambda: any_client.get_data_meta("missing"),
        lambda: any_client.delete_data("missing"),
        lambda: any_client.prefetch(torch.tensor([1]), name="missing"),
    ):
        with pytest.raises(RuntimeError, match="missing"):
            call()


def test_init_data_again(any_client) -> None:
    name, _ = _table(any_client)
    any_client.update(name, torch.tensor([0]), torch.ones(1, 8))
    any_client.init_data(name, (200, 8), torch.float32, init_func=lambda s, d: torch.zeros(s))
    assert not torch.equal(any_client.pull(name, torch.tensor([0])), torch.zeros(1, 8))  # kept
    with pytest.raises(TypeError, match="already initialised"):
        any_client.init_data(name, (200, 16), torch.float32)
    with pytest.raises(TypeError):
        any_client.init_data(name, (200, 8), torch.float16)


def test_init_data_meets_other_clients_table_of_another_shape(any_client) -> None:
    name, _ = _table(any_client)
    other = RecStoreClient(role=unique_name("role"))
    try:
        if any_client.backend == "grpc":
            other.set_ps_endpoints(list(any_client.ops.endpoints))
        else:
            other.set_ps_backend("local")
        with pytest.raises(TypeError, match="exists"):
            other.init_data(name, (200, 4), torch.float32)
        assert name not in other.data_name_list()
        other.init_data(name, (200, 8), torch.float32)  # same layout: adopted, rows kept
        torch.testing.assert_close(
            other.pull(name, torch.arange(5)), any_client.pull(name, torch.arange(5))
        )
    finally:
        other.close()


def test_delete_data_frees_the_backend_table(any_client) -> None:
    name, _ = _table(any_client)
    any_client.delete_data(name)
    assert name not in any_client.data_name_list()
    assert any_client.ops.describe(name) is None
    with pytest.raises(RuntimeError):
        any_client.pull(name, torch.tensor([1]))
    any_client.init_data(name, (10, 2), torch.float32)  # the name is free again, any shape
    assert any_client.pull(name, torch.tensor([9])).shape == (1, 2)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c, n: c.update(n, torch.tensor([1, 200]), torch.ones(2, 8)), ValueError),
        (lambda c, n: c.update(n, torch.tensor([1, -1]), torch.ones(2, 8)), ValueError),
        (lambda c, n: c.update(n, torch.tensor([1, 2]), torch.ones(2, 7)), ValueError),
        (lambda c, n: c.update(n, torch.tensor([1.0]), torch.ones(1, 8)), TypeError),
        (lambda c, n: c.update(n, torch.tensor([1]), torch.ones(1, 8), lr=-1.0), ValueError),
        (lambda c, n: c.push(n, torch.tensor([1, 2]), torch.ones(3, 8)), ValueError),
        (lambda c, n: c.push(n, torch.tensor([1, 999]), torch.ones(2, 8)), ValueError),
        (lambda c, n: c.push(n, torch.tensor([1]), torch.ones(1, 8, dtype=torch.int64)), TypeError),
    ],
)
def test_rejected_calls_change_nothing(any_client, call, error) -> None:
    name, weights = _table(any_client)
    with pytest.raises(error):
        call(any_client, name)
    torch.testing.assert_close(any_client.pull(name, torch.arange(200)), weights)


def test_failing_init_func_leaves_no_table(any_client) -> None:
    name = unique_name()
    with pytest.raises(ValueError, match="init_func"):
        any_client.init_data(name, (10, 4), torch.float32, init_func=lambda s, d: torch.zeros(3, 3))
    assert name not in any_client.data_name_list()
    assert any_client.ops.describe(name) is None


def test_big_tables_are_initialised_in_chunks(any_client, monkeypatch) -> None:
    monkeypatch.setattr(initial_data_module, "INIT_CHUNK_BYTES", 40 * 4 * 4)  # 40 rows of dim 4
    shapes: list[tuple[int, int]] = []

    def init(shape, dtype):
        shapes.append(shape)
        return torch.full(shape, float(len(shapes)), dtype=dtype)

    name = unique_name()
    any_client.init_data(name, (100, 4), torch.float32, init_func=init, base_offset=7)
    assert shapes == [(40, 4), (40, 4), (20, 4)]
    rows = any_client.pull(name, torch.arange(7, 107))[:, 0]
    assert rows.tolist() == [1.0] * 40 + [2.0] * 40 + [3.0] * 20


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tables(any_client, dtype) -> None:
    name = unique_name()
    weights = torch.randn(20, 4).to(dtype)
    any_client.init_data(name, (20, 4), dtype, init_func=lambda s, d: weights.clone())
    rows = any_client.pull(name, torch.tensor([3, 1]))
    assert rows.dtype == dtype
    torch.testing.assert_close(rows, weights[[3, 1]])


def test_unknown_table_error_type() -> None:
    assert issubclass(TableNotInitialized, RuntimeError)
