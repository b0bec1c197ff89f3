"""What the modules' custom ops do with real tensors: pull rows, send gradients, renormalise.

``recstore.client.ops`` registers these as ``torch.ops.recstore.*`` (schemas,
shape-only kernels, autograd); here is the eager work behind them. A lookup
takes the ids of a batch as they come (one per occurrence) and returns one row
per occurrence; over gRPC each distinct id travels once and its row is
repeated here. Backward receives one gradient row per occurrence and hands it
to the table's optimizer (the update runs inside ``loss.backward()``, where a
dense model's optimizer would run in ``step()``; a remote update is held to
ride on the next pull, see ``RecStoreClient.flush``): rows are summed per id
(in float32, as a coalesced sparse gradient), and the padding row gets no
update, as in torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from recstore.client.module_tables import GradientRows
from recstore.client.op_tables import resolve, writable
from recstore.client.tensors import module_keys, unique_keys

#: ``padding_idx`` of a table without a padding row in the list-typed ops
NO_PADDING = -1


def flat_keys(ids: torch.Tensor) -> torch.Tensor:
    return module_keys(ids.reshape(-1))


class Read(NamedTuple):
    """One table's share of ``read_distinct``."""

    rows: torch.Tensor  # as pulled: one per distinct id (``inverse`` given), else per occurrence
    inverse: torch.Tensor | None  # each occurrence's row, when each distinct id travelled once
    keys: torch.Tensor  # the keys pulled (the distinct ones, when ``inverse`` is given)


def read_distinct(handles: Sequence[str], ids: Sequence[torch.Tensor]) -> list[Read]:
    """Each table's rows as pulled, one multi-table pull per client (``Read``): each
    distinct id once where the table is remote. Rows stay on the CPU."""
    refs = [resolve(handle) for handle in handles]
    out: list[Read | None] = [None] * len(refs)
    for client in {id(ref.client): ref.client for ref in refs}.values():
        mine = [i for i, ref in enumerate(refs) if ref.client is client]
        requests, inverses = [], []
        for i in mine:
            keys, unique, inverse = client._for_modules.wire_keys(flat_keys(ids[i]))
            requests.append((refs[i].name, keys, unique))
            inverses.append(inverse)
        pulled = client._for_modules.pull_many(requests)
        for i, table_rows, inverse, (_, keys, _) in zip(
            mine, pulled, inverses, requests, strict=True
        ):
            out[i] = Read(table_rows, inverse, keys)
    return out  # type: ignore[return-value]


def read_rows(handles: Sequence[str], ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One row per occurrence of each table's ``ids``: one multi-table pull per client."""
    rows = []
    for (table_rows, inverse, _), table_ids in zip(read_distinct(handles, ids), ids, strict=True):
        if inverse is not None:
            table_rows = table_rows.index_select(0, inverse)
        rows.append(table_rows.to(table_ids.device))
    return rows


@dataclass(frozen=True)
class Gradient:
    """One table's share of a backward: per-occurrence ids and gradient rows."""

    handle: str
    ids: torch.Tensor
    grads: torch.Tensor
    padding_idx: int | None = None
    scale_grad_by_freq: bool = False
    unique: bool = False  # ids without repeats: sent as they are, nothing to sum


def gradients_of(
    handles: Sequence[str],
    ids: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    padding_idx: Sequence[int],
    scale_grad_by_freq: Sequence[bool],
    trainable: Sequence[bool] | None = None,
) -> list[Gradient]:
    """A multi-table backward's gradients: tables with no gradient (an unused
    output) or not ``trainable`` (a frozen module) get no update."""
    return [
        Gradient(
            handles[i],
            ids[i],
            grad,
            None if padding_idx[i] == NO_PADDING else padding_idx[i],
            scale_grad_by_freq[i],
        )
        for i, grad in enumerate(grads)
        if grad is not None and (trainable is None or trainable[i])
    ]


def send_gradients(gradients: Sequence[Gradient]) -> None:
    """Every table's gradient to its optimizer: one multi-table update, not waited for."""
    refs = [writable(g.handle) for g in gradients]
    updates: dict[int, list[GradientRows]] = {}  # per client: one multi-table update each
    for ref, gradient in zip(refs, gradients, strict=True):
        keys = flat_keys(gradient.ids)
        if not keys.numel():  # a batch of empty bags: no row to step
            continue
        grads = gradient.grads.detach().to("cpu", torch.float32).reshape(len(keys), -1)
        if gradient.scale_grad_by_freq:  # torch divides by the id's count in the whole batch
            _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
            grads = grads / counts.index_select(0, inverse).unsqueeze(1).to(grads.dtype)
        if gradient.padding_idx is not None:
            keep = keys != gradient.padding_idx
            keys, grads = keys[keep], grads[keep]
        if keys.numel():  # not when every id was the padding index
            updates.setdefault(id(ref.client), []).append((ref.name, keys, grads, gradient.unique))
    clients = {id(ref.client): ref.client for ref in refs}
    for client_id, batch in updates.items():
        clients[client_id]._for_modules.apply_gradients(batch)


def renormalise_table(handle: str, ids: torch.Tensor, max_norm: float, norm_type: float) -> None:
    """torch's ``max_norm``: rescale the stored rows of ``ids`` whose norm exceeds it."""
    ref = writable(handle)
    unique, _ = unique_keys(flat_keys(ids))
    with torch.no_grad():
        rows = ref.client.pull(ref.name, unique)
        changed = renormalise_(rows, max_norm, norm_type)
        if bool(changed.any()):
            ref.client.push(ref.name, unique[changed], rows[changed])


def renormalise_(rows: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """torch's ``embedding_renorm_`` on pulled rows; the mask of rows it scaled.

    As torch does: each row's norm in the row dtype, compared and turned into a
    scale in double, the scale applied in the dtype's compute type (float for
    16-bit rows).
    """
    norms = rows.norm(p=norm_type, dim=1).double()
    changed = norms > max_norm
    if bool(changed.any()):
        scale = max_norm / (norms[changed] + 1e-7)
        compute = torch.float64 if rows.dtype == torch.float64 else torch.float32
        scaled = rows[changed].to(compute) * scale.to(compute).unsqueeze(1)
        rows[changed] = scaled.to(rows.dtype)
    return changed
