"""The hand-written wire codec agrees with protobuf's generated classes, byte for byte.

The generated classes (``recstore.v1.ps_pb2``) are the oracle: what the codec
writes parses there to the same fields, what they write decodes here to the
same fields, and input they reject the codec rejects with InvalidArgument.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from recstore import _native
from recstore.core import InvalidArgument, ps_fields, wire
from recstore.v1 import ps_pb2

DECODERS: dict[type, Any] = {
    ps_pb2.PullRequest: wire.decode_pull_request,
    ps_pb2.PushRequest: wire.decode_push_request,
    ps_pb2.UpdateRequest: wire.decode_update_request,
    ps_pb2.PullResponse: wire.decode_pull_response,
    ps_pb2.PushResponse: lambda data: wire.RowsResponse(wire.decode_rows_response(data)),
    ps_pb2.UpdateResponse: lambda data: wire.RowsResponse(wire.decode_rows_response(data)),
}


def fields_of(decoded: Any) -> dict[str, Any]:
    """A decoded dataclass as plain values (payload views as bytes)."""
    out = dict(vars(decoded))
    return {k: bytes(v) if isinstance(v, memoryview | bytearray) else v for k, v in out.items()}


#: fields the data-path decoders leave to another reader (recstore.core.request_id)
READ_ELSEWHERE = {"request_id"}


def generated_fields(message: Any) -> dict[str, Any]:
    fields = [f.name for f in message.DESCRIPTOR.fields if f.name not in READ_ELSEWHERE]
    out = {name: getattr(message, name) for name in fields}
    if "lr" in out:
        out["lr"] = message.lr if message.HasField("lr") else None
    return out


def tag(number: int, wire_type: int) -> bytes:
    return wire.encode_varint(number << 3 | wire_type)


# -- varints ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "width", "encoded"),
    [
        (0, 0, b"\x00"),
        (1, 0, b"\x01"),
        (127, 0, b"\x7f"),
        (128, 0, b"\x80\x01"),
        (300, 0, b"\xac\x02"),
        (2**64 - 1, 0, b"\xff" * 9 + b"\x01"),
        (0, 3, b"\x80\x80\x00"),  # padded: redundant continuation bytes
        (5, 10, b"\x85" + b"\x80" * 8 + b"\x00"),
        (300, 4, b"\xac\x82\x80\x00"),
    ],
)
def test_varint_encoding(value: int, width: int, encoded: bytes) -> None:
    assert wire.encode_varint(value, width) == encoded
    assert wire.decode_varint(memoryview(encoded + b"tail"), 0) == (value, len(encoded))


@pytest.mark.parametrize(("value", "width"), [(-1, 0), (2**64, 0), (1, 11)])
def test_varint_out_of_range_is_refused(value: int, width: int) -> None:
    with pytest.raises(ValueError, match="varint"):
        wire.encode_varint(value, width)


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"", "truncated"), (b"\x80", "truncated"), (b"\xff" * 9, "truncated"),
     (b"\xff" * 10 + b"\x01", "longer than 10")],
)  # fmt: skip
def test_bad_varints_are_invalid_arguments(data: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        wire.decode_varint(memoryview(data), 0)


# -- every field type, both directions ------------------------------------------------
FIELD_CASES = [  # (message class, field, value): one case per field kind
    (ps_pb2.PullRequest, "table", "emb"),
    (ps_pb2.PullRequest, "table", "ünïcode-名"),
    (ps_pb2.PullRequest, "epoch", 2**64 - 1),
    (ps_pb2.PullRequest, "epoch", 1),
    (ps_pb2.PullRequest, "keys", bytes(range(256)) * 3),
    (ps_pb2.PullRequest, "read_only", True),
    (ps_pb2.PushRequest, "dim", 2**32 - 1),
    (ps_pb2.PushRequest, "dtype", "bfloat16"),
    (ps_pb2.PushRequest, "values", b"\x00\x01" * 1000),
    (ps_pb2.UpdateRequest, "lr", 0.125),
    (ps_pb2.UpdateRequest, "lr", 0.0),  # optional: present even when zero
    (ps_pb2.UpdateRequest, "grad_dtype", "float16"),
    (ps_pb2.UpdateRequest, "grads", b"\xff" * 4096),
    (ps_pb2.PullResponse, "values", b"\x01" * 70000),
    (ps_pb2.PullResponse, "found", b"\x01\x00\x01"),
    (ps_pb2.PushResponse, "rows", 2**40),
    (ps_pb2.UpdateResponse, "rows", 7),
]


@pytest.mark.parametrize(("cls", "field", "value"), FIELD_CASES)
def test_decoding_matches_generated_parse(cls: type, field: str, value: Any) -> None:
    message = cls(**{field: value})
    decoded = fields_of(DECODERS[cls](message.SerializeToString()))
    assert decoded == generated_fields(message)


def test_empty_messages_decode_to_defaults() -> None:
    assert fields_of(wire.decode_update_request(b"")) == generated_fields(ps_pb2.UpdateRequest())
    assert wire.decode_rows_response(b"") == 0


@pytest.mark.parametrize("name", ["", "t", "emb", "a-longer-table-name", "x" * 63])
@pytest.mark.parametrize("rows", [0, 1, 3, 1000, 40000])
@pytest.mark.parametrize("epoch", [0, 1, 300, 2**40])
def test_requests_parse_with_generated_classes_and_align_payloads(
    name: str, rows: int, epoch: int
) -> None:
    keys = np.arange(rows, dtype="<i8") * 7 - 5
    values = np.arange(rows * 3, dtype="<f2").reshape(rows, 3)
    pull = wire.encode_pull_request(name, keys, epoch=epoch, read_only=True)
    push = wire.encode_push_request(name, keys, values, epoch=epoch, dtype="float16", dim=3)
    update = wire.encode_update_request(name, keys, values, epoch=epoch, dim=3, lr=0.5)
    expected_push = ps_pb2.PushRequest(
        table=name, epoch=epoch, keys=keys.tobytes(), values=values.tobytes(), dtype="float16",
        dim=3,
    )  # fmt: skip
    assert ps_pb2.PullRequest.FromString(pull) == ps_pb2.PullRequest(
        table=name, epoch=epoch, keys=keys.tobytes(), read_only=True
    )
    assert ps_pb2.PushRequest.FromString(push) == expected_push
    assert ps_pb2.UpdateRequest.FromString(update) == ps_pb2.UpdateRequest(
        table=name, epoch=epoch, keys=keys.tobytes(), grads=values.tobytes(), dim=3, lr=0.5
    )
    for message in (pull, push, update):
        decoded = wire.decode_push_request(message)  # fields 3 and 4 are the payloads of all
        base = address(memoryview(message))
        for view in (decoded.keys, decoded.values):
            if len(view) and epoch < 2**21:  # (a pad varint of up to 3 bytes can widen)
                assert (address(view) - base) % wire.ALIGN == 0  # 8-aligned in the message
        assert isinstance(decoded.keys, memoryview) and bytes(decoded.keys) == keys.tobytes()


def address(view: Any) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize(
    ("rows", "dim", "dtype"),
    [(0, 8, "float32"), (1, 1, "float16"), (5, 3, "bfloat16"), (2000, 64, "float32")],
)
def test_pull_response_frame_parses_with_generated_classes(
    rows: int, dim: int, dtype: str, read_only: bool
) -> None:
    rng = np.random.default_rng(rows)
    rows_in = rng.integers(0, 2**16, (rows, dim)).astype(wire.WIRE_DTYPES[dtype])
    found_in = rng.integers(0, 2, rows).astype(bool)
    message, values, found = wire.pull_response_frame(rows, dim, dtype, read_only)
    values[:] = rows_in
    if found is not None:
        found[:] = found_in
    sent = wire.finish(message)
    assert type(sent) is bytes
    parsed = ps_pb2.PullResponse.FromString(sent)
    assert (parsed.dim, parsed.dtype) == (dim, dtype)
    assert parsed.values == rows_in.tobytes()
    assert parsed.found == (found_in.tobytes() if read_only else b"")
    decoded = wire.decode_pull_response(sent)
    view = wire.rows_view(decoded.values, rows, dim, dtype)
    np.testing.assert_array_equal(view, rows_in)
    assert rows == 0 or np.shares_memory(view, np.frombuffer(sent, np.uint8))  # no copy


@pytest.mark.parametrize("rows", [0, 1, 2**33])
def test_rows_response_matches_generated(rows: int) -> None:
    assert wire.encode_rows_response(rows) == ps_pb2.PushResponse(rows=rows).SerializeToString()
    assert wire.encode_rows_response(rows) == ps_pb2.UpdateResponse(rows=rows).SerializeToString()


@settings(max_examples=60, deadline=None)
@given(
    table=st.text(max_size=20),
    epoch=st.integers(0, 2**64 - 1),
    keys=st.binary(max_size=64),
    grads=st.binary(max_size=64),
    grad_dtype=st.sampled_from(["", "float32", "float16"]),
    lr=st.none() | st.floats(width=32, allow_nan=False),
    dim=st.integers(0, 2**32 - 1),
)
def test_update_request_round_trips_both_ways(**fields: Any) -> None:
    message = ps_pb2.UpdateRequest(**{k: v for k, v in fields.items() if v is not None})
    assert fields_of(wire.decode_update_request(message.SerializeToString())) == fields
    ours = wire.encode_update_request(**fields)
    assert generated_fields(ps_pb2.UpdateRequest.FromString(ours)) == fields


# -- unknown fields, odd layouts, malformed input ------------------------------------
UNKNOWN_FIELDS = [  # every wire type, as a field number the schema does not know
    tag(15, wire.VARINT) + wire.encode_varint(2**63),
    tag(16, wire.I64) + struct.pack("<d", 1.5),
    tag(17, wire.LEN) + wire.encode_varint(3) + b"abc",
    tag(18, wire.I32) + struct.pack("<f", 2.5),
    tag(19, wire.SGROUP) + tag(1, wire.VARINT) + b"\x05" + tag(19, wire.EGROUP),
    tag(2**29 - 1, wire.VARINT) + b"\x01",  # the largest field number
    tag(1, wire.VARINT) + b"\x07",  # a known number with the wrong wire type
    tag(2, wire.LEN) + b"\x01x",
]


@pytest.mark.parametrize("unknown", UNKNOWN_FIELDS)
@pytest.mark.parametrize("where", ["front", "middle", "back"])
def test_unknown_fields_are_skipped_as_protobuf_does(unknown: bytes, where: str) -> None:
    head = ps_pb2.PullRequest(table="emb", epoch=9).SerializeToString()
    tail = ps_pb2.PullRequest(keys=b"k" * 16, read_only=True).SerializeToString()
    data = {"front": unknown + head + tail, "middle": head + unknown + tail,
            "back": head + tail + unknown}[where]  # fmt: skip
    expected = generated_fields(ps_pb2.PullRequest.FromString(data))
    assert fields_of(wire.decode_pull_request(data)) == expected
    assert expected["keys"] == b"k" * 16 and expected["table"] == "emb"


def test_a_repeated_scalar_keeps_its_last_value() -> None:
    data = (ps_pb2.PushRequest(table="a", dim=3, keys=b"1" * 8).SerializeToString()
            + ps_pb2.PushRequest(table="b", dim=5, keys=b"2" * 8).SerializeToString())  # fmt: skip
    assert fields_of(wire.decode_push_request(data)) == generated_fields(
        ps_pb2.PushRequest.FromString(data)
    )


def test_fields_in_any_order_and_overlong_varints_parse() -> None:
    keys = tag(3, wire.LEN) + wire.encode_varint(8, 5) + b"12345678"
    data = keys + tag(2, wire.VARINT) + wire.encode_varint(4, 10) + tag(1, wire.LEN) + b"\x01t"
    expected = generated_fields(ps_pb2.PullRequest.FromString(data))
    assert expected == {
        "table": "t", "epoch": 4, "keys": b"12345678", "read_only": False, "value_dtype": "",
    }  # fmt: skip
    assert fields_of(wire.decode_pull_request(data)) == expected


VALID = ps_pb2.UpdateRequest(
    table="emb", epoch=3, keys=b"k" * 16, grads=b"g" * 32, grad_dtype="float32", lr=0.5, dim=4
).SerializeToString()
MALFORMED = [
    (b"\x0f", "wire type 7"),  # invalid wire types
    (b"\x0e", "wire type 6"),
    (b"\x00\x01", "field number 0"),
    (tag(3, wire.LEN) + b"\x10" + b"short", "truncated"),  # length past the end
    (tag(3, wire.LEN) + b"\xff" * 9 + b"\x01", "truncated"),  # a length of 2**64 - 1
    (tag(9, wire.SGROUP) + tag(1, wire.VARINT) + b"\x01", "not closed"),
    (tag(9, wire.SGROUP) + tag(8, wire.EGROUP), "closed by end tag 8"),
    (tag(9, wire.EGROUP), "without a start"),
    (tag(1, wire.LEN) + b"\x02\xff\xfe", "UTF-8"),  # proto3 strings must be UTF-8
    (tag(6, wire.I32) + b"\x00\x00", "truncated"),  # a float cut short
    (tag(2, wire.VARINT) + b"\xff" * 10 + b"\x00", "longer than 10"),
]


def _nested_groups(depth: int) -> bytes:
    return (tag(9, wire.SGROUP) * depth + tag(1, wire.VARINT) + b"\x05"
            + tag(9, wire.EGROUP) * depth)  # fmt: skip


MALFORMED += [
    (tag(2**29, wire.VARINT) + b"\x01", "invalid field number 536870912"),  # past the largest
    (_nested_groups(101), "nested deeper than 100"),
    (tag(9, wire.SGROUP) + tag(8, wire.SGROUP) + tag(9, wire.EGROUP), "group 8 closed by"),
]


@pytest.mark.parametrize("depth", [1, 2, 100])
def test_nested_groups_are_skipped_as_protobuf_does(depth: int) -> None:
    data = _nested_groups(depth) + ps_pb2.UpdateRequest(table="t", epoch=5).SerializeToString()
    expected = generated_fields(ps_pb2.UpdateRequest.FromString(data))
    assert fields_of(wire.decode_update_request(data)) == expected


def test_varints_past_64_bits_wrap_as_protobuf_does() -> None:
    data = tag(2, wire.VARINT) + b"\xff" * 9 + b"\x7f"  # bits 64..69 set, dropped
    assert wire.decode_update_request(data).epoch == ps_pb2.UpdateRequest.FromString(data).epoch


def test_the_native_decoders_read_the_generated_schemas_into_the_dataclasses() -> None:
    schemas = _native.wire_schemas()
    classes = {"PullRequest": wire.PullRequest, "PushRequest": wire.PushRequest,
               "UpdateRequest": wire.UpdateRequest, "PullResponse": wire.PullResponse,
               "PushResponse": wire.RowsResponse, "UpdateResponse": wire.RowsResponse}  # fmt: skip
    assert set(schemas) == set(classes)
    for message, slots in schemas.items():
        generated = {
            number: (name, kind)
            for number, (name, kind) in ps_fields.SCHEMAS[message].items()
            if name not in READ_ELSEWHERE
        }
        assert {number: (name, kind) for name, number, kind in slots} == generated
        names = [field.name for field in dataclasses.fields(classes[message])]
        assert [name for name, _, _ in slots] == names


@pytest.mark.parametrize(
    "data",
    [bytearray(ps_pb2.PullRequest(table="t", keys=b"k" * 16).SerializeToString()),
     memoryview(b"..." + ps_pb2.PullRequest(table="t", keys=b"k" * 16).SerializeToString())[3:],
     np.frombuffer(ps_pb2.PullRequest(table="t", keys=b"k" * 16).SerializeToString(), np.uint8)],
)  # fmt: skip
def test_any_bytes_like_decodes_with_views_of_it(data: Any) -> None:
    decoded = wire.decode_pull_request(data)
    assert decoded.table == "t" and bytes(decoded.keys) == b"k" * 16
    assert isinstance(decoded.keys, memoryview)
    whole = np.frombuffer(data, np.uint8)
    assert np.shares_memory(np.frombuffer(decoded.keys, np.uint8), whole)  # no copy


@pytest.mark.parametrize(("data", "message"), MALFORMED)
def test_malformed_input_is_an_invalid_argument(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError):
        ps_pb2.UpdateRequest.FromString(data)  # the oracle refuses it too
    with pytest.raises(InvalidArgument, match=message):
        wire.decode_update_request(data)


@pytest.mark.parametrize("cut", range(len(VALID)))
def test_every_truncation_is_refused_or_parses_like_protobuf(cut: int) -> None:
    data = VALID[:cut]
    try:
        expected = generated_fields(ps_pb2.UpdateRequest.FromString(data))
    except DecodeError:
        with pytest.raises(InvalidArgument):
            wire.decode_update_request(data)
    else:  # cut at a field boundary: a shorter, valid message
        assert fields_of(wire.decode_update_request(data)) == expected


# -- buffers ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 2, 3, 4096, 1 << 20])
def test_frame_holes_are_filled_in_place(size: int) -> None:
    frame, values, found = wire.pull_response_frame(size, 0, "float32", True)
    assert found is not None and values.shape == (size, 0)
    found.view(np.uint8)[:] = np.frombuffer(bytes(range(256)) * (size // 256 + 1), np.uint8)[:size]
    sent = wire.finish(frame)
    assert type(sent) is bytes
    assert ps_pb2.PullResponse.FromString(sent).found == (
        bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    )


@pytest.mark.parametrize(("nbytes", "ok"), [(0, True), (8, True), (7, False), (81, False)])
def test_keys_view_needs_whole_int64s(nbytes: int, ok: bool) -> None:
    if ok:
        assert wire.keys_view(bytes(nbytes)).shape == (nbytes // 8,)
    else:
        with pytest.raises(InvalidArgument, match="whole number"):
            wire.keys_view(bytes(nbytes))


@pytest.mark.parametrize("offset", range(9))
def test_views_are_aligned_and_zero_copy_when_the_payload_is(offset: int) -> None:
    keys = np.arange(10, dtype="<i8")
    data = memoryview(bytes(offset) + keys.tobytes())[offset:]
    view = wire.keys_view(data)
    np.testing.assert_array_equal(view, keys)
    assert view.ctypes.data % 8 == 0  # misaligned payloads are copied, aligned ones are not
    whole = np.frombuffer(memoryview(data.obj), np.uint8)
    assert np.shares_memory(view, whole) == (offset % 8 == 0)
    rows = wire.rows_view(data, 5, 4, "float32")
    assert rows.shape == (5, 4) and rows.ctypes.data % 4 == 0


@pytest.mark.parametrize(
    ("nbytes", "dtype", "error"),
    [(24, "float32", "need 20"), (40, "float64", "unknown dtype"), (20, "bfloat16", "need 10")],
)
def test_rows_view_checks_length_and_dtype(nbytes: int, dtype: str, error: str) -> None:
    with pytest.raises(InvalidArgument, match=error):
        wire.rows_view(bytes(nbytes), 5, 1, dtype)


@pytest.mark.parametrize(
    ("dtype", "name"), [("<f4", "float32"), ("<f2", "float16"), ("<u2", "bfloat16")]
)
def test_dtype_names(dtype: str, name: str) -> None:
    assert wire.dtype_name(np.zeros(1, dtype)) == name


def test_unknown_array_dtype_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="float32, float16"):
        wire.dtype_name(np.zeros(1, np.float64))


# -- multi-table messages (MultiPull / MultiUpdate) ----------------------------------
def _multi_items(sizes: list[int]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(table, keys, rows) per item; names of varying length shift every later offset."""
    rng = np.random.default_rng(len(sizes))
    return [
        (f"t{'x' * i}", rng.integers(-(2**40), 2**40, n).astype("<i8"),
         rng.standard_normal((n, 3)).astype("<f4"))
        for i, n in enumerate(sizes)
    ]  # fmt: skip


MULTI_SIZES = [[], [0], [1], [3, 0, 7], [1000, 1, 2, 40000], [5] * 9]


@pytest.mark.parametrize("sizes", MULTI_SIZES)
@pytest.mark.parametrize("epoch", [0, 1, 2**40])
def test_multi_requests_parse_with_generated_classes_and_align_every_payload(
    sizes: list[int], epoch: int
) -> None:
    items = _multi_items(sizes)
    pull = wire.encode_multi_pull_request(
        wire.PullRequest(name, epoch, keys, read_only=bool(i % 2))
        for i, (name, keys, _) in enumerate(items)
    )
    update = wire.encode_multi_update_request(
        wire.UpdateRequest(name, epoch, keys, rows, "float32", 0.25 if i % 2 else None, 3)
        for i, (name, keys, rows) in enumerate(items)
    )
    assert ps_pb2.MultiPullRequest.FromString(pull) == ps_pb2.MultiPullRequest(
        items=[
            ps_pb2.PullRequest(table=name, epoch=epoch, keys=keys.tobytes(), read_only=bool(i % 2))
            for i, (name, keys, _) in enumerate(items)
        ]
    )
    expected_updates = []
    for i, (name, keys, rows) in enumerate(items):
        item = ps_pb2.UpdateRequest(
            table=name, epoch=epoch, keys=keys.tobytes(), grads=rows.tobytes(),
            grad_dtype="float32", dim=3,
        )  # fmt: skip
        if i % 2:
            item.lr = 0.25
        expected_updates.append(item)
    assert ps_pb2.MultiUpdateRequest.FromString(update) == ps_pb2.MultiUpdateRequest(
        items=expected_updates
    )
    base = address(memoryview(update))
    decoded = wire.decode_multi_update_request(update)
    assert [d.table for d in decoded] == [name for name, _, _ in items]
    for got, (_, keys, rows) in zip(decoded, items, strict=True):
        assert bytes(got.keys) == keys.tobytes() and bytes(got.grads) == rows.tobytes()
        for view in (got.keys, got.grads):
            assert isinstance(view, memoryview)
            # (keys follow the epoch's pad varint, which can widen only below 2**21)
            if len(view) and (view is got.grads or epoch < 2**21):
                assert (address(view) - base) % wire.ALIGN == 0  # 8-aligned, no copy needed
    pulls = wire.decode_multi_pull_request(pull)
    assert [bytes(p.keys) for p in pulls] == [keys.tobytes() for _, keys, _ in items]
    assert [p.read_only for p in pulls] == [bool(i % 2) for i in range(len(items))]


def test_generated_multi_messages_decode_here() -> None:
    items = _multi_items([4, 0, 2])
    message = ps_pb2.MultiUpdateRequest(
        items=[
            ps_pb2.UpdateRequest(table=n, epoch=9, keys=k.tobytes(), grads=r.tobytes(), dim=3)
            for n, k, r in items
        ]
    ).SerializeToString()
    decoded = wire.decode_multi_update_request(message)
    assert [fields_of(d) for d in decoded] == [
        {"table": n, "epoch": 9, "keys": k.tobytes(), "grads": r.tobytes(), "grad_dtype": "",
         "lr": None, "dim": 3}
        for n, k, r in items
    ]  # fmt: skip
    replies = ps_pb2.MultiUpdateResponse(
        items=[ps_pb2.UpdateResponse(rows=n) for n in (4, 0, 2**33)]
    ).SerializeToString()
    assert wire.decode_multi_rows_response(replies) == [4, 0, 2**33]
    assert wire.decode_multi_pull_request(b"") == []


@pytest.mark.parametrize("rows", [[], [0], [3, 0, 2**33]])
def test_multi_rows_response_parses_with_generated_classes(rows: list[int]) -> None:
    encoded = wire.encode_multi_rows_response(rows)
    parsed = ps_pb2.MultiUpdateResponse.FromString(encoded)
    assert [item.rows for item in parsed.items] == rows
    assert wire.decode_multi_rows_response(encoded) == rows


SHAPES = [
    [],
    [(0, 8, "float32", False)],
    [(3, 4, "float32", False), (2, 2, "float16", True), (5, 3, "bfloat16", False)],
    [(2000, 16, "float32", False)] * 8,
]


@pytest.mark.parametrize("shapes", SHAPES)
def test_multi_pull_response_frame_writes_each_item_once(shapes: list[Any]) -> None:
    rng = np.random.default_rng(len(shapes))
    message, holes = wire.multi_pull_response_frame(shapes)
    expected = []
    for (rows, dim, dtype, read_only), (values, found) in zip(shapes, holes, strict=True):
        rows_in = rng.integers(0, 2**15, (rows, dim)).astype(wire.WIRE_DTYPES[dtype])
        values[:] = rows_in
        found_in = rng.integers(0, 2, rows).astype(bool)
        assert (found is not None) == read_only
        if found is not None:
            found[:] = found_in
        expected.append((rows_in, found_in if read_only else None))
    sent = wire.finish(message)
    parsed = ps_pb2.MultiPullResponse.FromString(sent)
    decoded = wire.decode_multi_pull_response(sent)
    assert len(parsed.items) == len(decoded) == len(shapes)
    for (rows, dim, dtype, _), item, mine, (rows_in, found_in) in zip(
        shapes, parsed.items, decoded, expected, strict=True
    ):
        assert (item.dim, item.dtype, item.values) == (dim, dtype, rows_in.tobytes())
        assert item.found == (b"" if found_in is None else found_in.tobytes())
        view = wire.rows_view(mine.values, rows, dim, dtype)
        np.testing.assert_array_equal(view, rows_in)
        assert rows == 0 or np.shares_memory(view, np.frombuffer(sent, np.uint8))


def test_multi_pull_response_frame_refuses_an_unknown_dtype() -> None:
    with pytest.raises(InvalidArgument, match="unknown dtype"):
        wire.multi_pull_response_frame([(1, 1, "float32", False), (1, 1, "int8", False)])


MULTI_VALID = wire.encode_multi_update_request(
    wire.UpdateRequest(n, 1, k, r, "float32", None, 3) for n, k, r in _multi_items([2, 1])
)


@pytest.mark.parametrize("cut", range(1, len(MULTI_VALID)))
def test_every_truncated_multi_request_is_refused_like_protobuf(cut: int) -> None:
    data = MULTI_VALID[:cut]
    try:
        ps_pb2.MultiUpdateRequest.FromString(data)
        generated_ok = True
    except DecodeError:
        generated_ok = False
    if generated_ok:
        wire.decode_multi_update_request(data)  # must parse too
    else:
        with pytest.raises(InvalidArgument):
            wire.decode_multi_update_request(data)


def test_a_malformed_item_is_refused_and_unknown_outer_fields_skipped() -> None:
    item = wire.encode_update_request("t", np.arange(2, dtype="<i8"), np.zeros((2, 1), "<f4"))
    unknown = tag(7, wire.VARINT) + b"\x05" + tag(8, wire.LEN) + b"\x02ab"
    data = unknown + tag(1, wire.LEN) + wire.encode_varint(len(item)) + item + unknown
    (decoded,) = wire.decode_multi_update_request(data)
    assert decoded.table == "t" and len(decoded.keys) == 16
    broken = tag(1, wire.LEN) + b"\x02\x0f\x00"  # an item holding an invalid wire type
    with pytest.raises(InvalidArgument):
        wire.decode_multi_update_request(broken)
    with pytest.raises(InvalidArgument, match="end-group"):
        wire.decode_multi_pull_request(tag(3, wire.EGROUP))


@pytest.mark.parametrize("sizes", MULTI_SIZES)
def test_a_multi_pull_carrying_updates_round_trips_and_parses_with_generated_classes(
    sizes: list[int],
) -> None:
    items = _multi_items(sizes)
    pulls = [wire.PullRequest(name, 3, keys) for name, keys, _ in items]
    updates = [
        wire.UpdateRequest(name, 3, keys, rows, "float32", 0.5 if i % 2 else None, 3)
        for i, (name, keys, rows) in enumerate(items)
    ]
    request = wire.encode_multi_pull_request(pulls, updates)
    parsed = ps_pb2.MultiPullRequest.FromString(request)
    assert (
        [p.table for p in parsed.items]
        == [u.table for u in parsed.updates]
        == [name for name, _, _ in items]
    )
    assert [u.grads for u in parsed.updates] == [rows.tobytes() for _, _, rows in items]
    assert [u.HasField("lr") for u in parsed.updates] == [bool(i % 2) for i in range(len(items))]
    got_pulls, got_updates = wire.decode_multi_pull_carrying(request)
    assert [bytes(p.keys) for p in got_pulls] == [keys.tobytes() for _, keys, _ in items]
    assert [(u.table, bytes(u.grads), u.lr, u.dim) for u in got_updates] == [
        (u.table, bytes(u.grads), u.lr, u.dim) for u in updates
    ]
    assert wire.decode_multi_pull_request(request) == got_pulls  # old readers skip updates


def test_a_multi_pull_reply_says_what_each_carried_update_applied() -> None:
    message, holes = wire.multi_pull_response_frame(
        [(2, 3, "float32", False)], carried_rows=[4, 0, 7]
    )
    holes[0][0][:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    sent = wire.finish(message)
    parsed = ps_pb2.MultiPullResponse.FromString(sent)
    assert [u.rows for u in parsed.updates] == [4, 0, 7]
    replies, applied = wire.decode_multi_pull_reply(sent)
    assert applied == [4, 0, 7]
    np.testing.assert_array_equal(
        wire.rows_view(replies[0].values, 2, 3, "float32"), np.arange(6).reshape(2, 3)
    )
    assert wire.decode_multi_pull_reply(wire.finish(wire.multi_pull_response_frame([])[0])) == (
        [],
        [],
    )
