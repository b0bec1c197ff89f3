"""Online resharding, the part every provisioner shares (the operator and ``recstore up``).

``plan`` (pure: which slots move, in which batches, the job record),
``capacity`` (can every target hold what it will own), ``messages`` (the
Migrat*/Seal*/SlotChecksums/SetSlotMap messages and calls; the gRPC method
names keep their wire spelling), ``protocol`` (a job's steps against live
nodes), ``drive`` (a whole reshard for a provisioner: new shards, batches,
progress, old shards stopped), ``events`` (its moments, as audit events),
``retry`` (when a failed reshard is tried again) and ``pace`` (the copy's rate
cap). No I/O but through the node clients a provisioner hands in.
"""
