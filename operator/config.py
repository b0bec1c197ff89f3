"""The operator's settings, read once from the environment at start.

Environment variables are the deployment convention the Helm chart and the
Dockerfiles agree on (RECSTORE_PS_IMAGE, RECSTORE_ADMIN_URL, ...); tests build
an OperatorConfig directly.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from recstore.core.fleet import GRPC_PORT
from recstore.core.reshard import pace as copy_pace
from recstore.core.reshard.plan import DEFAULT_BATCH_SLOTS
from recstore.core.reshard.retry import RetryPolicy
from recstore.core.tls import ClientTls


@dataclass(frozen=True)
class OperatorConfig:
    ps_image: str = "recstore-ps:latest"
    #: Secret (in each table's namespace) whose key ``token`` is the PS auth token.
    ps_token_secret: str | None = None
    #: Secret (in each table's namespace) whose key ``token`` is the read-only token the
    #: nodes of inference tables accept besides the PS token (readers, serving replicas).
    ps_read_only_token_secret: str | None = None
    admin_url: str | None = None
    #: The operator's identity at the admin API: a token of the ``provisioner`` role (the
    #: only one allowed to register nodes and write shard status), not an admin token.
    provisioner_token: str | None = None
    #: file holding that token, read at every call, so a token created or rotated after
    #: start is picked up (what the chart mounts); wins over ``provisioner_token``.
    provisioner_token_file: Path | None = None
    #: image patterns (fnmatch) a table's placement.image may name besides ``ps_image``;
    #: None: any image (development only: whoever writes a table picks what runs with
    #: the PS token).
    allowed_images: tuple[str, ...] | None = None
    #: Secret (in each table's namespace) with the PS pods' certificate: ``tls.crt``,
    #: ``tls.key`` and ``ca.crt`` (cert-manager's layout); None: the pods serve plaintext.
    ps_tls_secret: str | None = None
    #: PS pods require client certificates signed by that ``ca.crt`` (mutual TLS).
    ps_tls_mutual: bool = False
    #: how the operator verifies the PS pods and the admin API (``RECSTORE_TLS_*``).
    tls: ClientTls | None = None
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
    #: slots per batch of a move (one seal pauses this many)
    reshard_batch_slots: int = DEFAULT_BATCH_SLOTS
    #: bytes per second a move's copy before each seal may take (0: no cap; copy_pace)
    reshard_copy_rate: float = 0.0
    #: a failed online move's retries (``recstore.core.reshard.retry.RetryPolicy``): the
    #: wait doubles from the first delay to the cap; after this many failed tries in a row
    #: (a try that commits a batch starts the row again) it waits for a new spec.shards
    #: or an operator restart
    reshard_attempts: int = 5
    reshard_retry_delay: float = 5.0
    reshard_retry_cap: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            ps_image=env.get("RECSTORE_PS_IMAGE") or defaults.ps_image,
            ps_token_secret=env.get("RECSTORE_PS_TOKEN_SECRET") or None,
            ps_read_only_token_secret=env.get("RECSTORE_PS_READ_ONLY_TOKEN_SECRET") or None,
            admin_url=env.get("RECSTORE_ADMIN_URL") or None,
            provisioner_token=env.get("RECSTORE_PROVISIONER_TOKEN") or None,
            provisioner_token_file=(
                Path(file) if (file := env.get("RECSTORE_PROVISIONER_TOKEN_FILE")) else None
            ),
            allowed_images=_patterns(env.get("RECSTORE_ALLOWED_IMAGES")),
            ps_tls_secret=env.get("RECSTORE_PS_TLS_SECRET") or None,
            ps_tls_mutual=(env.get("RECSTORE_PS_TLS_MUTUAL") or "").lower() in ("1", "true"),
            tls=ClientTls.from_environment(env),
            cluster_domain=env.get("RECSTORE_CLUSTER_DOMAIN") or defaults.cluster_domain,
            status_interval=float(env.get("RECSTORE_STATUS_INTERVAL") or defaults.status_interval),
            reshard_batch_slots=int(
                env.get("RECSTORE_RESHARD_BATCH_SLOTS") or defaults.reshard_batch_slots
            ),
            reshard_copy_rate=copy_pace.rate_from(env.get(copy_pace.RATE_ENV)),
            reshard_attempts=int(env.get("RECSTORE_RESHARD_ATTEMPTS") or defaults.reshard_attempts),
            reshard_retry_delay=float(
                env.get("RECSTORE_RESHARD_RETRY_DELAY") or defaults.reshard_retry_delay
            ),
            reshard_retry_cap=float(
                env.get("RECSTORE_RESHARD_RETRY_CAP") or defaults.reshard_retry_cap
            ),
        )

    def __post_init__(self) -> None:
        if self.reshard_batch_slots < 1:
            raise ValueError("RECSTORE_RESHARD_BATCH_SLOTS must be >= 1")
        copy_pace.check_rate(self.reshard_copy_rate)
        try:
            self.reshard_retry  # noqa: B018 (checked once, at start)
        except ValueError as error:
            raise ValueError(
                "RECSTORE_RESHARD_RETRY_DELAY, RECSTORE_RESHARD_RETRY_CAP, "
                f"RECSTORE_RESHARD_ATTEMPTS: {error}"
            ) from error
        # PS pods serving TLS are unreachable to an operator that cannot verify them
        if self.ps_tls_secret and self.tls is None:
            raise ValueError("RECSTORE_PS_TLS_SECRET is set but RECSTORE_TLS_CA is not")
        if self.ps_tls_mutual and (self.tls is None or self.tls.cert is None):
            raise ValueError("RECSTORE_PS_TLS_MUTUAL needs RECSTORE_TLS_CERT and RECSTORE_TLS_KEY")

    @property
    def reshard_retry(self) -> RetryPolicy:
        """The retry policy of a failed online move, with this operator's parameters."""
        return RetryPolicy(
            self.reshard_retry_delay, self.reshard_retry_cap, attempts=self.reshard_attempts
        )

    def image_problem(self, image: str | None) -> str | None:
        """Why a table may not run ``image`` (None when it may, or names none)."""
        if image is None or self.allowed_images is None or image == self.ps_image:
            return None
        if any(fnmatch.fnmatchcase(image, pattern) for pattern in self.allowed_images):
            return None
        allowed = ", ".join([self.ps_image, *self.allowed_images])
        return f"spec.placement.image {image!r} is not allowed; allowed images: {allowed}"

    def read_provisioner_token(self) -> str | None:
        """The operator's admin API token: the file's current content, else the variable."""
        if self.provisioner_token_file is not None:
            try:
                return self.provisioner_token_file.read_text().strip() or None
            except OSError:
                return None  # not created yet: see docs/kubernetes.md
        return self.provisioner_token


def _patterns(raw: str | None) -> tuple[str, ...] | None:
    """``RECSTORE_ALLOWED_IMAGES``: comma-separated patterns; unset: any image."""
    if raw is None:
        return None
    return tuple(p.strip() for p in raw.split(",") if p.strip())
