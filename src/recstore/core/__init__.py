"""Shared core: table spec, routing, errors. Imports neither torch nor any service."""

from recstore.core.errors import (
    CapacityExhausted,
    DeviceUnavailable,
    InvalidArgument,
    MessageTooLarge,
    RecStoreError,
    TableExists,
    TableNotFound,
    Unauthenticated,
    WrongShard,
)
from recstore.core.routing import NUM_SLOTS, SlotMap, SlotRange, hash_keys, slot_of
from recstore.core.spec import (
    Checkpoint,
    DType,
    Durability,
    Eviction,
    Initializer,
    KeyMode,
    Keys,
    Optimizer,
    StorageTier,
    TableSpec,
)

__all__ = [
    "NUM_SLOTS",
    "CapacityExhausted",
    "Checkpoint",
    "DType",
    "DeviceUnavailable",
    "Durability",
    "Eviction",
    "Initializer",
    "InvalidArgument",
    "KeyMode",
    "Keys",
    "MessageTooLarge",
    "Optimizer",
    "RecStoreError",
    "SlotMap",
    "SlotRange",
    "StorageTier",
    "TableExists",
    "TableNotFound",
    "TableSpec",
    "Unauthenticated",
    "WrongShard",
    "hash_keys",
    "slot_of",
]
