"""Protobuf wire format of the PS data path (Pull, Push, Update), zero-copy.

``proto/recstore/v1/ps.proto`` stays the contract (field numbers come from it,
generated into ``csrc/ps_fields.h``): every message written here parses with
the generated classes and every message they write parses here. The codec is
native (``recstore._native``: the one codec the SDK, the node and the native
node path share, one field walker for all its readers); what it avoids is
protobuf's copies of the big ``bytes`` fields. A decoded request hands out
``memoryview`` slices of the received buffer, and the encoders write each
message straight into the bytes object that is sent, copying each payload
once. Requests are laid out so each payload starts 8-byte aligned (a padded
varint field goes just before it; fields may appear in any order and varints
may carry redundant continuation bytes), so ``np.frombuffer`` views of them
are aligned on the receiving side. Malformed input raises ``InvalidArgument``.
What stays here: the dtype tables, the method names, the message dataclasses
and thin wrappers that build them. No protobuf, gRPC or torch import: the PS
node and the SDK both build on it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from recstore.core.errors import InvalidArgument

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_VARINT_BYTES = 10
ALIGN = 8
U64 = (1 << 64) - 1
Buffer = bytes | bytearray | memoryview
SERVICE = "/recstore.v1.ParameterServer/"
PULL, PUSH, UPDATE = SERVICE + "Pull", SERVICE + "Push", SERVICE + "Update"
MULTI_PULL, MULTI_UPDATE = SERVICE + "MultiPull", SERVICE + "MultiUpdate"

#: numpy layout of each table dtype on the wire (bfloat16 as raw uint16 bits).
WIRE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
}
#: the native codec (csrc/wire_bindings.h, csrc/wire_decode.h); by name, as import-linter
#: cannot see a compiled module and would count ``from recstore import _native`` as the package
_native: Any = importlib.import_module("recstore._native")


# -- primitives -------------------------------------------------------------------
def varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def encode_varint(value: int, width: int = 0) -> bytes:
    """``value`` as a varint, padded with continuation bytes to ``width`` bytes if given."""
    if width <= 1 and 0 <= value < 0x80:  # the common case (tags, small fields), precomputed
        return _ONE_BYTE[value]
    if not 0 <= value <= U64:
        raise ValueError(f"varint out of range: {value}")
    width = max(width, varint_size(value))
    if width > MAX_VARINT_BYTES:
        raise ValueError(f"a varint has at most {MAX_VARINT_BYTES} bytes, asked for {width}")
    out = bytearray(width)
    for i in range(width - 1):
        out[i] = (value & 0x7F) | 0x80
        value >>= 7
    out[-1] = value
    return bytes(out)


_ONE_BYTE = [bytes((value,)) for value in range(0x80)]


def decode_varint(data: Buffer, pos: int) -> tuple[int, int]:
    """(value, position after it); values wider than 64 bits wrap as protobuf does."""
    decoded: tuple[int, int] = _native.decode_varint(data, pos)
    return decoded


# -- messages (decoded natively: recstore._native, csrc/ps_decode.h) -----------------
# Each decoder reads its message in place from any contiguous bytes-like object,
# fields as protobuf reads them (unknown ones skipped, a known number with another
# wire type counted as unknown, a repeated scalar keeping its last value, strings
# checked as UTF-8), and gives a tuple in the order of the dataclass's fields;
# bytes fields are memoryview slices of the caller's buffer. Malformed input raises
# InvalidArgument.
@dataclass
class PullRequest:
    table: str = ""
    epoch: int = 0
    keys: Buffer = b""
    read_only: bool = False
    value_dtype: str = ""  # the dtype the rows travel as; empty: the table dtype


@dataclass
class PushRequest:
    table: str = ""
    epoch: int = 0
    keys: Buffer = b""
    values: Buffer = b""
    dtype: str = ""
    dim: int = 0


@dataclass
class UpdateRequest:
    table: str = ""
    epoch: int = 0
    keys: Buffer = b""
    grads: Buffer = b""
    grad_dtype: str = ""
    lr: float | None = None  # proto3 ``optional``: None when absent
    dim: int = 0


@dataclass
class PullResponse:
    values: Buffer = b""
    dim: int = 0
    dtype: str = ""
    found: Buffer = b""
    version: int = 0  # the table's version on the node before the rows were read


@dataclass
class RowsResponse:  # PushResponse and UpdateResponse share this layout
    rows: int = 0


def decode_pull_request(data: Buffer) -> PullRequest:
    return PullRequest(*_native.decode_pull_request(data))


def decode_push_request(data: Buffer) -> PushRequest:
    return PushRequest(*_native.decode_push_request(data))


def decode_update_request(data: Buffer) -> UpdateRequest:
    return UpdateRequest(*_native.decode_update_request(data))


def decode_pull_response(data: Buffer) -> PullResponse:
    return PullResponse(*_native.decode_pull_response(data))


def decode_rows_response(data: Buffer) -> int:
    """PushResponse / UpdateResponse: the rows applied."""
    rows: int = _native.decode_rows_response(data)
    return rows


def decode_multi_pull_request(data: Buffer) -> list[PullRequest]:
    return [PullRequest(*item) for item in _native.decode_multi_pull_request(data)]


def decode_multi_pull_carrying(data: Buffer) -> tuple[list[PullRequest], list[UpdateRequest]]:
    """A MultiPullRequest whole: (pull items, the updates it carries)."""
    items, updates = _native.decode_multi_pull_carrying(data)
    return [PullRequest(*item) for item in items], [UpdateRequest(*item) for item in updates]


def decode_multi_pull_reply(data: Buffer) -> tuple[list[PullResponse], list[int]]:
    """A MultiPullResponse whole: (pull replies, rows applied per carried update)."""
    items, applied = _native.decode_multi_pull_reply(data)
    return [PullResponse(*item) for item in items], applied


def decode_multi_update_request(data: Buffer) -> list[UpdateRequest]:
    return [UpdateRequest(*item) for item in _native.decode_multi_update_request(data)]


def decode_multi_pull_response(data: Buffer) -> list[PullResponse]:
    return [PullResponse(*item) for item in _native.decode_multi_pull_response(data)]


def decode_multi_rows_response(data: Buffer) -> list[int]:
    """MultiUpdateResponse: rows applied per item."""
    rows: list[int] = _native.decode_multi_rows_response(data)
    return rows


# -- encoding (native: recstore._native, csrc/ps_messages.h) --------------------------
# Each encoder writes its message straight into a new bytes object, every payload
# copied once and laid out 8-byte aligned (a padded varint field goes before it).
def _pull_item(item: PullRequest) -> tuple[str, int, Any, bool, str]:
    return item.table, item.epoch, item.keys, item.read_only, item.value_dtype


def _update_item(item: UpdateRequest) -> tuple[str, int, Any, Any, str, float | None, int]:
    return item.table, item.epoch, item.keys, item.grads, item.grad_dtype, item.lr, item.dim


def encode_pull_request(
    table: str, keys: Any, *, epoch: int = 0, read_only: bool = False, value_dtype: str = ""
) -> bytes:
    """PullRequest; ``keys`` any contiguous int64 buffer; rows asked for as ``value_dtype``."""
    message: bytes = _native.encode_pull_request(table, keys, epoch, read_only, value_dtype)
    return message


def encode_multi_pull_request(
    items: Iterable[PullRequest], updates: Iterable[UpdateRequest] = ()
) -> bytes:
    """MultiPullRequest; each item's ``keys`` any contiguous int64 buffer, copied once.

    ``updates`` are carried: the node applies them before it pulls the items.
    """
    message: bytes = _native.encode_multi_pull_request(
        [_pull_item(item) for item in items], [_update_item(item) for item in updates]
    )
    return message


def encode_push_request(
    table: str, keys: Any, values: Any, *, epoch: int = 0, dtype: str = "", dim: int = 0
) -> bytes:
    message: bytes = _native.encode_push_request(table, keys, values, epoch, dtype, dim)
    return message


def encode_update_request(
    table: str,
    keys: Any,
    grads: Any,
    *,
    epoch: int = 0,
    grad_dtype: str = "",
    dim: int = 0,
    lr: float | None = None,
) -> bytes:
    message: bytes = _native.encode_update_request((table, epoch, keys, grads, grad_dtype, lr, dim))
    return message


def encode_multi_update_request(items: Iterable[UpdateRequest]) -> bytes:
    """MultiUpdateRequest; each item's ``keys``/``grads`` copied once, 8-byte aligned."""
    message: bytes = _native.encode_multi_update_request([_update_item(item) for item in items])
    return message


def encode_rows_response(rows: int) -> bytes:
    """PushResponse / UpdateResponse."""
    message: bytes = _native.encode_rows_response(rows)
    return message


def encode_multi_rows_response(rows: Iterable[int]) -> bytes:
    """MultiUpdateResponse: one UpdateResponse per item."""
    message: bytes = _native.encode_multi_rows_response(list(rows))
    return message


class Frame(Protocol):
    """A message framed natively with holes for its payloads (``_native.MessageFrame``)."""

    def finish(self) -> bytes: ...


def pull_response_frame(
    rows: int,
    dim: int,
    dtype: str,
    read_only: bool,
    *,
    version: int = 0,
    limit: int | None = None,
) -> tuple[Frame, np.ndarray, np.ndarray | None]:
    """A PullResponse with room for its rows: (frame, values [rows, dim], found or None).

    Fill ``values`` (and ``found``) in place, then send ``finish(frame)``.
    ``version``: the table's version, read before the rows are. ``MessageTooLarge``,
    before anything is allocated, when it would be over ``limit`` bytes.
    """
    frame, ((values, found),) = multi_pull_response_frame(
        [(rows, dim, dtype, read_only)], False, versions=[version], limit=limit
    )
    return frame, values, found


PullShape = tuple[int, int, str, bool]  # rows, dim, dtype, read_only


def multi_pull_response_frame(
    shapes: Sequence[PullShape],
    embedded: bool = True,
    carried_rows: Sequence[int] = (),
    *,
    versions: Sequence[int] = (),
    limit: int | None = None,
    trailing: int = 0,
) -> tuple[Frame, list[tuple[np.ndarray, np.ndarray | None]]]:
    """A MultiPullResponse (or, not ``embedded``, one PullResponse) with room for its rows.

    One (values [rows, dim], found or None) per shape, to fill in place before
    ``finish(frame)``: every item's rows are written once, straight into the reply.
    ``carried_rows``: the rows applied by each update the request carried.
    ``versions``: each item's table version (read before its rows are; default 0).
    ``MessageTooLarge``, before anything is allocated, when it (with ``trailing`` bytes
    appended after it) would be over ``limit`` bytes.
    """
    storages = [wire_dtype(dtype) for _, _, dtype, _ in shapes]  # refuse an unknown dtype first
    if versions and len(versions) != len(shapes):
        raise ValueError(f"{len(versions)} versions for {len(shapes)} items")
    frame, holes = _native.pull_reply_frame(
        [
            (rows, dim, dtype, storage.itemsize, read_only, version)
            for (rows, dim, dtype, read_only), storage, version in zip(
                shapes, storages, versions or [0] * len(shapes), strict=True
            )
        ],
        embedded,
        list(carried_rows),
        U64 if limit is None else limit,
        trailing,
    )
    out = [
        (values.view(storage).reshape(rows, dim), None if found is None else found.view(np.bool_))
        for (rows, dim, _, _), storage, (values, found) in zip(shapes, storages, holes, strict=True)
    ]
    return frame, out


def finish(frame: Frame) -> bytes:
    """The message of a frame, its holes filled, ready to send."""
    return frame.finish()


# -- arrays --------------------------------------------------------------------------
def wire_dtype(dtype: str) -> np.dtype:
    try:
        return WIRE_DTYPES[dtype]
    except KeyError:
        raise InvalidArgument(
            f"unknown dtype {dtype!r}; expected one of {sorted(WIRE_DTYPES)}"
        ) from None


def _aligned(array: np.ndarray) -> np.ndarray:
    # Engines may load whole words: a payload a generic encoder left unaligned is copied.
    return array if array.ctypes.data % array.dtype.itemsize == 0 else array.copy()


def keys_view(buffer: Buffer) -> np.ndarray:
    """int64 keys of a raw buffer (a read-only view when aligned)."""
    if len(buffer) % 8:
        raise InvalidArgument(
            f"keys buffer of {len(buffer)} bytes is not a whole number of int64 keys"
        )
    return _aligned(np.frombuffer(buffer, dtype="<i8"))


def rows_view(buffer: Buffer, rows: int, dim: int, dtype: str, what: str = "values") -> np.ndarray:
    """A [rows, dim] array of ``dtype`` over a buffer whose length must match exactly."""
    storage = wire_dtype(dtype)
    expected = rows * dim * storage.itemsize
    if len(buffer) != expected:
        raise InvalidArgument(
            f"{what} buffer has {len(buffer)} bytes; {rows} rows x dim {dim} of {dtype} "
            f"need {expected}"
        )
    return _aligned(np.frombuffer(buffer, dtype=storage).reshape(rows, dim))


# -- client ----------------------------------------------------------------------------
class WireClient:
    """Pull, Push and Update of one node over a ``grpc.Channel`` with this codec.

    Raw bytes go through the channel (no generated classes, no serializer copies);
    pulled rows are read-only numpy views of the received message. Calls raise
    ``grpc.RpcError`` as the generated stub's do.
    """

    def __init__(self, channel: Any, metadata: Any = (), timeout: float | None = None) -> None:
        self._pull = channel.unary_unary(PULL)
        self._push = channel.unary_unary(PUSH)
        self._update = channel.unary_unary(UPDATE)
        self._multi_pull = channel.unary_unary(MULTI_PULL)
        self._multi_update = channel.unary_unary(MULTI_UPDATE)
        self._options = {"metadata": tuple(metadata), "timeout": timeout}

    def pull(
        self,
        table: str,
        keys: Any,
        *,
        epoch: int = 0,
        read_only: bool = False,
        value_dtype: str = "",
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(values [n, dim] as they travelled, found bool[n] when ``read_only`` else None)."""
        keys = np.ascontiguousarray(keys, dtype="<i8")
        request = encode_pull_request(
            table, keys, epoch=epoch, read_only=read_only, value_dtype=value_dtype
        )
        reply = decode_pull_response(self._pull(request, **self._options))
        values = rows_view(reply.values, len(keys), reply.dim, reply.dtype)
        found = np.frombuffer(reply.found, np.bool_) if read_only else None
        return values, found

    def push(self, table: str, keys: Any, values: np.ndarray, *, epoch: int = 0) -> int:
        keys = np.ascontiguousarray(keys, dtype="<i8")
        request = encode_push_request(
            table, keys, values, epoch=epoch, dtype=dtype_name(values), dim=_dim(values)
        )
        return decode_rows_response(self._push(request, **self._options))

    def update(
        self, table: str, keys: Any, grads: np.ndarray, *, epoch: int = 0, lr: float | None = None
    ) -> int:
        """Gradients in float32 or the table dtype (bfloat16 as uint16 bits)."""
        keys = np.ascontiguousarray(keys, dtype="<i8")
        grad_dtype = dtype_name(grads)
        request = encode_update_request(
            table, keys, grads, epoch=epoch, grad_dtype=grad_dtype, dim=_dim(grads), lr=lr
        )
        return decode_rows_response(self._update(request, **self._options))

    def multi_pull(
        self,
        items: Sequence[tuple[str, Any]],
        *,
        epoch: int = 0,
        read_only: bool = False,
        value_dtype: str = "",
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """One MultiPull of ``(table, keys)`` items: (values, found or None) per item."""
        keys = [np.ascontiguousarray(k, dtype="<i8") for _, k in items]
        request = encode_multi_pull_request(
            PullRequest(table, epoch, k.data, read_only, value_dtype)
            for (table, _), k in zip(items, keys, strict=True)
        )
        replies = decode_multi_pull_response(self._multi_pull(request, **self._options))
        if len(replies) != len(items):
            raise InvalidArgument(f"{len(replies)} replies to a MultiPull of {len(items)} items")
        return [
            (
                rows_view(r.values, len(k), r.dim, r.dtype),
                np.frombuffer(r.found, np.bool_) if read_only else None,
            )
            for r, k in zip(replies, keys, strict=True)
        ]

    def multi_update(
        self,
        items: Sequence[tuple[str, Any, np.ndarray]],
        *,
        epoch: int = 0,
        lr: float | None = None,
    ) -> list[int]:
        """One MultiUpdate of ``(table, keys, grads)`` items (all or nothing): rows per item."""
        request = encode_multi_update_request(
            UpdateRequest(
                table, epoch, np.ascontiguousarray(keys, dtype="<i8").data,
                np.ascontiguousarray(grads).data,
                dtype_name(grads), lr, _dim(grads),
            )
            for table, keys, grads in items
        )  # fmt: skip
        return decode_multi_rows_response(self._multi_update(request, **self._options))


def dtype_name(rows: np.ndarray) -> str:
    """The wire dtype name of a numpy array (uint16: bfloat16 bits)."""
    for name, storage in WIRE_DTYPES.items():
        if rows.dtype == storage:
            return name
    raise TypeError(f"rows must be float32, float16 or uint16 (bfloat16 bits), got {rows.dtype}")


def as_wire_dtype(rows: np.ndarray, dtype: str) -> np.ndarray:
    """``rows`` as ``dtype`` on the wire: themselves, or converted (native, nearest even)."""
    if dtype_name(rows) == dtype:
        return rows
    out = np.empty(rows.shape, wire_dtype(dtype))
    _native.convert_rows(np.ascontiguousarray(rows), dtype_name(rows), out, dtype)
    return out


def reply_rows(
    reply: PullResponse, rows: int, dim: int, transport: str, out_dtype: np.dtype, what: str = ""
) -> np.ndarray:
    """A PullResponse's rows as ``out_dtype``, checked: sent as ``transport`` ("": as is)."""
    out_name = dtype_name(np.empty(0, out_dtype))
    expected = transport or out_name
    got = reply.dtype or "float32"
    if rows and (reply.dim != dim or got != expected):
        raise InvalidArgument(
            f"{what}rows of dim {reply.dim} {reply.dtype!r}, expected dim {dim} {expected!r}"
        )
    values = rows_view(reply.values, rows, dim, got)
    return values if got == out_name else as_wire_dtype(values, out_name)


def _dim(rows: np.ndarray) -> int:
    return int(rows.shape[1]) if rows.ndim == 2 else 0
