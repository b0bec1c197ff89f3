"""PS node: a gRPC server around the native store (``recstore ps-node``).

The node core sits at the top of this package; what surrounds it lives in one
sub-package a concern, each saying in its docstring what it groups:

- ``node`` (the data path: pull, push, update), ``tables`` (the tables it hosts,
  create, drop, refusals), ``hosted_table`` (each table's state and the slot
  ownership check), ``native_path``, ``multi`` and ``named_multi`` (multi-table
  requests, checked by the native validator), ``row_transfer`` (rows with their
  optimizer state), ``capacity``, ``catalogue`` (the durable list of tables),
  ``changes`` (the change tracker), ``codec`` (wire buffers <-> arrays),
  ``cache_reports`` (trainers' caches as they report them);
- ``serve/``: the process and its gRPC server — servicer, options, auth,
  message limits, metrics, the thread-pool hand-off, ``start_in_thread``;
- ``wal/``: the write-ahead log — records, segments, group commit, the write
  gate and fail-stop, the de-dup window and its log, the apply log;
- ``checkpoint/``: snapshots — write, read and verify, incremental chains,
  save/load with the log (persistence), crash recovery;
- ``reshard/``: the node's side of an online reshard (outgoing and importing
  slots, their steps, seals on disk, import checksums) and the offline restore.

Imports go one way: ``serve`` may use everything; ``checkpoint`` and ``reshard``
use the core and ``wal``; ``wal`` uses neither the core's tables nor anything
above it (``pyproject.toml``'s import-linter contracts keep it so).
"""
