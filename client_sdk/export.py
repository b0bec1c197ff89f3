"""``recstore.export``: a model with RecStore embeddings saved for serving, and loaded back.

The embeddings are ``recstore.nn`` modules and ``Hierarchical`` ``recstore.nve``
layers: each reads a RecStore table, and the package holds those tables.

``save`` traces the model with ``torch.export`` (its lookups stay
``torch.ops.recstore`` calls, named by a handle of the package) and writes a
directory: ``model.pt2``, ``metadata.json`` and, per table, either its rows
(``tables/<name>.pt``) or a reference to the live table (its name and the
admin URL or PS endpoints that serve it); optionally an AOTInductor package
(``model_aoti.pt2``). ``load`` registers each handle again — a packaged
table is read into a read-only table of its own in this process (a private
store, so it never meets the process's other tables), a live one is reached
through a client — and returns a module that runs the program. Serving only
reads: an update, a write or ``max_norm`` renormalisation is refused.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from recstore.client import op_tables
from recstore.client.client import RecStoreClient
from recstore.client.nn import _RecStoreEmbeddingBase
from recstore.client.nve.config import LayerType
from recstore.client.nve.layer_state import LayerState
from recstore.client.remote.tables import parse_endpoints

FORMAT = 1
PROGRAM, AOTI_PACKAGE, METADATA, ROWS_DIR = "model.pt2", "model_aoti.pt2", "metadata.json", "tables"


def _embedding_modules(model: nn.Module) -> list[Any]:
    """The modules whose tables the package holds: ``recstore.nn`` modules and
    ``Hierarchical`` ``recstore.nve`` layers (the other NVE types refuse at trace)."""
    found = [
        m for m in model.modules()
        if isinstance(m, _RecStoreEmbeddingBase)
        or (isinstance(m, LayerState) and m.layer_type is LayerType.Hierarchical)
    ]  # fmt: skip
    if not found:
        raise ValueError(
            "the model holds no recstore.nn embedding module or Hierarchical recstore.nve "
            "layer: nothing to export"
        )
    return found


def _table_entry(module: Any, handle: str) -> dict[str, Any]:
    dtype, shape = module.client.get_data_meta(module.table_name)
    return {
        "name": module.table_name,
        "handle": handle,
        "num_embeddings": shape[0],
        "embedding_dim": shape[1],
        "dtype": str(dtype).removeprefix("torch."),
    }


def save(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    directory: str | Path,
    *,
    live: Mapping[str, str] | None = None,
    aoti: bool = False,
    dynamic_shapes: Any = None,
) -> Path:
    """Write the serving package of ``model`` to ``directory``; returns its path.

    ``live`` maps a table name to where the served model reaches it (an admin
    URL, or ``host:port,...`` PS endpoints in shard order) instead of packaging
    its rows. ``aoti=True`` also compiles an AOTInductor package;
    ``dynamic_shapes`` is passed to ``torch.export.export``.
    """
    directory = Path(directory)
    live = dict(live or {})
    modules = _embedding_modules(model)
    unknown = sorted(set(live) - {m.table_name for m in modules})
    if unknown:
        raise ValueError(f"live tables {unknown} are not tables of this model")
    for location in live.values():
        if not location.startswith(("http://", "https://")):
            parse_endpoints(location)  # ValueError for a malformed host:port list
    package = uuid.uuid4().hex[:12]
    tables, swapped = [], []
    created = not directory.exists()
    (directory / ROWS_DIR).mkdir(parents=True, exist_ok=True)
    try:
        for module in modules:
            handle = op_tables.register(
                module.client,
                module.table_name,
                handle=f"recstore-export-{package}/{module.table_name}",
            )
            swapped.append((module, module._handle))
            module._handle = handle  # the program is traced with the package's handle
            entry = _table_entry(module, handle)
            if module.table_name in live:
                entry.update(source="live", location=live[module.table_name])
            else:
                rows_file = f"{ROWS_DIR}/{module.table_name}.pt"
                torch.save({"rows": module.table_weight().materialise()}, directory / rows_file)
                entry.update(source="rows", rows_file=rows_file)
            tables.append(entry)
        program = _export(model, tuple(example_inputs), dynamic_shapes)
        torch.export.save(program, directory / PROGRAM)
        if aoti:  # compiling runs the program once: the package's handles are still known
            package_path = str(directory / AOTI_PACKAGE)
            torch._inductor.aoti_compile_and_package(program, package_path=package_path)
    except BaseException:
        if created:  # no half-written package left behind
            shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        for module, handle in swapped:
            op_tables.unregister(module._handle)
            module._handle = handle
    metadata = {
        "format": FORMAT,
        "program": PROGRAM,
        "aoti_package": AOTI_PACKAGE if aoti else None,
        "tables": tables,
    }
    (directory / METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
    return directory


def _export(model: nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any) -> Any:
    """``torch.export`` in eval mode; serving needs no gradient, so the anchors go plain."""
    anchored = [m for m in model.modules() if isinstance(getattr(m, "_anchor", None), torch.Tensor)]
    anchors = [m._anchor for m in anchored]
    was_training = model.training
    model.eval()
    try:
        for module in anchored:
            module._anchor = torch.empty(0)
        with torch.no_grad():
            return torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    finally:
        for module, anchor in zip(anchored, anchors, strict=True):
            module._anchor = anchor
        model.train(was_training)


class ServedModel(nn.Module):
    """A loaded package: call it like the model; ``close()`` releases its tables."""

    def __init__(self, program: Any, handles: list[str], clients: list[RecStoreClient]) -> None:
        super().__init__()
        self.program = program
        self._handles, self._clients = handles, clients

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)

    def close(self) -> None:
        for handle in self._handles:
            op_tables.unregister(handle)
        for client in self._clients:
            client.close()


def _serving_copy(entry: dict[str, Any], directory: Path) -> RecStoreClient:
    """A client whose own local store holds the packaged rows of one table."""
    from recstore.client.backends.local import LocalBackend
    from recstore.store import Store

    client = RecStoreClient(role=f"recstore-serving-{uuid.uuid4().hex[:12]}")
    client.set_ps_backend("local")
    client.ops = LocalBackend(Store())  # a private store: its names never meet the process's
    rows = torch.load(directory / entry["rows_file"], weights_only=True)["rows"]
    shape = (entry["num_embeddings"], entry["embedding_dim"])
    if tuple(rows.shape) != shape:
        raise ValueError(
            f"{entry['rows_file']} holds rows of shape {list(rows.shape)}, not {list(shape)}"
        )
    client.init_data(entry["name"], shape, rows.dtype)
    client.push(entry["name"], torch.arange(shape[0]), rows)
    return client


def _live_client(entry: dict[str, Any]) -> RecStoreClient:
    client = RecStoreClient(role=f"recstore-serving-{uuid.uuid4().hex[:12]}")
    location = entry["location"]
    if location.startswith(("http://", "https://")):
        client.set_admin_url(location)
    else:
        client.set_ps_endpoints(location)
    if client._backend().describe(entry["name"]) is None:
        client.close()
        raise RuntimeError(f"live table {entry['name']!r} does not exist at {location}")
    dtype = getattr(torch, entry["dtype"])
    client.init_data(entry["name"], (entry["num_embeddings"], entry["embedding_dim"]), dtype)
    return client


def load(directory: str | Path, *, aoti: bool = False) -> ServedModel:
    """The package in ``directory`` as a callable module (``aoti``: its AOTInductor build)."""
    directory = Path(directory)
    metadata = json.loads((directory / METADATA).read_text())
    if metadata.get("format") != FORMAT:
        raise ValueError(
            f"{directory / METADATA}: unknown package format {metadata.get('format')!r}"
        )
    if aoti and not metadata.get("aoti_package"):
        raise ValueError(f"{directory} has no AOTInductor package: save it with aoti=True")
    handles: list[str] = []
    clients: list[RecStoreClient] = []
    try:
        for entry in metadata["tables"]:
            live = entry["source"] == "live"
            client = _live_client(entry) if live else _serving_copy(entry, directory)
            clients.append(client)
            handles.append(
                op_tables.register(client, entry["name"], handle=entry["handle"], read_only=True)
            )
        if aoti:
            program: Any = torch._inductor.aoti_load_package(
                str(directory / metadata["aoti_package"])
            )
        else:
            program = torch.export.load(directory / metadata["program"]).module()
    except BaseException:
        ServedModel(None, handles, clients).close()
        raise
    return ServedModel(program, handles, clients)
