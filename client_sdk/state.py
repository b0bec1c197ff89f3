"""``state_dict`` / ``load_state_dict`` of the RecStore torch modules, and the other
module behaviour torch gives a Parameter ``weight`` (freezing, dtype conversion).

torch.nn.Embedding(Bag) keep their rows in a Parameter ``weight``; a RecStore
module keeps them in its table, so ``nn.Module``'s own saving sees nothing.
``TableState`` puts the table in as ``weight``: ``state_dict()`` reads it in
row blocks into one tensor (what ``torch.save`` needs), ``load_state_dict``
writes a tensor's rows back block by block, with torch's strict-mode
semantics (missing/unexpected keys, shape mismatch -> torch's RuntimeError).

Inside ``optimizer_state(model)`` a table with optimizer state also puts it in,
under torch.optim's names: ``optimizer.sum`` (adagrad [rows, dim], row-wise
adagrad [rows, 1]), ``optimizer.exp_avg`` and ``optimizer.exp_avg_sq`` (adam
[rows, dim]) and ``optimizer.step`` (adam's step count, a 0-d int64 tensor).
``load_state_dict`` restores whichever of them a state dict holds; a table
without optimizer state (an inference table) drops them.

Inside ``lazy_weights(model)`` the entries are ``TableRows`` handles instead,
reading and writing row blocks on demand: what ``recstore.client.checkpoint``
hands to torch.distributed.checkpoint so a table is never held whole in the
trainer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from recstore.client.client import RecStoreClient
from recstore.client.table_rows import TableOptimizerState, TableRows, TableWeight

WEIGHT = "weight"
OPTIMIZER = "optimizer."
STEP = OPTIMIZER + "step"

__all__ = [
    "TableRows",
    "TableState",
    "TableWeight",
    "lazy_weights",
    "optimizer_state",
    "trainability_changes",
]

#: how often a module was frozen or unfrozen (what a collection's cached view of its
#: tables compares, ``recstore.client.grouped``)
_trainability = itertools.count()
_trainability_now = 0


def trainability_changes() -> int:
    """A number that moves whenever a module is frozen or unfrozen."""
    return _trainability_now


class TableState(nn.Module):
    """The state_dict side of ``recstore.nn``'s modules (they derive from it)."""

    client: RecStoreClient
    table_name: str
    num_embeddings: int
    embedding_dim: int
    _dtype: torch.dtype
    _lazy_weight = False
    _with_optimizer_state = False
    optimize_for_training: bool
    _anchor: torch.Tensor  # the autograd anchor: backward reaches the table through it
    _frozen = False
    #: what a conversion refusal tells the user to create instead
    _made_with = "the module with dtype"

    def _rows_where(self) -> str:
        """Where the rows are kept, for messages."""
        return f"{self.table_name!r} keeps its rows in RecStore"

    @property
    def takes_gradients(self) -> bool:
        """Whether backward sends gradients to the table: not frozen, not for inference."""
        return self.optimize_for_training and not self.frozen

    @property
    def frozen(self) -> bool:
        """Whether backward leaves the rows alone (``requires_grad_(False)``)."""
        return self._frozen

    @frozen.setter
    def frozen(self, value: bool) -> None:
        global _trainability_now
        self._frozen = bool(value)
        self._anchor.requires_grad_(self.takes_gradients)
        _trainability_now = next(_trainability) + 1

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """torch's switch for freezing a module: ``requires_grad_(False)`` freezes the rows.

        The rows are no Parameter (the table's own optimizer trains them), so
        ``nn.Module.requires_grad_``, which walks parameters, would leave them
        training. A parent's ``requires_grad_`` still reaches only parameters:
        freeze a RecStore module by calling this on it.
        """
        self._check_requires_grad(requires_grad)
        self.frozen = not requires_grad
        return super().requires_grad_(requires_grad)

    def _check_requires_grad(self, requires_grad: bool) -> None:
        if requires_grad and not self.optimize_for_training:
            raise ValueError(
                f"{type(self).__name__} {self._rows_where()}, opened as an inference table "
                "(optimize_for_training=False): it takes no gradients"
            )

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        """``to``/``half``/``double``/``cuda``...: the rows cannot change dtype in place.

        torch converts a module by mapping ``fn`` over its tensors; mapped over a
        tensor of the rows' dtype it tells whether they would change. A move to
        another device is fine (rows follow the ids' device already).
        """
        converted = fn(torch.empty(0, dtype=self._dtype))
        if converted.dtype != self._dtype:
            raise TypeError(
                f"{type(self).__name__} {self._rows_where()} as {self._dtype}; a module "
                f"conversion cannot change them to {converted.dtype}. Create "
                f"{self._made_with}={converted.dtype} instead (new rows; load_state_dict "
                "copies rows into them)"
            )
        return super()._apply(fn, recurse)

    def table_weight(self) -> TableWeight:
        shape = (self.num_embeddings, self.embedding_dim)
        return TableWeight(self.client, self.table_name, shape, self._dtype)

    def table_entries(self, *, with_optimizer_state: bool) -> dict[str, TableRows]:
        """The per-row entries: ``weight``, then the optimizer state's fields when asked."""
        entries: dict[str, TableRows] = {WEIGHT: self.table_weight()}
        if not with_optimizer_state:
            return entries
        spec = self.client._meta(self.table_name).spec
        fields = spec.optimizer.state_fields(self.embedding_dim) if spec.state_width else ()
        offset = 0
        for field, width in fields:
            entries[OPTIMIZER + field] = TableOptimizerState(
                self.client, self.table_name, self.num_embeddings, offset, width, spec.state_width
            )
            offset += width
        return entries

    def _has_step(self) -> bool:
        spec = self.client._meta(self.table_name).spec
        return spec.optimizer.kind == "adam" and not spec.inference

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        entries = self.table_entries(with_optimizer_state=self._with_optimizer_state)
        for key, entry in entries.items():
            destination[prefix + key] = entry if self._lazy_weight else entry.materialise()
        if self._with_optimizer_state and self._has_step():
            step = self.client.optimizer_step(self.table_name)
            destination[prefix + STEP] = torch.tensor(step, dtype=torch.int64)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """torch's rules for a Parameter ``weight``, with the rows going to the table.

        The optimizer state's entries are restored when present (required only inside
        ``optimizer_state``); a table without optimizer state drops them.
        """
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs)  # fmt: skip
        entries = self.table_entries(with_optimizer_state=True)
        expected = {prefix + key for key in entries} | (
            {prefix + STEP} if self._has_step() else set()
        )
        if strict:
            unexpected_keys.extend(
                k for k in state_dict
                if k.startswith(prefix) and k not in expected
                and k[len(prefix):].split(".", 1)[0] not in self._modules
                and not (k[len(prefix):].startswith(OPTIMIZER) and len(entries) == 1)
            )  # fmt: skip
        for key, target in entries.items():
            if prefix + key in state_dict:
                self._load_entry(prefix + key, state_dict[prefix + key], target, error_msgs)
            elif key == WEIGHT or self._with_optimizer_state:
                missing_keys.append(prefix + key)
        if self._has_step():
            step = state_dict.get(prefix + STEP)
            if step is not None:
                self.client.set_optimizer_step(self.table_name, int(step))
            elif self._with_optimizer_state:
                missing_keys.append(prefix + STEP)

    @staticmethod
    def _load_entry(key: str, value: Any, target: TableRows, error_msgs: list[str]) -> None:
        if target.same_as(value):
            return  # its rows are this table's rows already (a checkpoint loaded in place)
        if not isinstance(value, torch.Tensor | TableRows):
            error_msgs.append(
                f'While copying the parameter named "{key}", expected torch.Tensor or '
                f"Tensor-like object from checkpoint but received {type(value)}"
            )
            return
        if tuple(value.shape) != tuple(target.shape):
            error_msgs.append(
                f"size mismatch for {key}: copying a param with shape {value.shape} from "
                f"checkpoint, the shape in current model is {target.shape}."
            )
            return
        target.copy_from(value)


def _table_modules(model: nn.Module) -> Iterator[TableState]:
    for module in model.modules():
        if isinstance(module, TableState):
            yield module


@contextlib.contextmanager
def _flagged(model: nn.Module, flag: str) -> Iterator[None]:
    modules = [m for m in _table_modules(model) if not getattr(m, flag)]
    for module in modules:
        setattr(module, flag, True)
    try:
        yield
    finally:
        for module in modules:
            setattr(module, flag, False)


def lazy_weights(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Within: ``model.state_dict()`` holds a ``TableRows`` handle for each table entry."""
    return _flagged(model, "_lazy_weight")


def optimizer_state(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Within: ``model.state_dict()`` also holds each table's optimizer state, and
    ``load_state_dict`` requires it (strict mode)."""
    return _flagged(model, "_with_optimizer_state")
