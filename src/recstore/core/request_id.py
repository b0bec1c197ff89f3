"""Request ids of updates: what lets a node apply a resent update exactly once.

Gradient updates are not idempotent, so a client that lost the reply of an
update (a deadline, a dropped connection) cannot tell whether it was applied.
The SDK names every update request it sends with a ``RequestId`` (a client id
unique per client instance and a sequence number that only grows) and resends
such a request byte for byte, id included; the node's de-dup window
(``recstore.ps.wal.dedup``) answers a resend of an applied id with the recorded
reply instead of applying it again.

The id is the ``request_id`` field of UpdateRequest, MultiUpdateRequest and
MultiPullRequest (an ``UpdateRequestId`` message). It is appended to a body the
encoders already built (protobuf fields may come in any order), so the native
encoders and decoders need not know it; ``read`` finds it again on the node and
digests the update content it names, so a client that reused an id for other
content is refused rather than answered as if it resent. The digest is a CRC-32
of every field but the id (of a MultiUpdate or a MultiPull item, of each of
its fields), the gradients sampled at 512 evenly spread 8-byte words, packed
with the count and the bytes of those fields: cheap next to the engine's work,
certain to see other keys, tables, learning rates or shapes and gradients of
another step; it is no defence against a forged id. Fields are walked with any
number and wire types 0, 1, 2 and 5. The engine reads ids on the node
(``csrc/request_id.h``); digests are kept in the write-ahead log, so the
definition never changes (tests/core/test_request_id.py holds it in Python).
"""

from __future__ import annotations

import importlib
import itertools
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from recstore.core import ps_fields
from recstore.core.errors import InvalidArgument, MalformedMessage
from recstore.core.wire import Buffer, encode_varint

#: the engine (by name: import-linter cannot see a compiled module)
_native: Any = importlib.import_module("recstore._native")

#: the field that carries the id, per data-path method
ID_FIELD = {
    "Update": ps_fields.UpdateRequest.request_id,
    "MultiUpdate": ps_fields.MultiUpdateRequest.request_id,
    "MultiPull": ps_fields.MultiPullRequest.request_id,
}
MAX_CLIENT_BYTES = 128
DIGEST_BYTES = 16  # crc32 (u32), fields (u32), bytes of the request without its id (u64)
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


class RequestIds:
    """The ids of one client instance: its own random client id, then seq 1, 2, ..."""

    def __init__(self, client: str | None = None) -> None:
        self.client = client or uuid.uuid4().hex
        self._seqs = itertools.count(1)
        self._lock = threading.Lock()

    def next(self) -> RequestId:
        with self._lock:
            return RequestId(self.client, next(self._seqs))


def id_field(method: str, request_id: RequestId) -> bytes:
    """The request-id field of a ``method`` request: appended to its encoded body (fields
    may come in any order), it names the request ``request_id``."""
    encoded = request_id.encode()
    return b"".join(
        (_tag(ID_FIELD[method], _LENGTH_DELIMITED), encode_varint(len(encoded)), encoded)
    )


def with_request_id(method: str, body: bytes, request_id: RequestId) -> bytes:
    """``body`` (an encoded ``method`` request without an id) naming ``request_id``."""
    return body + id_field(method, request_id)


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
    """The request id of an encoded ``method`` request, None when it carries none.

    Read by the engine (``csrc/request_id.h``: the fields walked, the digest taken
    as this module's docstring defines it); here the id is checked, and a malformed
    item refused only once the id itself passed.
    """
    found = _native.read_request_id(method, body)
    if found is None:
        return None
    clients, seq, digest, malformed, rest = found
    client = ""
    for raw in clients:  # the last client field wins, any of them must be UTF-8
        try:
            client = raw.decode()
        except UnicodeDecodeError:
            raise InvalidArgument("a request id's client is not UTF-8") from None
    request_id = RequestId(client, seq)
    if malformed:
        raise MalformedMessage(malformed)
    return Named(request_id, digest, body, rest)


def _tag(number: int, wire_type: int) -> bytes:
    return encode_varint(number << 3 | wire_type)
