"""The write-ahead log: what makes an acknowledged write survive kill -9, and exactly once.

``records`` (how a write is framed), ``segments`` (a table's log directory and
its replay, which refuses any damage but a torn tail: ``verify`` reads a
segment with every check, ``scan`` its frames one by one, ``repair`` cuts a
damaged log to its intact prefix when an operator accepts the loss),
``table_log`` (the open log of one table), ``commit`` (group commit: when a
write is durable), ``segment_file`` (the one seam to the disk), ``write_gate``
(fail-stop: no write applied that cannot be logged), ``dedup`` and
``dedup_log`` (the window of request ids that answers a resend instead of
applying it twice, kept in the log), ``apply_log`` (which node applied which
slots at which epoch, read back from the logs). The log sits below the node's
data path, checkpoints, resharding and serving: it imports none of them.
"""
