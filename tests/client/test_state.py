"""state_dict / load_state_dict / torch.save of recstore.nn models, like torch.nn's."""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn

from .conftest import unique_name

NUM, DIM = 40, 6


class Model(torch.nn.Module):
    """A bag and a dense head; built with torch.nn or recstore.nn, same state_dict keys."""

    def __init__(self, bag: torch.nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bag, self.head = bag, torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids))


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(seed))


def _torch_model(seed: int) -> Model:
    return Model(torch.nn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_rows(seed)))


def _recstore_model(client, seed: int, **options) -> Model:
    bag = rnn.EmbeddingBag(NUM, DIM, mode="sum", _weight=_rows(seed), client=client,
                           name=unique_name("state"), **options)  # fmt: skip
    return Model(bag)


def _assert_same(a: Model, b: Model) -> None:
    for (key, x), (other, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert key == other
        torch.testing.assert_close(x, y, atol=0, rtol=0, msg=key)


def test_state_dict_has_torchs_keys_and_the_tables_rows(any_client) -> None:
    model, reference = _recstore_model(any_client, 1), _torch_model(1)
    assert list(model.state_dict()) == list(reference.state_dict()) == [
        "bag.weight", "head.weight", "head.bias",
    ]  # fmt: skip
    _assert_same(model, reference)
    ids = torch.tensor([[1, 2], [3, 3]])
    model(ids).sum().backward()  # the table trains itself
    assert not torch.equal(model.state_dict()["bag.weight"], _rows(1))
    torch.testing.assert_close(model.state_dict()["bag.weight"], model.bag.weight)


def test_torch_save_and_load_round_trip_between_torch_and_recstore(any_client, tmp_path) -> None:
    source, target = _recstore_model(any_client, 1), _recstore_model(any_client, 2)
    source(torch.tensor([[1, 2]])).sum().backward()
    torch.save(source.state_dict(), tmp_path / "recstore.pt")
    target.load_state_dict(torch.load(tmp_path / "recstore.pt"))
    _assert_same(target, source)
    from_torch = _torch_model(3)
    target.load_state_dict(from_torch.state_dict())  # torch.nn -> recstore.nn
    _assert_same(target, from_torch)
    to_torch = _torch_model(4)
    to_torch.load_state_dict(source.state_dict())  # recstore.nn -> torch.nn
    _assert_same(to_torch, source)


def test_load_state_dict_is_strict_like_torch(local_client) -> None:
    model, reference = _recstore_model(local_client, 1), _torch_model(1)
    good = {**_torch_model(2).state_dict(), "head.bias": torch.ones(1)}
    cases = {
        "missing": {k: v for k, v in good.items() if k != "bag.weight"},
        "unexpected": {**good, "bag.extra": torch.zeros(1)},
        "shape": {**good, "bag.weight": torch.zeros(NUM + 1, DIM)},
        "type": {**good, "bag.weight": [1.0]},
    }
    for case, state in cases.items():
        with pytest.raises(RuntimeError) as torchs:
            reference.load_state_dict(state)
        with pytest.raises(RuntimeError) as ours:
            model.load_state_dict(state)
        first = str(torchs.value).splitlines()[1].split(":")[0]  # e.g. "Missing key(s) in ..."
        assert first in str(ours.value), case
        _assert_same(model, reference)  # torch loads what matches before it raises, so do we
    assert torch.equal(model.bag.weight, _rows(2))  # loaded by the "missing" and "unexpected"
    for state in (cases["missing"], cases["unexpected"], _torch_model(3).state_dict()):
        result = model.load_state_dict(state, strict=False)
        assert result == reference.load_state_dict(state, strict=False)
        _assert_same(model, reference)


def test_rows_travel_in_blocks(local_client, monkeypatch) -> None:
    import recstore.client.table_rows as state

    monkeypatch.setattr(state, "STATE_CHUNK_BYTES", 7 * DIM * 4)  # 7 rows per block
    pulls: list[int] = []
    pushes: list[int] = []
    original_pull, original_push = local_client.pull, local_client.push
    monkeypatch.setattr(local_client, "pull", lambda n, ids: pulls.append(len(ids))
                        or original_pull(n, ids))  # fmt: skip
    monkeypatch.setattr(local_client, "push", lambda n, ids, rows: pushes.append(len(ids))
                        or original_push(n, ids, rows))  # fmt: skip
    model = _recstore_model(local_client, 1)
    pushes.clear()
    state_dict = model.state_dict()
    assert pulls == [7, 7, 7, 7, 7, 5]
    model.load_state_dict(_torch_model(2).state_dict())
    assert pushes == [7, 7, 7, 7, 7, 5]
    torch.testing.assert_close(state_dict["bag.weight"], _rows(1))
    torch.testing.assert_close(model.bag.weight, _rows(2))


def test_a_lazy_state_dict_copies_another_table_block_by_block(any_client, monkeypatch) -> None:
    from recstore.client import checkpoint
    from recstore.client.state import TableWeight

    monkeypatch.setattr(TableWeight, "materialise", None)  # never one whole tensor here
    source, target = _recstore_model(any_client, 1), _recstore_model(any_client, 2)
    state = checkpoint.state_dict(source)
    assert isinstance(state["bag.weight"], TableWeight)
    target.load_state_dict(state)
    torch.testing.assert_close(target.bag.read_weights(), _rows(1), atol=0, rtol=0)
    target.load_state_dict(checkpoint.state_dict(target))  # its own rows: nothing to copy
    torch.testing.assert_close(target.bag.read_weights(), _rows(1), atol=0, rtol=0)
