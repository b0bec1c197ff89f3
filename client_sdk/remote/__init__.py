"""The SDK's remote path: tables on PS nodes over gRPC.

In the order a training step meets them:

- ``backend``: ``GrpcBackend``, the ``Backend`` the client calls: create/find,
  pull, push, update and their multi-table forms.
- ``tables``: ``RemoteTable`` (spec, nodes in shard order, router) and where a
  table's shards are (the admin API's discovery document or explicit endpoints).
- ``routing``: keys -> owner shard by the table's slot map; wrong-owner
  refusals refresh the map and resend only the refused keys.
- ``step``: ``Step``, one object under one lock: the updates held to ride on
  the next pull, the updates in flight (``updates``), the next step's pulls.
- ``requests`` / ``replies``: a multi-table call's one request per node (native
  encoder, Python planner past the byte bound) and its replies scattered back.
- ``single_table``: one table's Pull/Push/Update requests per shard.
- ``nodes``: the channel to one node, and gRPC failures -> the SDK's errors.
"""
