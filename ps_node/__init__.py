"""PS node: an asyncio gRPC server around the native store (``recstore ps-node``).

Small modules, each with one job: ``codec`` (wire buffers <-> arrays),
``wal`` (write-ahead log records; ``table_wal`` the open log, ``wal_commit``
its group commit, ``wal_segments`` its files and replay), ``checkpoint``
(versioned snapshots), ``catalogue`` (which tables the node hosts), ``node``
(the data path; ``node_tables`` the hosted tables, ``hosted_table`` each one's
state), ``recovery`` (after a crash), ``servicer`` (gRPC handlers; Pull/Push/Update on raw
bytes via ``recstore.core.wire``), ``offload`` (inline or thread pool),
``table_specs`` (``--table-spec-file``), ``auth``, ``metrics``, ``serving``
(process wiring; options in ``node_config``), ``process`` (``recstore
ps-node``) and ``server`` (a node on its own thread).
"""
