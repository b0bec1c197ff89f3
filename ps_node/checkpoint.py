"""Versioned on-disk checkpoints of every table of a node, written atomically.

Layout: ``<data_dir>/checkpoints/<id>/manifest.json`` plus, per table, raw
little-endian ``keys.bin``, ``values.bin`` and ``state.bin`` (optimizer state).
The manifest records each table's spec, slot map and optimizer state, and each
file's dtype, shape and sha256, and its own sha256. A checkpoint is written
into a temporary directory, fsynced and renamed into place, so a crash mid-save
leaves the previous checkpoints untouched; the last ``keep`` are kept. Nothing
is trusted on read: ``scan`` reports manifests that do not parse or verify,
``verify_table`` checks a table's files before a row of it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recstore.core import InvalidArgument, RecStoreError
from recstore.ps.wal import fsync_dir

FORMAT = "recstore-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest_sha256"  # the manifest's own checksum, a field of it
TEMP_PREFIX = ".tmp-"
CHECKPOINT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]  # keys, values, state


class CheckpointCorrupt(RecStoreError):
    """A checkpoint whose manifest or files do not verify (gRPC DATA_LOSS)."""

    def __init__(self, checkpoint_id: str, table: str | None, reason: str) -> None:
        where = f"checkpoint {checkpoint_id!r}" + (f", table {table!r}" if table else "")
        super().__init__(f"{where}: {reason}")
        self.checkpoint_id = checkpoint_id
        self.table = table  # None: the manifest itself
        self.reason = reason


class CheckpointNotFound(RecStoreError):
    """No checkpoint with that id (gRPC NOT_FOUND)."""


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
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        return {
            "file": str(self.path.relative_to(root)),
            "dtype": dtype.str,
            "shape": shape,
            "bytes": self.size,
            "sha256": self._hash.hexdigest(),
        }


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
    ) -> int:
        """Stream a table's chunks to disk; ``meta`` (spec, slot map, ...) goes to the manifest."""
        directory = self.temp / "tables" / name
        directory.mkdir(parents=True)
        files = {
            part: _HashingFile(directory / f"{part}.bin") for part in ("keys", "values", "state")
        }
        rows = 0
        for keys, values, state in chunks:
            files["keys"].write(np.asarray(keys, dtype="<i8"))
            files["values"].write(np.asarray(values, dtype=value_dtype))
            files["state"].write(np.asarray(state, dtype="<f4"))
            rows += len(keys)
        self.manifest["tables"][name] = {
            **_jsonable(meta),
            "rows": rows,
            "dim": dim,
            "state_width": state_width,
            "files": {
                "keys": files["keys"].close(np.dtype("<i8"), [rows], self.temp),
                "values": files["values"].close(value_dtype, [rows, dim], self.temp),
                "state": files["state"].close(np.dtype("<f4"), [rows, state_width], self.temp),
            },
        }
        return rows

    def commit(self) -> CheckpointInfo:
        self.manifest["created_unix"] = time.time()
        self.manifest[MANIFEST_DIGEST] = _manifest_digest(self.manifest)
        path = self.temp / MANIFEST
        with open(path, "w") as handle:
            json.dump(self.manifest, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        for directory in [*self.temp.glob("tables/*"), self.temp / "tables", self.temp]:
            if directory.is_dir():
                fsync_dir(directory)
        final = self.root / self.checkpoint_id
        os.rename(self.temp, final)
        fsync_dir(self.root)
        return _info(final, self.manifest)

    def abort(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)


def _info(path: Path, manifest: dict[str, Any]) -> CheckpointInfo:
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


def _manifest_digest(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_manifest(path: Path) -> CheckpointInfo:
    """The checkpoint at ``path``; CheckpointCorrupt when its manifest is unusable."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} version {VERSION} manifest")
        digest = manifest.get(MANIFEST_DIGEST)  # absent in checkpoints of older releases
        if digest is not None and digest != _manifest_digest(manifest):
            raise ValueError("manifest sha256 mismatch")
        return _info(path, manifest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointCorrupt(path.name, None, f"unreadable manifest: {error}") from None


@dataclass
class Scan:
    """The checkpoints under a root: readable ones oldest first, and damaged manifests."""

    infos: list[CheckpointInfo]
    damaged: list[CheckpointCorrupt]


def scan(root: Path) -> Scan:
    """Every committed checkpoint under ``root`` (files not verified, manifests are)."""
    found = Scan([], [])
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        if path.name.startswith(TEMP_PREFIX) or not (path / MANIFEST).is_file():
            continue
        try:
            found.infos.append(_read_manifest(path))
        except CheckpointCorrupt as error:
            found.damaged.append(error)
    found.infos.sort(key=lambda info: info.sequence)
    return found


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Checkpoints with a readable manifest, oldest first (files not verified)."""
    return scan(root).infos


def _sha256_of(path: Path, from_disk: bool) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if from_disk:  # drop the (clean, fsynced) cached pages so the read hits the device
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def verify_table(info: CheckpointInfo, name: str, *, from_disk: bool = False) -> None:
    """Check a table's files (size, shape, sha256) against the manifest, whole."""
    table = info.manifest["tables"][name]
    for part, meta in table["files"].items():
        try:
            dtype = np.dtype(meta["dtype"])
            expected = int(np.prod(meta["shape"])) * dtype.itemsize
            if expected != int(meta["bytes"]):
                raise CheckpointCorrupt(info.checkpoint_id, name, f"{part}: shape and size differ")
            path = info.path / meta["file"]
            if path.stat().st_size != expected:
                raise CheckpointCorrupt(
                    info.checkpoint_id, name, f"{part}: {path.stat().st_size} bytes, not {expected}"
                )
            if _sha256_of(path, from_disk) != meta["sha256"]:
                raise CheckpointCorrupt(info.checkpoint_id, name, f"{part}: sha256 mismatch")
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise CheckpointCorrupt(info.checkpoint_id, name, f"{part}: {error}") from None


def verify(info: CheckpointInfo, *, from_disk: bool = False) -> None:
    """Check every table's files against the manifest."""
    for name in info.manifest["tables"]:
        verify_table(info, name, from_disk=from_disk)


def find(
    root: Path,
    checkpoint_id: str | None,
    on_damaged: Callable[[CheckpointCorrupt], None] | None = None,
) -> CheckpointInfo:
    """A verified checkpoint: the given id, or the newest one that verifies.

    ``on_damaged`` hears of each damaged checkpoint passed over on the way.
    """
    found = scan(root)
    report = on_damaged or (lambda error: None)
    if checkpoint_id:
        named = [c for c in found.infos if c.checkpoint_id == checkpoint_id]
        try:
            for damaged in found.damaged:
                if damaged.checkpoint_id == checkpoint_id:
                    raise damaged
            if not named:
                raise CheckpointNotFound(f"no checkpoint {checkpoint_id!r} under {root}")
            verify(named[0])
        except CheckpointCorrupt as error:
            report(error)
            raise
        return named[0]
    for damaged in found.damaged:
        report(damaged)
    for info in reversed(found.infos):
        try:
            verify(info)
            return info
        except CheckpointCorrupt as error:
            report(error)
    raise CheckpointNotFound(f"no valid checkpoint under {root}")


def table_chunks(info: CheckpointInfo, name: str, chunk_rows: int = 65536) -> Iterator[Chunk]:
    """A table's rows from a checkpoint, in chunks ready for ``Table.import_chunk``."""
    table = info.manifest["tables"][name]
    rows = int(table["rows"])
    if rows == 0:
        return
    arrays = {}
    for part, meta in table["files"].items():
        shape = tuple(meta["shape"])
        if 0 in shape:  # a zero-width state (sgd) cannot be memory-mapped
            arrays[part] = np.zeros(shape, dtype=np.dtype(meta["dtype"]))
        else:
            arrays[part] = np.memmap(
                info.path / meta["file"], np.dtype(meta["dtype"]), "r", 0, shape
            )
    for start in range(0, rows, chunk_rows):
        stop = min(start + chunk_rows, rows)
        yield tuple(np.array(arrays[p][start:stop]) for p in ("keys", "values", "state"))  # type: ignore[misc]


def next_sequence(root: Path) -> int:
    existing = list_checkpoints(root)
    return existing[-1].sequence + 1 if existing else 1


def prune(root: Path, keep: int, protect: Collection[str] = ()) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints, sparing the ids in ``protect``."""
    removed = []
    for info in list_checkpoints(root)[:-keep] if keep > 0 else []:
        if info.checkpoint_id in protect:
            continue
        shutil.rmtree(info.path, ignore_errors=True)
        removed.append(info.checkpoint_id)
    return removed


def remove_temporaries(root: Path) -> None:
    """Half-written checkpoints of a save that crashed."""
    if root.is_dir():
        for path in root.glob(f"{TEMP_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)
