"""A remote table as the SDK knows it, and where its shards are.

``RemoteTable`` is the one record of a table the remote path passes around:
its spec, its nodes in shard order and the router holding its slot map.
Where the shards are comes from the admin API's discovery document or from
explicit endpoints.

``GET {admin}/api/v1/tables/{name}/discovery`` (``Authorization: Bearer
<token>``) answers the table's spec, its slot map and one endpoint per shard in
shard order. Without an admin API, an explicit ``host:port`` list (shard order)
stands in, with the initial slot map of that many shards. Plain ``urllib``:
a training image needs no HTTP client library for one GET.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import grpc

from recstore.client.errors import BackendError, TableNotInitialized
from recstore.client.remote.routing import ShardRouter
from recstore.core import DType, SlotMap, TableSpec
from recstore.core.tls import ClientTls

ENDPOINTS_ENV = "RECSTORE_PS_ENDPOINTS"
ADMIN_URL_ENV = "RECSTORE_ADMIN_URL"
TOKEN_ENV = "RECSTORE_TOKEN"
DISCOVERY_TIMEOUT_S = 10.0


@dataclass
class RemoteTable:
    spec: TableSpec
    endpoints: tuple[str, ...]  # shard order (refreshed with the slot map)
    router: ShardRouter
    #: the dtype rows and gradients travel in ("": the table dtype); see transport_of
    transport: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


def transport_of(spec: TableSpec, client_choice: str | None) -> str:
    """The wire dtype of a table's rows: the client's choice for a float32 table, else the spec's.

    A client asking for 16-bit transport leaves tables that are not float32 as they are.
    """
    if client_choice and DType(spec.dtype) == DType.float32:
        return DType(client_choice).value
    return spec.wire_dtype


@dataclass(frozen=True)
class Discovery:
    spec: TableSpec | None  # None when only endpoints are known
    endpoints: tuple[str, ...]
    slot_map: SlotMap


def parse_endpoints(raw: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"h1:p1,h2:p2"`` or a list of ``host:port`` -> validated tuple, shard order kept."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    endpoints = tuple(item.strip() for item in items if item.strip())
    if not endpoints:
        raise ValueError("no PS endpoints given: expected host:port[,host:port...]")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad PS endpoint {endpoint!r}: expected host:port")
    return endpoints


def parse_discovery(document: dict[str, Any]) -> Discovery:
    """The admin API's discovery document -> spec, endpoints, slot map (ValueError if malformed)."""
    try:
        spec = TableSpec.model_validate(document["spec"])
        endpoints = parse_endpoints(list(document["endpoints"]))
        slot_map = SlotMap.from_dict(document["slot_map"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"malformed discovery document: missing or bad {error}") from error
    if slot_map.num_shards > len(endpoints):
        raise ValueError(
            f"discovery lists {len(endpoints)} endpoints for a slot map of "
            f"{slot_map.num_shards} shards"
        )
    return Discovery(spec, endpoints, slot_map)


def discover(
    admin_url: str, name: str, token: str | None, tls: ClientTls | None = None
) -> Discovery:
    """Ask the admin API where table ``name`` lives (an https URL is verified with ``tls``'s CA)."""
    url = f"{admin_url.rstrip('/')}/api/v1/tables/{urllib.parse.quote(name)}/discovery"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:  # not carried over a redirect: the token is for this admin API only
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    try:
        context = tls.ssl_context() if tls is not None else None
        with urllib.request.urlopen(
            request, timeout=DISCOVERY_TIMEOUT_S, context=context
        ) as response:
            document = json.loads(response.read())
    except urllib.error.HTTPError as error:
        reason = error.read().decode("utf-8", "replace")[:500]
        if error.code == 404:
            raise TableNotInitialized(
                f"table {name!r} is not in the admin API catalogue at {admin_url}; "
                "create it there first",
                reason=reason,
            ) from error
        raise BackendError(
            f"admin API discovery of {name!r} failed: HTTP {error.code}",
            code=f"HTTP_{error.code}",
            reason=reason,
        ) from error
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
        raise BackendError(
            f"admin API at {admin_url} unreachable for discovery of {name!r}: {error}",
            code=grpc.StatusCode.UNAVAILABLE,
        ) from error
    try:
        return parse_discovery(document)
    except ValueError as error:
        raise BackendError(str(error), code="BAD_DISCOVERY") from error


def check_shard_order(
    endpoints: tuple[str, ...], index: int, shard: int, slot_map: SlotMap | None
) -> None:
    """The node listed ``index``-th must be shard ``index``, and every shard owning slots
    in the table's newest ``slot_map`` must be listed.

    A node's start-up shard count says nothing after online resharding (a kept node
    started as one of 2 serves a table on 3), so the count comes from the slot map.
    """
    owners = slot_map.num_shards if slot_map is not None else 0
    if shard != index or owners > len(endpoints):
        what = (
            f"the slot map (epoch {slot_map.epoch}) spreads the table over {owners} shards"
            if slot_map is not None
            else "no slot map"
        )
        raise BackendError(
            f"PS node {endpoints[index]} is shard {shard}, but it is listed as shard {index} "
            f"of {len(endpoints)} ({what}): endpoints must be given in shard order, one per shard",
            code=grpc.StatusCode.FAILED_PRECONDITION,
        )
