"""The node's side of resharding: online moves of slots, and the offline restore.

Online (driven by a provisioner through ``recstore.core.reshard``): ``slots``
(what a source and a target hold while slots move: outgoing slots with their
change tracker and seal, importing slots), ``steps`` (each control RPC's step:
begin, snapshot pages, catch-up, seal, import, checksums, cleanup),
``held_slots`` (seals kept on disk across a restart), ``import_sums`` (a
target's running checksums). Offline: ``offline_restore`` (tables restored from
the checkpoints of another shard count).
"""
