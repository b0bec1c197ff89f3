"""recstore.nn where a torch.nn user would notice a difference: errors, dtypes, edge cases."""

from __future__ import annotations

import pytest
import torch

from recstore import nn as rnn
from recstore.client.errors import IdDtypeError, IdOutOfRange
from recstore.client.lookup import renormalise_
from recstore.core import InvalidArgument

from .conftest import unique_name

NUM, DIM = 30, 4


def _weights(scale: float = 1.0) -> torch.Tensor:
    return torch.randn(NUM, DIM, generator=torch.Generator().manual_seed(11)) * scale


def _bag(client, **options) -> rnn.EmbeddingBag:
    return rnn.EmbeddingBag(
        NUM, DIM, _weight=_weights(), client=client, name=unique_name("dropin"), **options
    )


def _torch_error(module: torch.nn.Module, *args: torch.Tensor) -> type[Exception]:
    with pytest.raises(Exception) as raised:
        module(*args)
    return type(raised.value)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("options", [{}, {"padding_idx": 2}, {"max_norm": 1.0}])
def test_out_of_range_ids_raise_what_torch_raises_and_change_nothing(
    any_client, options, dtype
) -> None:
    embedding = rnn.Embedding(
        NUM, DIM, _weight=_weights(), client=any_client, name=unique_name(), **options
    )
    pairs = [(embedding, torch.nn.Embedding(NUM, DIM, **options)),
             (_bag(any_client, **options), torch.nn.EmbeddingBag(NUM, DIM, **options))]  # fmt: skip
    for module, reference in pairs:
        for bad in (torch.tensor([[1, NUM]], dtype=dtype), torch.tensor([[-1, 2]], dtype=dtype)):
            torch_error = _torch_error(reference, bad)  # IndexError or RuntimeError
            with pytest.raises(IdOutOfRange, match="out of range") as raised:
                module(bad)
            assert isinstance(raised.value, torch_error) and isinstance(
                raised.value, InvalidArgument
            )
        torch.testing.assert_close(module.weight, _weights())


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.float32])
@pytest.mark.parametrize("options", [{}, {"padding_idx": 2}])
def test_id_dtypes_torch_refuses_are_refused_like_torch(local_client, options, dtype) -> None:
    ids = torch.tensor([[1, 2]]).to(dtype)
    for torch_module in (torch.nn.Embedding(NUM, DIM), torch.nn.EmbeddingBag(NUM, DIM)):
        with pytest.raises(RuntimeError, match="Long, Int"):
            torch_module(ids)
    embedding = rnn.Embedding(NUM, DIM, client=local_client, name=unique_name(), **options)
    for module in (embedding, _bag(local_client, **options)):
        with pytest.raises(IdDtypeError, match="Long, Int") as raised:
            module(ids)
        assert isinstance(raised.value, RuntimeError)


@pytest.mark.parametrize(
    ("offsets", "torch_error"),
    [([1, 3], RuntimeError), ([0, 9], RuntimeError), ([[0, 2]], ValueError)],
)
def test_bad_offsets_raise_torchs_error_before_max_norm_writes(
    any_client, offsets, torch_error
) -> None:
    ids, offsets = torch.tensor([1, 2, 3, 4]), torch.tensor(offsets)
    weights = _weights(scale=3.0)  # every row over max_norm: a lookup would rescale them
    with pytest.raises(torch_error):
        torch.nn.EmbeddingBag(NUM, DIM, max_norm=1.0, _weight=weights.clone())(ids, offsets)
    module = rnn.EmbeddingBag(NUM, DIM, max_norm=1.0, _weight=weights.clone(),
                              client=any_client, name=unique_name())  # fmt: skip
    with pytest.raises(torch_error):
        module(ids, offsets)
    torch.testing.assert_close(module.weight, weights)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_last_offset_with_padding_absent_matches_torch(local_client, mode) -> None:
    """With include_last_offset torch's bags depend on padding_idx being set, present or not."""
    options = {"mode": mode, "include_last_offset": True, "padding_idx": 7}
    reference = torch.nn.EmbeddingBag(NUM, DIM, _weight=_weights(), **options)
    module = _bag(local_client, **options)
    ids, offsets = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 2])  # ids after the last
    with torch.no_grad():
        torch.testing.assert_close(module(ids, offsets), reference(ids, offsets))


def test_max_norm_rescales_rows_exactly_like_torch() -> None:
    rows = torch.randn(4000, 16, generator=torch.Generator().manual_seed(5)) * 3
    expected = rows.clone()
    torch.embedding_renorm_(expected, torch.arange(len(rows)), 1.3, 2.0)
    got = rows.clone()
    renormalise_(got, 1.3, 2.0)
    assert torch.equal(got, expected)


def test_embedding_bag_from_pretrained_is_torchs(local_client) -> None:
    weights = _weights()
    reference = torch.nn.EmbeddingBag.from_pretrained(weights, mode="sum", padding_idx=1)
    module = rnn.EmbeddingBag.from_pretrained(
        weights, mode="sum", padding_idx=1, client=local_client, name=unique_name()
    )
    ids = torch.tensor([[1, 2, 3], [4, 4, 1]])
    out = module(ids)
    torch.testing.assert_close(out, reference(ids))
    assert not out.requires_grad and module.mode == "sum" and module.padding_idx == 1
    trainable = rnn.EmbeddingBag.from_pretrained(
        weights, freeze=False, client=local_client, name=unique_name()
    )
    assert trainable(ids).requires_grad


@pytest.mark.parametrize(
    "convert",
    [lambda m: m.to(torch.float16), lambda m: m.half(), lambda m: m.double(),
     lambda m: m.bfloat16(), lambda m: torch.nn.Sequential(m).to(torch.float64)],
)  # fmt: skip
def test_converting_the_table_dtype_raises_clearly(local_client, convert) -> None:
    module = _bag(local_client)
    with pytest.raises(TypeError, match="Create the module with dtype="):
        convert(module)
    torch.testing.assert_close(module.weight, _weights())
    assert module.weight.dtype == torch.float32


def test_device_moves_and_same_dtype_conversions_keep_working(local_client) -> None:
    module = _bag(local_client)
    assert module.to("cpu") is module
    assert module.to(torch.float32).float() is module
    assert torch.nn.Sequential(module).to("cpu", torch.float32)[0] is module
    half = rnn.EmbeddingBag(NUM, DIM, dtype=torch.float16, client=local_client,
                            name=unique_name())  # fmt: skip
    assert half.half() is half
    with pytest.raises(TypeError, match="float16"):
        half.float()


def test_collections_take_int32_ids_on_every_road(any_client) -> None:
    options = [{"mode": "sum"}, {"mode": "mean", "padding_idx": 3},
               {"mode": "max", "include_last_offset": True}]  # fmt: skip
    references = [torch.nn.EmbeddingBag(NUM, DIM, _weight=_weights(), **o) for o in options]
    bags = [_bag(any_client, **o) for o in options]
    collection = rnn.EmbeddingBagCollection(bags)
    ids = torch.tensor([1, 3, 5, 3, 8, 9, 0], dtype=torch.int32)
    features = [
        (ids, torch.tensor([0, 2, 2, 5], dtype=torch.int32)),  # uneven, an empty bag
        (ids, torch.tensor([0, 3], dtype=torch.int32)),
        (ids, torch.tensor([0, 4, 7], dtype=torch.int32)),
    ]
    for out, reference, feature in zip(collection(features), references, features, strict=True):
        torch.testing.assert_close(out, reference(*feature))


@pytest.mark.parametrize(
    "options",
    [{}, {"padding_idx": 2}, {"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"mode": "max"}],
    ids=["plain", "padding", "max_norm", "scaled", "max"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_batch_of_empty_bags_trains_like_torch(any_client, options, compiled) -> None:
    """No id in the whole batch (a feature absent from it): zero rows out, no row stepped."""
    reference = torch.nn.EmbeddingBag(NUM, DIM, _weight=_weights(), **options)
    module = _bag(any_client, optimizer={"kind": "sgd", "lr": 0.1}, **options)
    embedding = rnn.Embedding(NUM, DIM, _weight=_weights(), client=any_client,
                              name=unique_name("dropin"))  # fmt: skip
    run = torch.compile(module, backend="aot_eager") if compiled else module
    lookup = torch.compile(embedding, backend="aot_eager") if compiled else embedding
    # the repeated id sorts last: torch 2.13's CPU bag divides by another id's count (docs/sdk.md)
    batches = [
        (torch.tensor([4, 3, 4]), torch.tensor([0, 1, 1])),
        (torch.tensor([], dtype=torch.long), torch.zeros(3, dtype=torch.long)),
    ]
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for ids, offsets in batches:
        out, expected = run(ids, offsets), reference(ids, offsets)
        torch.testing.assert_close(out, expected)
        optimizer.zero_grad()
        out.sum().backward()
        expected.sum().backward()
        optimizer.step()
        rows = lookup(ids)
        assert rows.shape == (len(ids), DIM)
        rows.sum().backward()
    torch.testing.assert_close(module.weight, reference.weight)
    assert not torch.equal(module.weight, _weights())  # the first batch did step
