"""``Embedding`` and ``EmbeddingBag`` whose weights live in RecStore.

Constructor arguments and ``forward`` mirror ``torch.nn.Embedding`` and
``torch.nn.EmbeddingBag``. A forward pass looks its ids up through
``torch.ops.recstore.emb_lookup`` (``recstore.client.ops``; eagerly, its
kernels called without the dispatcher, ``recstore.client.dispatch``): one row per
occurrence, each distinct id pulled once over gRPC (locally every id is
looked up as it comes: the store is faster than deduplicating). An
``Embedding`` is those rows reshaped; a bag of the plain kind (sum/mean bags
of one fixed size: 2-D input, or offsets with a constant stride) is a sum over
the reshaped rows, whose backward is a broadcast; every other bag is torch's
own ``embedding_bag`` over the rows (each occurrence its own index, padding
occurrences an extra zero row), so modes, offsets, per-sample weights,
``padding_idx`` and ``include_last_offset`` behave exactly as in torch. Both
poolings are ``recstore.client.bags``'.
Backward hands one gradient row per occurrence to the op's backward, which
sums them per id and sends them to the table's server-side optimizer; a dense
torch optimizer of the trainer never sees these weights. Under
``torch.compile``/``torch.export`` nothing here reads tensor values, so the
forward is one graph (there, a 1-D batch of plain sum/mean bags is a segment
sum over its offsets: telling a constant stride apart would read them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from recstore.client import dispatch, op_tables
from recstore.client.bags import SEGMENTS, Pool, embedding_bag, pool_rows, uniform_bag_size
from recstore.client.client import RecStoreClient
from recstore.client.pooled import pools_eagerly
from recstore.client.state import TableState
from recstore.client.tensors import MODULE_ID_DTYPES, check_module_id_dtype
from recstore.core import Optimizer

#: torch.nn.Embedding initialises weights from N(0, 1); so does a RecStore module.
TORCH_INITIALIZER = {"kind": "normal", "mean": 0.0, "std": 1.0}


@dataclass(frozen=True)
class Lookup:
    """A forward pass cut in two: the rows it needs, then what it makes of them.

    ``ids`` are the batch's ids, flat, one row wanted per occurrence
    (``scale_grad_by_freq`` as in torch); ``finish(rows)`` turns those rows into
    the module's output. ``EmbeddingBagCollection`` looks up the ids of all its
    bags at once and then finishes each.
    """

    ids: torch.Tensor
    scale_grad_by_freq: bool
    finish: Callable[[torch.Tensor], torch.Tensor]
    #: plain sum/mean bags (no weights): pooled by ``dispatch.pool_many``
    #: (``recstore.client.pooled``), the engine's where it applies
    pool: Pool | None = None
    #: the bags' offsets when ``pool.bag_size`` is ``SEGMENTS``
    offsets: torch.Tensor | None = None

    def pooled(self, client: RecStoreClient, table: str) -> bool:
        """Whether this lookup takes the pooled path: traced (the op's kernel then picks
        the engine or per-id rows at run time), or eager on CPU ids of an engine table or
        a remote one (``pooled.pools_eagerly``)."""
        if self.pool is None:
            return False
        if dispatch.tracing((self.ids,)):
            return True
        return self.ids.device.type == "cpu" and pools_eagerly(client, table)


def _padding_index(padding_idx: int | None, num_embeddings: int) -> int | None:
    """torch's rule: negative counts from the end; must lie inside the table."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(f"padding_idx must be within num_embeddings, got {padding_idx}")
    return padding_idx + num_embeddings if padding_idx < 0 else padding_idx


class _RecStoreEmbeddingBase(TableState):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None,
        max_norm: float | None,
        norm_type: float,
        scale_grad_by_freq: bool,
        sparse: bool,
        _weight: torch.Tensor | None,
        _freeze: bool,
        dtype: torch.dtype | None,
        name: str | None,
        client: RecStoreClient | None,
        optimizer: Any,
        seed: int | None,
        initializer: dict[str, Any] | None,
        optimize_for_training: bool,
    ) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(
                "num_embeddings and embedding_dim must be >= 1, "
                f"got {num_embeddings}, {embedding_dim}"
            )
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = _padding_index(padding_idx, num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse  # gradients always travel sparse to the table; kept for repr/compat
        self._frozen = _freeze
        #: False: the table is opened in inference mode (no optimizer state; updates refused)
        self.optimize_for_training = optimize_for_training
        self.client = client if client is not None else RecStoreClient()
        self.table_name = name or f"emb_{uuid.uuid4().hex[:16]}"
        dtype = dtype or torch.float32
        self._dtype = dtype
        shape = (num_embeddings, embedding_dim)
        if _weight is not None and tuple(_weight.shape) != shape:
            raise ValueError(f"_weight must have shape {list(shape)}, got {list(_weight.shape)}")
        weight = None if _weight is None else _weight.detach()
        initializer = {
            **(initializer if initializer is not None else TORCH_INITIALIZER),
            "seed": seed if seed is not None else _random_seed(),
        }
        created = self.client._for_modules.create(
            self.table_name,
            shape,
            dtype,
            (lambda start, end: weight[start:end]) if weight is not None else None,
            metadata={"initializer": initializer, **_mode_metadata(optimize_for_training)},
            optimizer=optimizer
            if optimizer is not None
            else Optimizer(lr=self.client.learning_rate),
        )
        if created and weight is None and self.padding_idx is not None:
            # torch zeroes the padding row of freshly initialised weights
            pad = torch.tensor([self.padding_idx])
            self.client.push(self.table_name, pad, torch.zeros(1, embedding_dim, dtype=dtype))
        # The autograd anchor: not a Parameter, so dense torch optimizers never see it.
        self._anchor = torch.empty(0, requires_grad=self.takes_gradients)
        self._handle = op_tables.register(self.client, self.table_name)  # the ops' name for it

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise TypeError(
            f"{type(self).__name__} {self.table_name!r} keeps its rows in a RecStore table, "
            "which a deep copy cannot duplicate silently: build another module (a new table) "
            "and load_state_dict(this.state_dict()) into it, or share this module"
        )

    def _prepared(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` flattened, after ``max_norm`` renormalised their rows in the table."""
        check_module_id_dtype(ids)
        flat = ids.reshape(-1)
        if self.max_norm is None:
            return flat
        return dispatch.renorm(self._handle, flat, float(self.max_norm), float(self.norm_type))

    def _lookup(self, flat: torch.Tensor, scale_grad_by_freq: bool) -> torch.Tensor:
        """One row per id of ``flat`` ([len, dim]); backward updates the table."""
        return dispatch.lookup(
            self._anchor, self._handle, flat, self.padding_idx, scale_grad_by_freq
        )

    @property
    def _plain(self) -> bool:
        """No padding row, max-norm or frequency scaling: a lookup is a plain gather."""
        return self.padding_idx is None and self.max_norm is None and not self.scale_grad_by_freq

    def read_weights(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Current rows of ``ids`` (every row when None), detached, as stored."""
        if ids is None:
            ids = torch.arange(self.num_embeddings)
        with torch.no_grad():
            return self.client.pull(self.table_name, ids)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table as a tensor (a read; for small tables and tests)."""
        return self.read_weights()

    def _common_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}, table={self.table_name!r}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            text += f", max_norm={self.max_norm}"
        if self.scale_grad_by_freq:
            text += ", scale_grad_by_freq=True"
        return text


def _mode_metadata(optimize_for_training: bool) -> dict[str, str]:
    """The table spec's ``mode`` for a module: inference tables allocate no optimizer state."""
    return {} if optimize_for_training else {"mode": "inference"}


def _random_seed() -> int:
    return int(torch.randint(0, 2**62, (1,)).item())


class Embedding(_RecStoreEmbeddingBase):
    """torch.nn.Embedding with the weight table in RecStore."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        name: str | None = None,
        client: RecStoreClient | None = None,
        optimizer: Any = None,
        seed: int | None = None,
        initializer: dict[str, Any] | None = None,
        optimize_for_training: bool = True,
    ) -> None:
        super().__init__(
            num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq,
            sparse, _weight, _freeze, dtype, name, client, optimizer, seed, initializer,
            optimize_for_training,
        )  # fmt: skip

    @classmethod
    def from_pretrained(
        cls,
        embeddings: torch.Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        **recstore: Any,
    ) -> Embedding:
        if embeddings.dim() != 2:
            raise ValueError("embeddings must be 2-dimensional")
        rows, dim = embeddings.shape
        return cls(
            rows, dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
            _weight=embeddings, _freeze=freeze, dtype=embeddings.dtype, **recstore,
        )  # fmt: skip

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = self._lookup(self._prepared(input), self.scale_grad_by_freq)
        return rows.view(*input.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return self._common_repr()


class EmbeddingBag(_RecStoreEmbeddingBase):
    """torch.nn.EmbeddingBag with the weight table in RecStore."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        name: str | None = None,
        client: RecStoreClient | None = None,
        optimizer: Any = None,
        seed: int | None = None,
        initializer: dict[str, Any] | None = None,
        _freeze: bool = False,
        optimize_for_training: bool = True,
    ) -> None:
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode has to be one of sum, mean or max, got {mode!r}")
        super().__init__(
            num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq,
            sparse, _weight, _freeze, dtype, name, client, optimizer, seed, initializer,
            optimize_for_training,
        )  # fmt: skip
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        lookup = self._plan(input, offsets, per_sample_weights)
        if lookup.pooled(self.client, self.table_name):
            assert lookup.pool is not None
            (out,) = dispatch.pool_many(
                self._anchor,
                [self._handle],
                [lookup.ids],
                [lookup.offsets],
                [lookup.pool],
                [self.takes_gradients],
            )
            return out
        return lookup.finish(self._lookup(lookup.ids, lookup.scale_grad_by_freq))

    def _plan(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> Lookup:
        """Which rows this batch needs and how they become the output (see ``Lookup``)."""
        if self.max_norm is not None:  # renormalising writes: torch's checks of the batch first
            with torch.no_grad():
                embedding_bag(
                    torch.zeros_like(input), torch.zeros(1, 1), offsets, self.mode,
                    per_sample_weights, self.include_last_offset,
                )  # fmt: skip
        flat = self._prepared(input)
        bag_size = self._fixed_bag_size(input, offsets, per_sample_weights)
        if bag_size:
            pool = Pool(bag_size, self.mode == "mean")

            def pooled(rows: torch.Tensor) -> torch.Tensor:
                return pool_rows(rows, pool, offsets, per_sample_weights)

            engine = None if per_sample_weights is not None else pool
            return Lookup(flat, False, pooled, engine, offsets if bag_size == SEGMENTS else None)

        def bagged(rows: torch.Tensor) -> torch.Tensor:
            # each occurrence has its own row; padding occurrences point at an extra zero
            # row, first so that its index is a constant (a symbolic batch stays symbolic)
            padding = None
            if self.padding_idx is None:
                index = torch.arange(flat.numel(), dtype=input.dtype, device=input.device)
            else:
                index = torch.arange(1, flat.numel() + 1, dtype=input.dtype, device=input.device)
                index = torch.where(flat == self.padding_idx, 0, index)
                rows = torch.cat([rows.new_zeros(1, self.embedding_dim), rows])
                padding = 0
            return embedding_bag(
                index.view(input.shape), rows, offsets, self.mode, per_sample_weights,
                self.include_last_offset, padding,
            )  # fmt: skip

        scale = self.scale_grad_by_freq and self.mode != "max"  # torch's max mode ignores it
        return Lookup(flat, scale, bagged)

    def _fixed_bag_size(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None,
        per_sample_weights: torch.Tensor | None,
    ) -> int:
        """The size of every bag when the batch is plain fixed-size bags, else 0
        (``SEGMENTS`` while tracing a 1-D batch with offsets).

        Everything else (and every input torch would refuse) takes torch's own
        ``embedding_bag``.
        """
        if not (self._plain and self.mode in ("sum", "mean") and input.dtype in MODULE_ID_DTYPES):
            return 0
        if self._dtype != torch.float32:  # keep torch's own accumulation for 16-bit tables
            return 0
        if per_sample_weights is not None and (
            self.mode != "sum"
            or per_sample_weights.shape != input.shape
            or per_sample_weights.dtype != torch.float32
        ):
            return 0
        if input.dim() == 2 and offsets is None:
            return input.shape[1] if input.shape[0] else 0
        if input.dim() != 1 or offsets is None or self.include_last_offset:
            return 0
        if offsets.dim() != 1 or offsets.dtype != input.dtype or offsets.shape[0] == 0:
            return 0
        if torch.compiler.is_compiling():  # the stride check reads offsets: not in a graph
            return SEGMENTS
        return uniform_bag_size(offsets, input.numel())

    @classmethod
    def from_pretrained(
        cls,
        embeddings: torch.Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        **recstore: Any,
    ) -> EmbeddingBag:
        """torch.nn.EmbeddingBag.from_pretrained: a new table holding ``embeddings``' rows."""
        if embeddings.dim() != 2:
            raise ValueError("embeddings must be 2-dimensional")
        rows, dim = embeddings.shape
        return cls(
            rows, dim, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
            _weight=embeddings, include_last_offset=include_last_offset,
            padding_idx=padding_idx, dtype=embeddings.dtype, _freeze=freeze, **recstore,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"{self._common_repr()}, mode={self.mode!r}"
