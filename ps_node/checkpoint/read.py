"""The checkpoints under a root, trusted only once verified: scan, verify, find, read, prune.

``scan`` reports a manifest that does not parse or whose own sha256 differs;
``verify_table`` checks a table's files whole (size, shape, sha256) before a
row of it is used. A table saved incrementally restores through its chain
(``chain_of``: its full base first, each link checked against the manifest
checksum the next one recorded), and every link verifies like a full
checkpoint before a row is used (``verify_chain``). Written by
``recstore.ps.checkpoint.write`` and ``recstore.ps.checkpoint.incremental``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recstore.core.errors import CheckpointCorrupt, CheckpointNotFound
from recstore.ps.checkpoint.write import (
    CHECKPOINT_ID_PATTERN,
    FORMAT,
    MANIFEST,
    MANIFEST_DIGEST,
    TEMP_PREFIX,
    VERSION,
    CheckpointInfo,
    Chunk,
    info_of,
    manifest_digest,
)


def read_manifest(path: Path) -> CheckpointInfo:
    """The checkpoint at ``path``; CheckpointCorrupt when its manifest is unusable."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} version {VERSION} manifest")
        digest = manifest.get(MANIFEST_DIGEST)  # absent in checkpoints of older releases
        if digest is not None and digest != manifest_digest(manifest):
            raise ValueError("manifest sha256 mismatch")
        return info_of(path, manifest)
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
            found.infos.append(read_manifest(path))
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
    """Check every table's files against the manifest (this checkpoint's own files)."""
    for name in info.manifest["tables"]:
        verify_table(info, name, from_disk=from_disk)


#: per table of an incremental checkpoint: its bases (id and manifest sha256), full one first
CHAIN = "chain"


def chain_links(info: CheckpointInfo, name: str) -> list[dict[str, str]]:
    """The bases ``info`` records for table ``name`` (none: the table is saved whole)."""
    return list(info.manifest["tables"][name].get(CHAIN, []))


def chain_of(info: CheckpointInfo, name: str) -> list[CheckpointInfo]:
    """The checkpoints restoring ``name`` as ``info`` holds it: its full base first, ``info``
    last. Bases are read beside ``info`` and must carry the manifest checksum recorded."""
    incarnation = info.manifest["tables"][name].get("incarnation")
    chain = []
    for link in chain_links(info, name):
        base_id = str(link.get("checkpoint_id", ""))
        path = info.path.parent / base_id
        if not CHECKPOINT_ID_PATTERN.fullmatch(base_id) or not (path / MANIFEST).is_file():
            raise CheckpointCorrupt(
                info.checkpoint_id, name, f"base checkpoint {base_id!r} of its chain is missing"
            )
        base = read_manifest(path)
        meta = base.manifest["tables"].get(name)
        if (
            base.manifest.get(MANIFEST_DIGEST) != link.get(MANIFEST_DIGEST)
            or meta is None
            or meta.get("incarnation") != incarnation
        ):
            raise CheckpointCorrupt(
                info.checkpoint_id, name, f"base checkpoint {base_id!r} is not the one recorded"
            )
        chain.append(base)
    return [*chain, info]


def verify_chain(info: CheckpointInfo, name: str) -> list[CheckpointInfo]:
    """``chain_of``, every link's files verified whole; CheckpointCorrupt names the bad link."""
    chain = chain_of(info, name)
    for link in chain:
        verify_table(link, name)
    return chain


def verify_restorable(info: CheckpointInfo) -> None:
    """Check that every table of ``info`` restores: its whole chain verifies."""
    for name in info.manifest["tables"]:
        verify_chain(info, name)


def replay_chain(
    chain: list[CheckpointInfo],
    name: str,
    rows: Callable[[Chunk], None],
    erase: Callable[[np.ndarray], object],
) -> None:
    """Feed a (verified) chain's rows in order: each link's gone keys, then its rows."""
    for link in chain:
        gone = link.manifest["tables"][name]["files"].get("deleted")
        if gone is not None and int(np.prod(gone["shape"])):
            erase(np.fromfile(link.path / gone["file"], dtype=np.dtype(gone["dtype"])))
        for chunk in table_chunks(link, name):
            rows(chunk)


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
            verify_restorable(named[0])
        except CheckpointCorrupt as error:
            report(error)
            raise
        return named[0]
    for damaged in found.damaged:
        report(damaged)
    for info in reversed(found.infos):
        try:
            verify_restorable(info)
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


def prune(
    root: Path, keep: int, protect: Collection[str] = (), tables: Collection[str] = ()
) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints, sparing the ids in ``protect``, for
    each of ``tables`` the newest ``keep`` that hold it (a table saved alone, as a pool's
    tables are, keeps its own history whatever its neighbours save), and every base a
    kept checkpoint's chains need."""
    infos = list_checkpoints(root)
    kept = {info.checkpoint_id for info in infos[-keep:]} if keep > 0 else set()
    for table in tables if keep > 0 else ():
        kept |= {i.checkpoint_id for i in [i for i in infos if table in i.tables][-keep:]}
    spared = set(protect) | kept
    for info in [i for i in infos if i.checkpoint_id in spared]:  # a chain lists all its bases
        spared |= {str(ln.get("checkpoint_id")) for t in info.tables for ln in chain_links(info, t)}
    removed = []
    for info in infos[:-keep] if keep > 0 else []:
        if info.checkpoint_id in spared:
            continue
        shutil.rmtree(info.path, ignore_errors=True)
        removed.append(info.checkpoint_id)
    return removed


def remove_temporaries(root: Path) -> None:
    """Half-written checkpoints of a save that crashed."""
    if root.is_dir():
        for path in root.glob(f"{TEMP_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)
