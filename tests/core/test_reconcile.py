"""The reconcile core: declarations validated, shards planned, status derived."""

from __future__ import annotations

import datetime as dt

import pytest

from recstore.core import reconcile
from recstore.core.checkpoint_status import CheckpointState, ShardCheckpoint, TableCheckpoint
from recstore.core.errors import InvalidArgument
from recstore.core.reconcile import (
    Observation,
    Resharding,
    ShardState,
    parse_declaration,
    plan_shards,
    ps_node_args,
)
from recstore.core.status import TableStatus

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def compute_status(*, previous, **kwargs):
    """The core's status in its wire form; ``previous`` as a stored (wire) status."""
    stored = TableStatus.from_stored(previous)
    return reconcile.compute_status(previous=stored, **kwargs).to_wire()


BASE = {"numEmbeddings": 1000, "embeddingDim": 8}


def decl(**fields):
    return parse_declaration({**BASE, **fields}, default_name="t")


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"embeddingDim": 0}, "spec.embeddingDim"),
        ({"shards": 0}, "spec.shards"),
        ({"dtype": "int8"}, "spec.dtype"),
        ({"bogus": 1}, "spec.bogus"),
        ({"keys": {"mode": "dense", "eviction": "lru"}}, "hashed keys only"),
        ({"placement": {"gpus": -1}}, "spec.placement.gpus"),
        ({"placement": {"resources": {"memory": "lots"}}}, "spec.placement.resources.memory"),
        ({"placement": {"nodeSelector": {"bad key!": "x"}}}, "spec.placement.nodeSelector"),
        ({"placement": {"tolerations": [{"operator": "Equal"}]}}, "needs a key"),
        ({"storage": "gpu"}, "needs spec.placement.gpus >= 1"),
        ({"name": "Bad Name"}, "spec.name"),
    ],
)
def test_invalid_declarations_name_the_field(fields, fragment):
    with pytest.raises(InvalidArgument) as err:
        decl(**fields)
    assert fragment in str(err.value)


def test_declaration_defaults_and_name():
    d = decl()
    assert d.spec.name == "t" and d.spec.shards == 1
    assert d.placement.gpus == 0 and d.placement.storage.size == "10Gi"
    assert parse_declaration({**BASE, "name": "my_table"}, default_name="t").spec.name == "my_table"
    gpu = decl(storage="gpu", placement={"gpus": 2})
    assert gpu.placement.gpus == 2


#: the end of a CPU node's arguments with the default checkpoint policy
CPU_DEFAULT_TAIL = ["--device", "cpu", "--durability", "checkpoint", "--checkpoint-interval", "0",
                    "--keep-checkpoints", "3", "--host", "0.0.0.0"]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "options", "expected_tail"),
    [
        ({}, {}, CPU_DEFAULT_TAIL),
        (
            {
                "storage": "gpu",
                "placement": {"gpus": 1},
                "checkpoint": {"durability": "wal", "intervalSeconds": 600, "keep": 5},
            },
            {"auth_token_file": "/t/token"},
            [
                "--device",
                "cuda",
                "--durability",
                "wal",
                "--checkpoint-interval",
                "600",
                "--keep-checkpoints",
                "5",
                "--host",
                "0.0.0.0",
                "--auth-token-file",
                "/t/token",
            ],
        ),
        # GPUs in the placement do not move a host-memory table onto them
        ({"placement": {"gpus": 1}}, {}, CPU_DEFAULT_TAIL),
    ],
)
def test_ps_node_args(fields, options, expected_tail):
    args = ps_node_args(decl(shards=3, **fields), shard_index="$(IDX)", **options)
    assert args[:9] == ["ps-node", "--port", "50051", "--metrics-port", "9100", "--data-dir",
                        "/data", "--shard-index", "$(IDX)"]  # fmt: skip
    assert args[9:11] == ["--num-shards", "3"]
    assert args[11:] == expected_tail


@pytest.mark.parametrize(("mode", "passed"), [("inference", True), ("training", False)])
def test_read_only_token_goes_to_inference_nodes_only(mode, passed):
    args = ps_node_args(
        decl(mode=mode), shard_index=0, auth_token_file="/t/token", read_only_token_file="/r/t"
    )
    assert (args[-2:] == ["--read-only-token-file", "/r/t"]) == passed
    assert ("--read-only-token-file" in args) == passed


def test_a_read_only_token_without_the_auth_token_is_refused():
    with pytest.raises(ValueError, match="needs an auth token file"):
        ps_node_args(decl(mode="inference"), shard_index=0, read_only_token_file="/r/t")


def test_plan_shards_orders_endpoints_and_indices():
    plans = plan_shards(decl(shards=3), lambda i: f"127.0.0.1:{7000 + i}", port=7000)
    assert [p.index for p in plans] == [0, 1, 2]
    assert [p.endpoint for p in plans] == ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert [p.args[p.args.index("--shard-index") + 1] for p in plans] == ["0", "1", "2"]


def shards(*ready):
    return tuple(ShardState(i, f"h{i}:1", r) for i, r in enumerate(ready))


@pytest.mark.parametrize(
    ("kwargs", "previous_phase", "phase", "ready_reason"),
    [
        ({"problem": "bad"}, None, "Failed", "InvalidSpec"),
        ({"observation": Observation()}, None, "Pending", "NoShardsYet"),
        ({"observation": Observation(2, False, shards(True, False))}, None, "Provisioning",
         "ShardsStarting"),
        ({"observation": Observation(2, False, shards(True, True))}, None, "Ready",
         "AllShardsReady"),
        ({"observation": Observation(2, True, shards(True, True))}, "Ready", "Provisioning",
         "ShardsStarting"),
        ({"observation": Observation(2, False, shards(True, False))}, "Ready", "Degraded",
         "ShardsNotReady"),
        ({"observation": Observation(2, False, shards(False, False))}, "Degraded", "Degraded",
         "ShardsNotReady"),
        ({"observation": Observation(2, False, shards(True, True)), "deleting": True}, "Ready",
         "Deleting", "Deleting"),
        ({"observation": Observation(2, False, shards(False, False), refused="no GPU")}, None,
         "Failed", "NodeRefused"),
        ({"observation": Observation(2, False, shards(False, False), refused="no GPU")}, "Ready",
         "Failed", "NodeRefused"),
    ],
)  # fmt: skip
def test_phases(kwargs, previous_phase, phase, ready_reason):
    args = {"problem": None, "declared_shards": 2, "observation": Observation(), **kwargs}
    previous = {"phase": previous_phase} if previous_phase else None
    status = compute_status(**args, generation=3, previous=previous, now=T0)
    assert status["phase"] == phase
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["reason"] == ready_reason
    assert conds["Ready"]["status"] == ("True" if phase == "Ready" else "False")
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
    assert status["observedGeneration"] == 3


def moving(from_shards, to_shards, slots_moved=0):
    return Resharding(from_shards, to_shards, slots_moved, 16384, 0, 2)


@pytest.mark.parametrize(
    ("observation", "previous_phase", "phase"),
    [
        # a growth starts its new shards first: they own no slot, the table serves
        (Observation(4, False, shards(True, True, False, False), resharding=moving(2, 4)),
         "Ready", "Resharding"),
        (Observation(4, False, shards(True, True, True, True), resharding=moving(2, 4)),
         "Ready", "Resharding"),
        # a shard owning slots down: degraded, move or not
        (Observation(4, False, shards(True, False, False, False), resharding=moving(2, 4)),
         "Ready", "Degraded"),
        (Observation(4, False, shards(True, True, True, False), resharding=moving(2, 4, 1024)),
         "Resharding", "Degraded"),
        # a shrink's highest shard owns its slots until the move ends
        (Observation(3, False, shards(True, True, False), resharding=moving(3, 2, 1024)),
         "Resharding", "Degraded"),
        (Observation(3, False, shards(True, True, True), resharding=moving(3, 2, 1024)),
         "Resharding", "Resharding"),
        # never served yet: starting, not degraded
        (Observation(2, False, shards(True, False), resharding=moving(2, 3)), None,
         "Provisioning"),
        # a rollout under way wins
        (Observation(4, True, shards(True, True, False, False), resharding=moving(2, 4)),
         "Ready", "Provisioning"),
    ],
)  # fmt: skip
def test_phases_during_a_move(observation, previous_phase, phase):
    previous = {"phase": previous_phase} if previous_phase else None
    status = compute_status(problem=None, declared_shards=observation.resharding.to_shards,
                            observation=observation, generation=2, previous=previous,
                            now=T0)  # fmt: skip
    assert status["phase"] == phase
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == ("True" if phase == "Resharding" else "False")


def test_invalid_spec_condition_carries_the_message():
    status = compute_status(
        problem="spec.embeddingDim: too small",
        declared_shards=None,
        observation=Observation(),
        generation=1,
        previous=None,
        now=T0,
    )
    cond = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert cond == {
        "type": "SpecValid",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "spec.embeddingDim: too small",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
        "observedGeneration": 1,
    }


def test_reshard_required_when_the_shard_count_differs():
    obs = Observation(2, False, shards(True, True))
    status = compute_status(problem=None, declared_shards=4, observation=obs, generation=2,
                            previous=None, now=T0)  # fmt: skip
    cond = next(c for c in status["conditions"] if c["type"] == "ReshardRequired")
    assert cond["status"] == "True" and cond["reason"] == "ShardCountChanged"
    assert "spec.shards is 4 but 2 shards run" in cond["message"]
    assert status["phase"] == "Ready"  # what runs still serves
    assert [s["index"] for s in status["shards"]] == [0, 1]


def test_transition_times_stay_while_a_condition_holds():
    obs = Observation(1, False, shards(True))
    first = compute_status(problem=None, declared_shards=1, observation=obs, generation=1,
                           previous=None, now=T0)  # fmt: skip
    later = T0 + dt.timedelta(minutes=5)
    again = compute_status(problem=None, declared_shards=1, observation=obs, generation=1,
                           previous=first, now=later)  # fmt: skip
    assert again == first  # nothing changed: nothing to write
    broken = compute_status(problem=None, declared_shards=1, observation=Observation(
        1, False, shards(False)), generation=1, previous=first, now=later)  # fmt: skip
    ready = next(c for c in broken["conditions"] if c["type"] == "Ready")
    valid = next(c for c in broken["conditions"] if c["type"] == "SpecValid")
    assert ready["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert valid["lastTransitionTime"] == "2026-01-01T12:00:00Z"


COMPLETED = TableCheckpoint(
    id="request-7", request_id=7, state=CheckpointState.completed, at="2026-01-01T12:00:00Z",
    shards=[ShardCheckpoint(index=0, endpoint="h0:1", rows=10, bytes=80)],
)  # fmt: skip


def test_the_wire_status_holds_every_field_but_an_unknown_slot_map():
    observation = Observation(
        1, False, shards(True), last_checkpoint=COMPLETED, checkpoint_request=COMPLETED
    )
    status = compute_status(problem=None, declared_shards=1, observation=observation,
                            generation=1, previous=None, now=T0)  # fmt: skip
    assert set(status) == {"phase", "conditions", "observedGeneration", "readyShards", "shards",
                           "slotMapEpoch", "lastCheckpoint", "checkpointRequest"}  # fmt: skip
    assert status["shards"] == [{"index": 0, "endpoint": "h0:1", "ready": True}]
    assert status["slotMapEpoch"] == 1 and status["readyShards"] == 1
    assert status["lastCheckpoint"] == status["checkpointRequest"] == {
        "id": "request-7", "requestId": 7, "state": "Completed", "message": None,
        "at": "2026-01-01T12:00:00Z",
        "shards": [{"index": 0, "endpoint": "h0:1", "rows": 10, "bytes": 80, "error": None}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("observed", "stored", "kept"),
    [
        (None, None, None),
        (None, COMPLETED, COMPLETED),  # nothing new: the stored one stays
        (COMPLETED, None, COMPLETED),
        (COMPLETED.model_copy(update={"id": "request-8", "request_id": 8}), COMPLETED,
         COMPLETED.model_copy(update={"id": "request-8", "request_id": 8})),
    ],
)  # fmt: skip
def test_checkpoints_observed_anew_win_and_the_stored_ones_stay(observed, stored, kept):
    previous = TableStatus(phase="Ready", last_checkpoint=stored, checkpoint_request=stored)
    status = reconcile.compute_status(
        problem=None, declared_shards=1, generation=1, now=T0, previous=previous,
        observation=Observation(1, False, shards(True), last_checkpoint=observed,
                                checkpoint_request=observed),
    )  # fmt: skip
    assert status.last_checkpoint == kept and status.checkpoint_request == kept


def test_a_long_problem_is_cut_to_the_status_bound():
    status = compute_status(problem="x" * 5000, declared_shards=None, observation=Observation(),
                            generation=1, previous=None, now=T0)  # fmt: skip
    message = next(c for c in status["conditions"] if c["type"] == "SpecValid")["message"]
    assert len(message) == 1024 and message.endswith("…")


def test_a_node_refusal_fails_the_table_with_the_nodes_reason():
    refusal = "shard 0: table 't' is stored on a GPU (storage: gpu), but this node cannot use one"
    status = compute_status(
        problem=None,
        declared_shards=2,
        observation=Observation(2, False, shards(False, False), refused=refusal),
        generation=1,
        previous=None,
        now=T0,
    )
    conds = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Failed"
    assert conds["Ready"]["message"] == refusal and conds["Ready"]["status"] == "False"
    assert conds["SpecValid"]["status"] == "True"  # the declaration itself is fine
    assert conds["Progressing"]["status"] == "False"  # nothing is on its way
