"""The three native readers of data-path messages agree with the generated classes.

``recstore.core.wire``'s decoders, the node's multi-table validator (through
``native_path.serve``) and the SDK's reply scatter all read their messages
with one decoder (csrc/ps_decode.h); each edge case below is read by the
three as ``ps_pb2`` reads it: unknown fields skipped, a known number with
another wire type skipped, the last of a repeated field kept, a string that
is not UTF-8 refused (even when a valid one follows).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from recstore.core import InvalidArgument, wire
from recstore.ps import native_path
from recstore.ps.node import Node
from recstore.v1 import ps_pb2

from .conftest import spec

_native: Any = importlib.import_module("recstore._native")

KEYS = np.arange(4, dtype="<i8")
ROWS = np.arange(32, dtype="<f4").reshape(4, 8)


def tag(number: int, wire_type: int) -> bytes:
    return wire.encode_varint((number << 3) | wire_type)


def length(payload: bytes) -> bytes:
    return wire.encode_varint(len(payload)) + payload


PULL = ps_pb2.PullRequest(table="a", keys=KEYS.tobytes()).SerializeToString()
REPLY = ps_pb2.PullResponse(values=ROWS.tobytes(), dim=8, dtype="float32").SerializeToString()
UNKNOWN = tag(15, wire.VARINT) + b"\x05" + tag(16, wire.LEN) + length(b"ab")
BAD_UTF8 = b"\xff\xfe"

# (case, PullRequest item, PullResponse item); None: every reader refuses it.
CASES = [
    ("unknown fields", UNKNOWN + PULL + UNKNOWN, UNKNOWN + REPLY + UNKNOWN),
    (
        "a known number with another wire type",
        PULL + tag(1, wire.VARINT) + b"\x07" + tag(3, wire.I32) + b"\x00" * 4,
        REPLY + tag(2, wire.LEN) + length(b"x") + tag(3, wire.VARINT) + b"\x01",
    ),
    (
        "a repeated scalar keeps its last value",
        tag(1, wire.LEN) + length(b"b") + tag(3, wire.LEN) + length(b"\x00" * 8) + PULL,
        tag(2, wire.VARINT) + b"\x63" + tag(1, wire.LEN) + length(b"\x00" * 4) + REPLY,
    ),
    (
        "an invalid UTF-8 string",
        PULL + tag(1, wire.LEN) + length(BAD_UTF8),
        REPLY + tag(3, wire.LEN) + length(BAD_UTF8),
    ),
    (
        "an invalid UTF-8 string then a valid one",
        tag(1, wire.LEN) + length(BAD_UTF8) + PULL,
        tag(3, wire.LEN) + length(BAD_UTF8) + REPLY,
    ),
]


def _item(field: int, message: bytes) -> bytes:
    return tag(field, wire.LEN) + length(message)


def _generated(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError:
        return None


@pytest.fixture
def node(tmp_path: Path) -> Node:
    node = Node(tmp_path)
    node.create_table(spec("a"), None)
    return node


@pytest.mark.parametrize(("case", "pull", "reply"), CASES, ids=[c[0] for c in CASES])
def test_the_three_readers_read_an_edge_case_as_protobuf(
    node: Node, case: str, pull: bytes, reply: bytes
) -> None:
    del case
    request = _item(1, pull)
    expected = _generated(ps_pb2.MultiPullRequest, request)
    if expected is None:
        with pytest.raises(InvalidArgument):
            wire.decode_multi_pull_request(request)
        with pytest.raises(InvalidArgument, match="UTF-8"):
            native_path.serve(node, "MultiPull", request)
    else:
        (item,) = expected.items
        (decoded,) = wire.decode_multi_pull_request(request)
        assert (decoded.table, decoded.epoch, bytes(decoded.keys), decoded.read_only) == (
            item.table, item.epoch, item.keys, item.read_only,
        )  # fmt: skip
        served = native_path.serve(node, "MultiPull", request)
        clean = native_path.serve(node, "MultiPull", expected.SerializeToString())
        assert served.pulled == clean.pulled == [(item.table, len(item.keys) // 8)]
        assert served.reply == clean.reply

    answer = _item(1, reply)
    expected_reply = _generated(ps_pb2.MultiPullResponse, answer)
    out = np.zeros((4, 8), np.float32)
    order = np.arange(4, dtype=np.int64)
    targets = [(out, "float32", 8, order, 0, 4)]
    if expected_reply is None:
        with pytest.raises(InvalidArgument):
            wire.decode_multi_pull_reply(answer)
        with pytest.raises(InvalidArgument, match="UTF-8"):
            _native.scatter_pull_reply(answer, targets, 0)
    else:
        (one,) = expected_reply.items
        (items, applied) = wire.decode_multi_pull_reply(answer)
        assert applied == []
        assert (bytes(items[0].values), items[0].dim, items[0].dtype) == (
            one.values, one.dim, one.dtype,
        )  # fmt: skip
        assert _native.scatter_pull_reply(answer, targets, 0) == ([], [one.version])
        np.testing.assert_array_equal(out, np.frombuffer(one.values, np.float32).reshape(4, 8))
