"""The KVClient calls as ``torch.ops.recstore`` ops, for code that works at the op layer.

The reference compute layer exposes ``emb_read``, ``emb_write``,
``init_embedding_table``, ``emb_prefetch`` / ``emb_wait_result`` and the
local fast path ``local_lookup_flat`` / ``local_update_flat`` as torch ops;
these keep those names over ``RecStoreClient``, with a table handle
(``"<role>/<name>"``, see ``recstore.client.op_tables``) where the reference
had one global table. They check their input as the client does (ids any
integer dtype, 1-D; rows [N, dim]); a write, an update and a prefetch are
ordered side effects in a traced graph. The modules use ``recstore.client.ops``.
"""

from __future__ import annotations

import torch

from recstore.client.op_registry import op as _op
from recstore.client.op_registry import rows_like as _rows_like
from recstore.client.op_tables import TableRef, layout, register, resolve, writable


@_op("init_embedding_table", effect=True)
def init_embedding_table(role: str, name: str, num_embeddings: int, embedding_dim: int) -> None:
    """Create float32 table ``name`` with the client of ``role``; its handle is ``role/name``."""
    from recstore.client.client import RecStoreClient

    client = RecStoreClient(role=role)
    client.init_data(name, (num_embeddings, embedding_dim), torch.float32)
    register(client, name)


@init_embedding_table.register_fake
def _(role, name, num_embeddings, embedding_dim):
    return None


@_op("emb_read")
def emb_read(table: str, keys: torch.Tensor) -> torch.Tensor:
    """Rows [N, dim] of ``keys`` (``RecStoreClient.pull``)."""
    ref = resolve(table)
    return ref.client.pull(ref.name, keys)


@emb_read.register_fake
def _(table, keys):
    return _rows_like(keys, table)


@_op("emb_write", effect=True)
def emb_write(table: str, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Assign rows (``RecStoreClient.push``)."""
    ref = writable(table)
    ref.client.push(ref.name, keys, values)


@emb_write.register_fake
def _(table, keys, values):
    return None


@_op("emb_prefetch", effect=True)
def emb_prefetch(table: str, keys: torch.Tensor) -> int:
    """Start pulling ``keys`` in the background; the id for ``emb_wait_result``."""
    ref = resolve(table)
    return ref.client.prefetch(keys, name=ref.name)


@emb_prefetch.register_fake
def _(table, keys):
    return torch.library.get_ctx().new_dynamic_size()


@_op("emb_wait_result", effect=True)
def emb_wait_result(table: str, prefetch_id: int) -> torch.Tensor:
    """The rows of prefetch ``prefetch_id`` (each id collected once)."""
    return resolve(table).client.wait_for_prefetch(prefetch_id)


@emb_wait_result.register_fake
def _(table, prefetch_id):
    dim, dtype = layout(table)
    return torch.empty((torch.library.get_ctx().new_dynamic_size(), dim), dtype=dtype)


def _local(table: str, *, write: bool) -> TableRef:
    ref = writable(table) if write else resolve(table)
    backend = ref.client.ops
    if backend is None or backend.kind != "local":
        raise RuntimeError(
            f"table {ref.name!r}: local_lookup_flat/local_update_flat need the local backend, "
            f"the client of {table!r} uses {ref.client.backend}"
        )
    return ref


@_op("local_lookup_flat")
def local_lookup_flat(table: str, keys: torch.Tensor) -> torch.Tensor:
    """Rows of ``keys`` straight from the store of this process (local backend only)."""
    ref = _local(table, write=False)
    return ref.client.pull(ref.name, keys)


@local_lookup_flat.register_fake
def _(table, keys):
    return _rows_like(keys, table)


@_op("local_update_flat", effect=True)
def local_update_flat(table: str, keys: torch.Tensor, grads: torch.Tensor) -> None:
    """Apply gradients in the store of this process, waited for (local backend only)."""
    ref = _local(table, write=True)
    ref.client.update(ref.name, keys, grads)


@local_update_flat.register_fake
def _(table, keys, grads):
    return None
