"""Versioned on-disk checkpoints of every table of a node, written atomically.

Layout: ``<data_dir>/checkpoints/<id>/manifest.json`` plus, per table, raw
little-endian ``keys.bin``, ``values.bin`` and ``state.bin`` (optimizer state);
an incremental table (``recstore.ps.checkpoint.incremental``) holds the changed rows in
those and the keys gone since its base in ``deleted.bin``.
The manifest records each table's spec, slot map and optimizer state, and each
file's dtype, shape and sha256, and its own sha256. A checkpoint is written
into a temporary directory, fsynced and renamed into place, so a crash mid-save
leaves the previous checkpoints untouched. Reading, verifying and pruning them is
``recstore.ps.checkpoint.read``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recstore.core import InvalidArgument
from recstore.ps.wal.segments import fsync_path

FORMAT = "recstore-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest_sha256"  # the manifest's own checksum, a field of it
TEMP_PREFIX = ".tmp-"
CHECKPOINT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # keys, values, state


@dataclass
class CheckpointInfo:
    checkpoint_id: str
    path: Path
    sequence: int
    created_unix: float
    tables: list[str]
    rows: int
    bytes: int
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)


def validate_checkpoint_id(checkpoint_id: str) -> str:
    if not CHECKPOINT_ID_PATTERN.fullmatch(checkpoint_id):  # "$" alone lets a final \n by
        raise InvalidArgument(
            f"checkpoint id {checkpoint_id!r} must match {CHECKPOINT_ID_PATTERN.pattern}"
        )
    return checkpoint_id


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class _HashingFile:
    """A binary file that hashes what it writes and fsyncs on close."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "wb")  # noqa: SIM115
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, array: np.ndarray) -> None:
        if array.size == 0:
            return
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        self._hash.update(data)
        self._handle.write(data)
        self.size += len(data)

    def close(self, dtype: np.dtype, shape: list[int], root: Path) -> dict[str, Any]:
        """Flush, fsync and close (closed even when that fails); the manifest's entry."""
        try:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        finally:
            self.discard()
        return {
            "file": str(self.path.relative_to(root)),
            "dtype": dtype.str,
            "shape": shape,
            "bytes": self.size,
            "sha256": self._hash.hexdigest(),
        }

    def discard(self) -> None:
        """Close without keeping what was written (a failed save): whatever the close
        says, the descriptor is released, so a removed file gives its space back."""
        with contextlib.suppress(OSError):  # a failing flush of the buffer still closes
            self._handle.close()


class CheckpointWriter:
    """Builds one checkpoint in a temporary directory; ``commit`` makes it visible."""

    def __init__(self, root: Path, checkpoint_id: str, sequence: int, node: dict[str, Any]):
        self.root = root
        self.checkpoint_id = validate_checkpoint_id(checkpoint_id)
        if (root / checkpoint_id).exists():
            raise InvalidArgument(f"checkpoint {checkpoint_id!r} already exists")
        self.sequence = sequence
        self.temp = root / f"{TEMP_PREFIX}{checkpoint_id}-{uuid.uuid4().hex[:8]}"
        self.temp.mkdir(parents=True)
        self.manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "checkpoint_id": checkpoint_id,
            "sequence": sequence,
            "node": node,
            "tables": {},
        }

    def add_table(
        self,
        name: str,
        *,
        chunks: Iterable[Chunk],
        dim: int,
        value_dtype: np.dtype,
        state_width: int,
        meta: dict[str, Any],
        deleted: np.ndarray | None = None,
    ) -> int:
        """Stream a table's chunks to disk; ``meta`` (spec, slot map, ...) goes to the manifest.

        ``deleted``: the keys an incremental table lost since its base (its own file).
        """
        directory = self.temp / "tables" / name
        directory.mkdir(parents=True)
        parts = ["keys", "values", "state", *(["deleted"] if deleted is not None else [])]
        files: dict[str, _HashingFile] = {}
        try:  # every file opened is closed on every path: a failed save holds no space
            for part in parts:
                files[part] = _HashingFile(directory / f"{part}.bin")
            return self._write_table(name, files, chunks, dim, value_dtype, state_width,
                                     meta, deleted)  # fmt: skip
        finally:
            for handle in files.values():
                handle.discard()

    def _write_table(
        self,
        name: str,
        files: dict[str, _HashingFile],
        chunks: Iterable[Chunk],
        dim: int,
        value_dtype: np.dtype,
        state_width: int,
        meta: dict[str, Any],
        deleted: np.ndarray | None,
    ) -> int:
        if deleted is not None:
            files["deleted"].write(np.asarray(deleted, dtype="<i8"))
        rows = 0
        for keys, values, state in chunks:
            files["keys"].write(np.asarray(keys, dtype="<i8"))
            files["values"].write(np.asarray(values, dtype=value_dtype))
            files["state"].write(np.asarray(state, dtype="<f4"))
            rows += len(keys)
        written = {
            "keys": files["keys"].close(np.dtype("<i8"), [rows], self.temp),
            "values": files["values"].close(value_dtype, [rows, dim], self.temp),
            "state": files["state"].close(np.dtype("<f4"), [rows, state_width], self.temp),
        }
        if deleted is not None:
            written["deleted"] = files["deleted"].close(np.dtype("<i8"), [len(deleted)], self.temp)
        self.manifest["tables"][name] = {
            **_jsonable(meta),
            "rows": rows,
            "dim": dim,
            "state_width": state_width,
            "files": written,
        }
        return rows

    def commit(self) -> CheckpointInfo:
        self.manifest["created_unix"] = time.time()
        self.manifest[MANIFEST_DIGEST] = manifest_digest(self.manifest)
        path = self.temp / MANIFEST
        with open(path, "w") as handle:
            json.dump(self.manifest, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        for directory in [*self.temp.glob("tables/*"), self.temp / "tables", self.temp]:
            if directory.is_dir():
                fsync_path(directory)
        final = self.root / self.checkpoint_id
        os.rename(self.temp, final)
        fsync_path(self.root)
        return info_of(final, self.manifest)

    def abort(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)


def info_of(path: Path, manifest: dict[str, Any]) -> CheckpointInfo:
    tables = manifest["tables"]
    return CheckpointInfo(
        checkpoint_id=manifest["checkpoint_id"],
        path=path,
        sequence=int(manifest["sequence"]),
        created_unix=float(manifest.get("created_unix", 0.0)),
        tables=sorted(tables),
        rows=sum(int(t["rows"]) for t in tables.values()),
        bytes=sum(int(f["bytes"]) for t in tables.values() for f in t["files"].values()),
        manifest=manifest,
    )


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The manifest's own checksum (over every field but the checksum)."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
