"""The engine reads request ids and digests update content exactly as the Python definition.

``oracle_read`` is the reader ``recstore.core.request_id.read`` was in Python
(before the node read ids natively, csrc/request_id.h): the same id, digest and
rest spans, or the same InvalidArgument, for well-formed requests of every
method, requests cut at every byte and ids that are not valid. Digests are
stored in the write-ahead log, so they may never change for a given request.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import pytest

from recstore.core import InvalidArgument, ps_fields, wire
from recstore.core.request_id import RequestId, read, with_request_id
from recstore.core.wire import decode_varint
from recstore.v1 import ps_pb2

ID_FIELD = {"Update": 8, "MultiUpdate": 2, "MultiPull": 3}
CARRIED = ps_fields.MultiPullRequest.updates
GRADS = ps_fields.UpdateRequest.grads
SAMPLED_WORDS = 512
LEN = 2


def _spans(view: memoryview) -> list[tuple[int, int, int, int, int]]:
    spans = []
    pos, size = 0, len(view)
    while pos < size:
        field_start = pos
        tag, pos = decode_varint(view, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, end = decode_varint(view, pos)
            start = pos
        elif wire_type == 1:
            start, end = pos, pos + 8
        elif wire_type == LEN:
            length, start = decode_varint(view, pos)
            end = start + length
        elif wire_type == 5:
            start, end = pos, pos + 4
        else:
            raise InvalidArgument(f"malformed request: wire type {wire_type} at byte {field_start}")
        if end > size or number == 0:
            raise InvalidArgument(f"malformed request: field at byte {field_start} is truncated")
        spans.append((number, wire_type, start, end, field_start))
        pos = end
    return spans


def _digest_field(view: memoryview, number: int, wire_type: int, start: int, end: int,
                  field_start: int, crc: int) -> int:  # fmt: skip
    if number != GRADS or wire_type != LEN:
        return zlib.crc32(view[field_start:end], crc)
    crc = zlib.crc32(view[field_start:start], crc)
    payload = view[start:end]
    words = len(payload) // 8
    if words <= SAMPLED_WORDS:
        return zlib.crc32(payload, crc)
    sample = np.frombuffer(payload, np.uint64, words)[:: words // SAMPLED_WORDS]
    return zlib.crc32(payload[words * 8 :], zlib.crc32(sample.tobytes(), crc))


def _decode_id(view: memoryview) -> RequestId:
    client, seq = "", 0
    for number, wire_type, start, end, _ in _spans(view):
        if number == 1 and wire_type == LEN:
            try:
                client = bytes(view[start:end]).decode()
            except UnicodeDecodeError:
                raise InvalidArgument("a request id's client is not UTF-8") from None
        elif number == 2 and wire_type == 0:
            seq, _ = decode_varint(view, start)
    return RequestId(client, seq)


def oracle_read(method: str, body: bytes) -> tuple[Any, ...] | None:
    view = memoryview(body)
    id_field = ID_FIELD[method]
    spans = _spans(view)
    found = [(s, e) for n, t, s, e, _ in spans if n == id_field and t == LEN]
    if not found:
        return None
    request_id = _decode_id(view[found[-1][0] : found[-1][1]])
    crc = fields = size = 0
    rest: list[tuple[int, int]] = []
    for number, wire_type, start, end, field_start in spans:
        if number == id_field and wire_type == LEN:
            continue
        if method != "MultiPull" or number != CARRIED:
            rest.append((field_start, end))
            if method == "MultiPull":
                continue
        fields, size = fields + 1, size + end - field_start
        if method == "Update":
            crc = _digest_field(view, number, wire_type, start, end, field_start, crc)
        elif wire_type != LEN:
            crc = zlib.crc32(view[field_start:end], crc)
        else:
            crc = zlib.crc32(view[field_start:start], crc)
            for field in _spans(view[start:end]):
                crc = _digest_field(view[start:end], *field, crc)
    return request_id, struct.pack("<IIQ", crc, fields, size), tuple(rest)


def outcome(reader: Any, method: str, body: bytes) -> Any:
    try:
        got = reader(method, body)
    except InvalidArgument as error:
        return ("refused", str(error))
    if got is None or isinstance(got, tuple):
        return got
    return got.request_id, got.digest, got.rest_spans


def _update(rows: int, width: int, dtype: str = "<f4", **fields: Any) -> ps_pb2.UpdateRequest:
    rng = np.random.default_rng(rows * 31 + width)
    keys = rng.integers(-(2**62), 2**62, rows).astype("<i8")
    grads = rng.standard_normal((rows, width)).astype(dtype)
    return ps_pb2.UpdateRequest(table="emb", keys=keys.tobytes(), grads=grads.tobytes(), **fields)


# rows x dim float32: 512 words exactly, one more, many (sampled), a 2-byte tail (float16)
UPDATES = [
    _update(0, 4),
    _update(3, 2, lr=0.5, dim=2, epoch=4),
    _update(256, 4),
    _update(257, 4),
    _update(4096, 16, grad_dtype="float32"),
    _update(3, 3, "<f2", grad_dtype="float16"),
    _update(1001, 7),
]
RID = RequestId("trainer-7", 2**63 + 5)


def bodies() -> list[tuple[str, bytes]]:
    out = []
    for update in UPDATES:
        out.append(("Update", update.SerializeToString()))
    out.append(("MultiUpdate", ps_pb2.MultiUpdateRequest(items=UPDATES[1:4]).SerializeToString()))
    out.append(("MultiUpdate", ps_pb2.MultiUpdateRequest(items=UPDATES[:1]).SerializeToString()))
    pulls = [ps_pb2.PullRequest(table="emb", keys=bytes(16)), ps_pb2.PullRequest(table="x")]
    carrying = ps_pb2.MultiPullRequest(items=pulls, updates=UPDATES[2:5])
    out.append(("MultiPull", carrying.SerializeToString()))
    out.append(("MultiPull", ps_pb2.MultiPullRequest(items=pulls).SerializeToString()))
    keys, grads = np.arange(5, dtype="<i8"), np.ones((5, 3), "<f4")
    out.append(("Update", wire.encode_update_request("emb", keys, grads, dim=3)))
    item = wire.UpdateRequest("emb", 0, keys, grads, "float32", 0.25, 3)
    out.append(("MultiUpdate", wire.encode_multi_update_request([item, item])))
    pull = wire.PullRequest("emb", 0, keys)
    out.append(("MultiPull", wire.encode_multi_pull_request([pull], [item])))
    return out


@pytest.mark.parametrize(("method", "body"), bodies())
def test_ids_digests_and_rest_match_the_python_definition(method: str, body: bytes) -> None:
    assert read(method, body) is None and oracle_read(method, body) is None
    named = with_request_id(method, body, RID)
    got = outcome(read, method, named)
    assert got == outcome(oracle_read, method, named)
    assert got[0] == RID
    unknown = b"\x78\x05" + b"\x82\x01\x03abc"  # fields 15 (varint) and 16 (bytes) lead
    assert outcome(read, method, unknown + named) == outcome(oracle_read, method, unknown + named)


@pytest.mark.parametrize(("method", "body"), bodies()[-3:])
def test_every_truncation_reads_or_is_refused_as_the_python_definition(
    method: str, body: bytes
) -> None:
    named = with_request_id(method, body, RID)
    for cut in range(len(named)):
        cut_body = named[:cut]
        assert outcome(read, method, cut_body) == outcome(oracle_read, method, cut_body), cut


def _id_field(method: str, payload: bytes) -> bytes:
    tag = wire.encode_varint(ID_FIELD[method] << 3 | LEN)
    return tag + wire.encode_varint(len(payload)) + payload


BAD = {
    "client not UTF-8": b"\x0a\x02\xff\xfe\x10\x01",
    "a bad client then a good one": b"\x0a\x01\xff\x0a\x01a\x10\x01",
    "no client": b"\x10\x01",
    "seq 0": b"\x0a\x01a\x10\x00",
    "seq past 64 bits wraps": b"\x0a\x01a\x10" + b"\xff" * 9 + b"\x01",
    "two seqs, the last wins": b"\x0a\x01a\x10\x05\x10\x07\x18\x02",
    "a group in the id": b"\x0a\x01a\x10\x01\x1b",
    "truncated id field": b"\x0a\x09a",
}


@pytest.mark.parametrize("payload", BAD.values(), ids=BAD.keys())
@pytest.mark.parametrize("method", ["Update", "MultiUpdate", "MultiPull"])
def test_odd_ids_are_read_or_refused_as_the_python_definition(method: str, payload: bytes) -> None:
    body = dict(bodies())[method] + _id_field(method, payload)
    assert outcome(read, method, body) == outcome(oracle_read, method, body)


def test_a_bad_client_is_refused_before_a_malformed_item() -> None:
    item = b"\x0a\x03" + b"\x0a\x09e"  # an item whose table field runs past its end
    body = item + _id_field("MultiUpdate", BAD["client not UTF-8"])
    assert outcome(read, "MultiUpdate", body) == ("refused", "a request id's client is not UTF-8")
    body = item + _id_field("MultiUpdate", b"\x0a\x01a\x10\x01")
    got = outcome(read, "MultiUpdate", body)
    assert got == outcome(oracle_read, "MultiUpdate", body) and got[0] == "refused"
