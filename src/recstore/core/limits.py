"""How large one data-path message may be: the batch bound and the gRPC limit it implies.

A PS node is configured with a batch bound: the most payload bytes (keys,
values, gradients, found flags) one request or reply carries. The message
limit adds room for everything else a message holds (field tags, table and
dtype names, alignment padding, the framing of multi-table items). The node
sets it as its gRPC receive and send limits and refuses, before allocating,
any reply that would exceed it; the SDK's channels use the limit of the
default bound, so what a default node sends, the SDK can receive.
"""

from __future__ import annotations

#: the default batch bound: 8M rows x dim 8 x fp32, or 1M rows x dim 64
DEFAULT_MAX_BATCH_BYTES = 256 << 20
#: room beyond the payloads of one message (tags, names, padding, item framing)
MESSAGE_OVERHEAD_BYTES = 1 << 20
#: the gRPC limit has to fit a C int
MAX_MESSAGE_BYTES = (1 << 31) - 1


def message_limit(max_batch_bytes: int) -> int:
    """The largest message (request or reply) a node with this batch bound takes or sends."""
    if max_batch_bytes < 1:
        raise ValueError(f"the batch bound must be at least 1 byte, got {max_batch_bytes}")
    limit = max_batch_bytes + MESSAGE_OVERHEAD_BYTES
    if limit > MAX_MESSAGE_BYTES:
        raise ValueError(
            f"a batch bound of {max_batch_bytes} bytes is above gRPC's largest message "
            f"({MAX_MESSAGE_BYTES} bytes, less {MESSAGE_OVERHEAD_BYTES} of overhead)"
        )
    return limit


#: the message limit of a node with the default batch bound (and of the SDK's channels)
DEFAULT_MESSAGE_LIMIT = message_limit(DEFAULT_MAX_BATCH_BYTES)


def grpc_options(max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> list[tuple[str, int]]:
    """gRPC's send and receive limits for this batch bound: a node's server sets them,
    and every channel to nodes (the SDK's, the control plane's) those of the default, so
    whatever a default node sends is received (gRPC's own default is 4 MiB)."""
    limit = message_limit(max_batch_bytes)
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
    ]


#: payload bytes (keys, values, optimizer state) of one chunk of exported rows
ROW_CHUNK_BYTES = 4 << 20
