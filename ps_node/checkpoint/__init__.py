"""Checkpoints: a node's tables on disk, and how they come back.

``write`` (versioned snapshots, written atomically), ``read`` (scan, verify,
find and read them; nothing is used before it verifies), ``incremental``
(tables saved as the rows changed since the previous save), ``persistence``
(save and load of a node's tables, with the log rotated at the same instant),
``recovery`` (after a crash: the newest verified checkpoint, then the log) and
``failstop`` (after the log failed: the probe that reopens it and resumes
writes, saving first what memory holds that the log lost).
"""
