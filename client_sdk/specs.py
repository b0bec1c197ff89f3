"""From ``init_data`` arguments to a ``TableSpec``, and the checks around it.

``init_data(name, shape, dtype, ..., base_offset, metadata)`` becomes one
table spec: dense keys covering ids ``base_offset .. base_offset + rows - 1``
(so ``num_embeddings = base_offset + rows``), the table dtype, and the
optimizer (sgd at the client's learning rate unless ``metadata`` or the
``optimizer`` keyword gives another). Everything else a spec holds (key mode,
initializer, shards, storage tier, checkpoints, the non-finite policy) may come
in ``metadata``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from recstore.client.tensors import table_dtype
from recstore.core import DType, KeyMode, Optimizer, TableSpec

#: ``metadata`` keys that become spec fields (the rest of a spec comes from the arguments).
SPEC_METADATA_KEYS = frozenset(
    {
        "keys",
        "initializer",
        "optimizer",
        "shards",
        "storage",
        "gpu_cache",
        "checkpoint",
        "non_finite",
        "mode",
    }
)


@dataclass(frozen=True)
class TableMeta:
    """What the client remembers of a table it initialised."""

    shape: tuple[int, int]
    dtype: DType
    base_offset: int
    spec: TableSpec
    is_gdata: bool

    @property
    def dense(self) -> bool:
        return self.spec.key_mode == KeyMode.dense

    @property
    def id_range(self) -> tuple[int, int | None]:
        """Valid ids [low, high); high None for hashed tables (any int64 key)."""
        if not self.dense:
            return 0, None
        return self.base_offset, self.base_offset + self.shape[0]


def check_shape(shape: Any) -> tuple[int, int]:
    try:
        rows, dim = (int(x) for x in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be (num_embeddings, embedding_dim), got {shape!r}") from None
    if rows < 1 or dim < 1:
        raise ValueError(f"shape must be positive, got {(rows, dim)}")
    return rows, dim


def check_learning_rate(lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"learning rate must be a positive finite number, got {lr!r}")
    return float(lr)


def optimizer_spec(optimizer: Any, lr: float) -> Optimizer:
    """``"adagrad"``, ``{"kind": "adam", "lr": 1e-3}`` or an ``Optimizer`` (lr defaults to lr)."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, str):
        optimizer = {"kind": optimizer}
    if not isinstance(optimizer, Mapping):
        raise ValueError(f"optimizer must be a name, a dict or an Optimizer, got {optimizer!r}")
    fields = {"lr": lr, **optimizer}
    try:
        return Optimizer.model_validate(fields)
    except pydantic.ValidationError as error:
        raise ValueError(f"bad optimizer {dict(optimizer)!r}: {error}") from None


def build_spec(
    name: str,
    shape: Any,
    dtype: Any,
    *,
    base_offset: int = 0,
    metadata: Mapping[str, Any] | None = None,
    optimizer: Any = None,
    lr: float = 0.01,
    server_initialised: bool = False,
) -> TableSpec:
    """The spec of a table ``init_data`` creates.

    ``server_initialised`` (no ``init_func``): unless ``metadata`` names an
    initializer, rows start as zeros, the documented default, produced by the
    store itself rather than written over the wire.
    """
    rows, dim = check_shape(shape)
    if isinstance(base_offset, bool) or not isinstance(base_offset, int) or base_offset < 0:
        raise ValueError(f"base_offset must be a non-negative int, got {base_offset!r}")
    metadata = dict(metadata or {})
    unknown = set(metadata) - SPEC_METADATA_KEYS
    if unknown:
        raise ValueError(
            f"unknown metadata keys {sorted(unknown)}; allowed: {sorted(SPEC_METADATA_KEYS)}"
        )
    if optimizer is not None and "optimizer" in metadata:
        raise ValueError("give the optimizer either as a keyword or in metadata, not both")
    chosen = optimizer if optimizer is not None else metadata.pop("optimizer", "sgd")
    hashed = KeyMode(dict(metadata.get("keys") or {}).get("mode", "dense")) == KeyMode.hashed
    fields: dict[str, Any] = {
        **metadata,
        "name": name,
        # dense ids address rows directly, so the key range reaches base_offset + rows
        "num_embeddings": rows if hashed else base_offset + rows,
        "embedding_dim": dim,
        "dtype": table_dtype(dtype),
        "optimizer": optimizer_spec(chosen, lr),
    }
    if not server_initialised or "initializer" not in metadata:
        fields["initializer"] = {"kind": "zeros"}
    try:
        return TableSpec.model_validate(fields)
    except pydantic.ValidationError as error:
        raise ValueError(f"invalid table {name!r}: {error}") from None


def same_layout(expected: TableSpec, existing: TableSpec) -> bool:
    """Shape and dtype agree (the rest of a spec may differ between creators)."""
    return (
        expected.num_embeddings == existing.num_embeddings
        and expected.embedding_dim == existing.embedding_dim
        and DType(expected.dtype) == DType(existing.dtype)
    )
