"""The operator's settings, read once from the environment at start.

Environment variables are the deployment convention the Helm chart and the
Dockerfiles agree on (RECSTORE_PS_IMAGE, RECSTORE_ADMIN_URL, ...); tests build
an OperatorConfig directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from recstore.core.reconcile import GRPC_PORT


@dataclass(frozen=True)
class OperatorConfig:
    ps_image: str = "recstore-ps:latest"
    #: Secret (in each table's namespace) whose key ``token`` is the PS auth token.
    ps_token_secret: str | None = None
    admin_url: str | None = None
    #: The operator's identity at the admin API: a token of the ``provisioner`` role (the
    #: only one allowed to register nodes and write shard status), not an admin token.
    provisioner_token: str | None = None
    cluster_domain: str = "cluster.local"
    #: seconds between status refreshes of every table.
    status_interval: float = 10.0
    #: port the operator dials shards on (their pod IP); the pods listen on GRPC_PORT.
    ps_port: int = GRPC_PORT
    rpc_timeout: float = 30.0
    save_timeout: float = 300.0
    #: failed final-checkpoint attempts before a deletion goes ahead anyway.
    checkpoint_retries: int = 3
    retry_delay: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            ps_image=env.get("RECSTORE_PS_IMAGE") or defaults.ps_image,
            ps_token_secret=env.get("RECSTORE_PS_TOKEN_SECRET") or None,
            admin_url=env.get("RECSTORE_ADMIN_URL") or None,
            provisioner_token=env.get("RECSTORE_PROVISIONER_TOKEN") or None,
            cluster_domain=env.get("RECSTORE_CLUSTER_DOMAIN") or defaults.cluster_domain,
            status_interval=float(env.get("RECSTORE_STATUS_INTERVAL") or defaults.status_interval),
        )
