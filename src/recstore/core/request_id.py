"""Request ids of updates: what lets a node apply a resent update exactly once.

Gradient updates are not idempotent, so a client that lost the reply of an
update (a deadline, a dropped connection) cannot tell whether it was applied.
The SDK names every update request it sends with a ``RequestId`` (a client id
unique per client instance and a sequence number that only grows) and resends
such a request byte for byte, id included; the node's de-dup window
(``recstore.ps.dedup``) answers a resend of an applied id with the recorded
reply instead of applying it again.

The id is the ``request_id`` field of UpdateRequest, MultiUpdateRequest and
MultiPullRequest (an ``UpdateRequestId`` message). It is appended to a body the
encoders already built (protobuf fields may come in any order), so the native
encoders and decoders need not know it; ``read`` finds it again on the node and
digests the update content it names, so a client that reused an id for other
content is refused rather than answered as if it resent. The digest is a CRC-32
of every field, the gradients sampled at ``SAMPLED_WORDS`` evenly spread words,
with the sizes: cheap next to the engine's work, certain to see other keys,
tables, learning rates or shapes and gradients of another step; it is no
defence against a forged id.
"""

from __future__ import annotations

import itertools
import struct
import threading
import uuid
import zlib
from dataclasses import dataclass

import numpy as np

from recstore.core import ps_fields
from recstore.core.errors import InvalidArgument
from recstore.core.wire import Buffer, decode_varint, encode_varint

#: the field that carries the id, per data-path method
ID_FIELD = {
    "Update": ps_fields.UpdateRequest.request_id,
    "MultiUpdate": ps_fields.MultiUpdateRequest.request_id,
    "MultiPull": ps_fields.MultiPullRequest.request_id,
}
#: a MultiPull's update content is its carried updates only (the pulls are read again)
CARRIED_FIELD = ps_fields.MultiPullRequest.updates
MAX_CLIENT_BYTES = 128
DIGEST_BYTES = 16
_DIGEST = struct.Struct("<IIQ")  # crc32, fields, bytes of the request without its id
_GRADS = ps_fields.UpdateRequest.grads
#: gradient words (8 bytes) digested at most: evenly spread, so a reuse for another
#: step (other gradients everywhere) is seen without reading every byte
SAMPLED_WORDS = 512
_LENGTH_DELIMITED = 2


@dataclass(frozen=True, order=True)
class RequestId:
    """One write of one client instance."""

    client: str
    seq: int

    def __post_init__(self) -> None:
        raw = self.client.encode()
        if not raw or len(raw) > MAX_CLIENT_BYTES:
            raise InvalidArgument(
                f"a request id's client must be 1..{MAX_CLIENT_BYTES} bytes, got {len(raw)}"
            )
        if not 0 < self.seq < 2**64:
            raise InvalidArgument(f"a request id's seq must be in 1..2**64-1, got {self.seq}")

    def encode(self) -> bytes:
        """The ``UpdateRequestId`` message."""
        client = self.client.encode()
        fields = ps_fields.UpdateRequestId
        return b"".join((
            _tag(fields.client, _LENGTH_DELIMITED), encode_varint(len(client)), client,
            _tag(fields.seq, 0), encode_varint(self.seq),
        ))  # fmt: skip

    @classmethod
    def decode(cls, data: Buffer) -> RequestId:
        fields = ps_fields.UpdateRequestId
        client, seq, view = "", 0, memoryview(data)
        for number, wire_type, start, end in _fields(view):
            if number == fields.client and wire_type == _LENGTH_DELIMITED:
                try:
                    client = bytes(view[start:end]).decode()
                except UnicodeDecodeError:
                    raise InvalidArgument("a request id's client is not UTF-8") from None
            elif number == fields.seq and wire_type == 0:
                seq, _ = decode_varint(view, start)
        return cls(client, seq)


class RequestIds:
    """The ids of one client instance: its own random client id, then seq 1, 2, ..."""

    def __init__(self, client: str | None = None) -> None:
        self.client = client or uuid.uuid4().hex
        self._seqs = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> RequestId:
        with self._lock:
            return RequestId(self.client, next(self._seqs))


def with_request_id(method: str, body: bytes, request_id: RequestId) -> bytes:
    """``body`` (an encoded ``method`` request without an id) naming ``request_id``."""
    encoded = request_id.encode()
    field = _tag(ID_FIELD[method], _LENGTH_DELIMITED)
    return b"".join((body, field, encode_varint(len(encoded)), encoded))


@dataclass(frozen=True)
class Named:
    """What ``read`` found: the id and the digest of the update content it names."""

    request_id: RequestId
    digest: bytes
    body: Buffer
    rest_spans: tuple[tuple[int, int], ...]

    @property
    def rest(self) -> bytes:
        """The request without its id and, for a MultiPull, without its carried
        updates: what is served again when those were applied already."""
        view = memoryview(self.body)
        return b"".join(view[start:end] for start, end in self.rest_spans)


def read(method: str, body: Buffer) -> Named | None:
    """The request id of an encoded ``method`` request, None when it carries none."""
    view = memoryview(body)
    id_field = ID_FIELD[method]
    spans = _spans(view)
    found = [(s, e) for n, t, s, e, _ in spans if n == id_field and t == _LENGTH_DELIMITED]
    if not found:
        return None
    request_id = RequestId.decode(view[found[-1][0] : found[-1][1]])
    crc = fields = size = 0
    rest: list[tuple[int, int]] = []
    for number, wire_type, start, end, field_start in spans:
        if number == id_field and wire_type == _LENGTH_DELIMITED:
            continue
        if method != "MultiPull" or number != CARRIED_FIELD:
            rest.append((field_start, end))
            if method == "MultiPull":
                continue  # a pull: read again, not part of the update content
        fields, size = fields + 1, size + end - field_start
        if method == "Update":
            crc = _digest_field(view, number, wire_type, start, end, field_start, crc)
        elif wire_type != _LENGTH_DELIMITED:  # not an item: digested whole
            crc = zlib.crc32(view[field_start:end], crc)
        else:  # an UpdateRequest item
            crc = zlib.crc32(view[field_start:start], crc)
            for field in _spans(view[start:end]):
                crc = _digest_field(view[start:end], *field, crc)
    return Named(request_id, _DIGEST.pack(crc, fields, size), body, tuple(rest))


def _digest_field(
    view: memoryview, number: int, wire_type: int, start: int, end: int, field_start: int,
    crc: int,
) -> int:  # fmt: skip
    """One field of an UpdateRequest into the digest; of the gradients, a fixed sample."""
    if number != _GRADS or wire_type != _LENGTH_DELIMITED:
        return zlib.crc32(view[field_start:end], crc)
    crc = zlib.crc32(view[field_start:start], crc)
    payload = view[start:end]
    words = len(payload) // 8
    if words <= SAMPLED_WORDS:
        return zlib.crc32(payload, crc)
    sample = np.frombuffer(payload, np.uint64, words)[:: words // SAMPLED_WORDS]
    return zlib.crc32(payload[words * 8 :], zlib.crc32(sample.tobytes(), crc))


def _tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)


def _fields(view: memoryview) -> list[tuple[int, int, int, int]]:
    return [(n, t, s, e) for n, t, s, e, _ in _spans(view)]


def _spans(view: memoryview) -> list[tuple[int, int, int, int, int]]:
    """Top-level fields: (number, wire type, value start, value end, field start)."""
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
        elif wire_type == _LENGTH_DELIMITED:
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
