"""Where and with what the shards of a table run: image, resources, GPUs, nodes, disk.

The table spec says *what* a table is; the placement says *where* its shards
run. The EmbeddingTable CRD carries both (``spec.placement``), the operator
renders the placement into pod specs, and the local provisioner reads the
GPU count to pick the device. Kubernetes quantities stay strings here
("500m", "4Gi"): they are validated by pattern, not converted, so the value a
user wrote is the value the pod gets.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from recstore.core.spec import WireModel

#: A Kubernetes resource quantity: a plain or decimal number with an optional
#: binary (Ki, Mi, ...), decimal (k, M, ...) or milli suffix.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
#: A label key (optional DNS prefix + name) and a label value.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
MAX_GPUS_PER_SHARD = 16

Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32)]


class Spread(str, Enum):
    """How hard shards of one table are kept off the same node."""

    preferred = "preferred"  # anti-affinity the scheduler tries to honour
    required = "required"  # never two shards on one node (needs >= shards nodes)
    none = "none"


class Resources(WireModel):
    """CPU and memory of one shard's PS container (requests; limits optional)."""

    cpu: Quantity = "1"
    memory: Quantity = "2Gi"
    #: CPU limit; unset means no CPU limit (throttling hurts tail latency).
    cpu_limit: Quantity | None = None
    #: memory limit; unset means the memory request is also the limit.
    memory_limit: Quantity | None = None


class Toleration(WireModel):
    key: Annotated[str, Field(max_length=253)] | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise ValueError("a toleration with operator Equal needs a key")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to effect NoExecute only")
        return self


class Storage(WireModel):
    """The persistent volume each shard keeps its data dir (checkpoints, WAL) on."""

    size: Quantity = "10Gi"
    #: storage class of the data-dir PVCs; unset means the cluster default.
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    #: keep the PVCs (and so the checkpoints) when the table is deleted.
    retain_on_delete: bool = True


class Placement(WireModel):
    """Image, resources and node constraints shared by every shard of a table."""

    #: PS node image; unset means the operator's default (RECSTORE_PS_IMAGE).
    image: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    #: GPUs per shard (``nvidia.com/gpu``); 0 runs the shard on CPU.
    gpus: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_SHARD)] = 0
    resources: Resources = Resources()
    node_selector: dict[
        Annotated[str, Field(pattern=LABEL_KEY_PATTERN)],
        Annotated[str, Field(pattern=LABEL_VALUE_PATTERN)],
    ] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    spread: Spread = Spread.preferred
    storage: Storage = Storage()
    #: seconds a shard gets to write its checkpoint when stopped.
    termination_grace_seconds: Annotated[int, Field(ge=0, le=3600)] = 60

    def to_wire(self) -> dict[str, object]:
        """JSON-ready camelCase form (the CR's ``spec.placement``)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
