"""What a PS node takes in and sends out per call, bounded before it reads or allocates.

One bound, the node's batch bound (``NodeConfig.max_batch_bytes``), gives its
message limit (``recstore.core.limits.message_limit``), which is

- its gRPC receive limit: gRPC refuses a larger request from its length
  prefix, with RESOURCE_EXHAUSTED, before the body is read;
- its gRPC send limit and the bound every reply is checked against before it
  is allocated: the data path's replies are counted natively
  (``csrc/message_limit.h``, for Pull here and MultiPull in
  ``csrc/node_serve.cc``), the control plane's protobuf replies here, all
  refused with the same ``MessageTooLarge`` wording.

Authentication comes first: ``recstore.ps.serve.auth`` refuses a call without its
token before gRPC reads the request at all.
"""

from __future__ import annotations

import importlib
from typing import Any

from recstore.core import MessageTooLarge

#: the compiled engine, by name (no type stubs)
_native: Any = importlib.import_module("recstore._native")


def check_reply(reply: Any, limit: int) -> None:
    """Refuse a protobuf reply over ``limit`` bytes (its size is counted, not serialized)."""
    size = reply.ByteSize()
    if size > limit:
        raise MessageTooLarge(_native.message_too_large(size, limit))
