"""Table and pool commands: apply, get, delete, checkpoint — kubectl-like, over the admin API."""

from __future__ import annotations

import datetime as dt
import functools
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table as RichTable

from recstore.cli.api_client import (
    DEFAULT_ADMIN_URL,
    AdminClient,
    CliError,
    resolve_tls,
    resolve_token,
)
from recstore.cli.manifests import PoolDeclaration, read_manifests
from recstore.core.checkpoint_status import CheckpointState
from recstore.core.errors import InvalidArgument
from recstore.core.reconcile import Declaration
from recstore.core.resource import (
    PLURAL,
    POOL_PLURAL,
    POOL_SHORT_NAMES,
    POOL_SINGULAR,
    SHORT_NAMES,
    SINGULAR,
)
from recstore.core.spec import Checkpoint
from recstore.local.state_dir import DEFAULT_STATE_DIR

AdminUrl = Annotated[
    str, typer.Option("--admin-url", envvar="RECSTORE_ADMIN_URL", help="Admin API base URL.")
]
Token = Annotated[
    str | None, typer.Option("--token", help="Bearer token (default: $RECSTORE_TOKEN).")
]
StateDir = Annotated[Path, typer.Option("--state-dir", help="Where `recstore up` keeps its token.")]
console = Console()
#: how a command may name the table resource, as kubectl does
TABLE_KINDS = ("table", "tables", SINGULAR, PLURAL, *SHORT_NAMES)
POOL_KINDS = ("pool", "pools", POOL_SINGULAR, POOL_PLURAL, *POOL_SHORT_NAMES)
#: a requested checkpoint's states before its outcome
WAITING = (CheckpointState.requested.value, CheckpointState.running.value)


def _client(url: str, token: str | None, state_dir: Path) -> AdminClient:
    return AdminClient(url, resolve_token(token, state_dir), tls=resolve_tls(url, state_dir))


def apply(
    file: Annotated[
        Path, typer.Option("-f", "--filename", help="EmbeddingTable / EmbeddingPool YAML.")
    ],
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Create or update the pools and tables an EmbeddingPool / EmbeddingTable YAML declares
    (its pools first, so the tables placed on them need not wait)."""
    manifests = read_manifests(file)
    client = _client(admin_url, token, state_dir)
    for pool in [m for m in manifests if isinstance(m, PoolDeclaration)]:
        _apply(client, "pools", POOL_SINGULAR, pool.name, pool.spec.to_wire(), {"name": pool.name})
    for table in [m for m in manifests if isinstance(m, Declaration)]:
        wire, extra = table.spec.to_wire(), {}
        if table.pool is not None:  # its shards (and checkpoints) are the pool's
            wire.pop("shards")
            if table.spec.checkpoint == Checkpoint():
                wire.pop("checkpoint")
            extra = {"pool": table.pool}
        _apply(client, "tables", SINGULAR, table.spec.name, wire, extra)


def _apply(
    client: AdminClient, collection: str, kind: str, name: str, wire: dict[str, Any],
    extra: dict[str, Any],
) -> None:  # fmt: skip
    """Create ``name`` from ``wire`` (with ``extra``), or patch the fields that differ."""
    current = client.get_or_none(f"/{collection}/{name}")
    if current is None:
        client.request("POST", f"/{collection}", json={**wire, **extra})
        console.print(f"{kind}/{name} created")
        return
    changes = {k: v for k, v in wire.items() if current["spec"].get(k) != v}
    if not changes:
        console.print(f"{kind}/{name} unchanged")
        return
    client.request(
        "PATCH",
        f"/{collection}/{name}",
        json=changes,
        headers={"If-Match": str(current["resource_version"])},
    )
    console.print(f"{kind}/{name} configured")


def get(
    kind: Annotated[str, typer.Argument(help="tables | table | pools | pool")],
    name: Annotated[str | None, typer.Argument(help="Name (for `get table`, `get pool`).")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="table | yaml")] = "table",
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """List tables (`get tables`) or pools (`get pools`), or show one (`get table NAME`,
    `get pool NAME`)."""
    client = _client(admin_url, token, state_dir)
    if kind in POOL_KINDS:
        _get_pools(client, name, output)
        return
    if kind in TABLE_KINDS and name is None:
        items = _all_tables(client)
        if output == "yaml":
            typer.echo(yaml.safe_dump(items, sort_keys=False))
            return
        console.print(_tables_view(items))
        return
    if kind not in TABLE_KINDS or name is None:
        raise CliError(
            "usage: recstore get tables | recstore get table NAME | recstore get pools | "
            "recstore get pool NAME"
        )
    table = client.get(f"/tables/{name}")
    if output == "yaml":
        typer.echo(yaml.safe_dump(table, sort_keys=False))
        return
    console.print(_tables_view([table]))
    status = table.get("status") or {}
    shards = RichTable("SHARD", "ENDPOINT", "READY", box=None, pad_edge=False)
    for shard in status.get("shards") or []:
        shards.add_row(str(shard["index"]), shard["endpoint"], str(shard["ready"]).lower())
    console.print(shards)
    for condition in status.get("conditions") or []:
        console.print(
            f"{condition['type']}={condition['status']} ({condition.get('reason', '')}): "
            f"{condition.get('message', '')}"
        )
    _print_checkpoints(status)
    _print_caches(client.get(f"/tables/{name}/cache"))


def _get_pools(client: AdminClient, name: str | None, output: str) -> None:
    pools = _all(client, "pools") if name is None else [client.get(f"/pools/{name}")]
    if output == "yaml":
        typer.echo(yaml.safe_dump(pools if name is None else pools[0], sort_keys=False))
        return
    console.print(_pools_view(pools))
    if name is None:
        return
    status = pools[0].get("status") or {}
    tables = RichTable("TABLE", "PHASE", "SHARDS", "MEMORY/NODE", "PLACED", box=None,
                       pad_edge=False)  # fmt: skip
    for table in status.get("tables") or []:
        tables.add_row(
            table["name"], table.get("phase") or "Pending", str(table.get("shards") or "-"),
            _bytes(int(table.get("memoryBytes", 0))), str(table.get("placed", True)).lower(),
        )  # fmt: skip
    console.print(tables)
    for condition in status.get("conditions") or []:
        console.print(
            f"{condition['type']}={condition['status']} ({condition.get('reason', '')}): "
            f"{condition.get('message', '')}"
        )


def _pools_view(items: list[dict[str, Any]]) -> RichTable:
    view = RichTable("NAME", "PHASE", "READY", "TABLES", "RESERVED/REQUEST", "AGE", box=None,
                     pad_edge=False)  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc)
    for item in items:
        status = item.get("status") or {}
        memory = status.get("memory") or {}
        reserved = (
            f"{_bytes(int(memory['reservedBytes']))}/{_bytes(int(memory['requestBytes']))}"
            if memory else "-"
        )  # fmt: skip
        view.add_row(
            item["name"], item.get("phase") or "Pending",
            f"{status.get('readyShards') or 0}/{item['spec']['shards']}",
            str(len(item.get("tables") or [])), reserved, _age(now, item["created_at"]),
        )  # fmt: skip
    return view


def _print_checkpoints(status: dict[str, Any]) -> None:
    """The newest checkpoint every shard wrote, and the newest one asked for on demand."""
    last, asked = status.get("lastCheckpoint"), status.get("checkpointRequest")
    if last:
        console.print(f"last checkpoint: {last['id']} at {last.get('at') or '-'} "
                      f"({_rows(last)} rows)")  # fmt: skip
    if asked:
        why = f": {asked['message']}" if asked.get("message") else ""
        console.print(f"checkpoint request {asked.get('requestId')}: {asked['state']}{why}")


def _rows(checkpoint: dict[str, Any]) -> int:
    return sum(shard.get("rows") or 0 for shard in checkpoint.get("shards") or [])


CACHE_COLUMNS = ("HITS", "MISSES", "EVICTIONS", "HIT RATE", "ROWS", "BYTES/CAP")


def _cache_cells(figures: dict[str, Any]) -> list[str]:
    return [
        str(figures["hits"]), str(figures["misses"]), str(figures["evictions"]),
        f"{figures['hit_rate']:.4f}", str(figures["resident_rows"]),
        f"{figures['resident_bytes']}/{figures['capacity_bytes']}",  # used / allocated
    ]  # fmt: skip


def _print_caches(cache: dict[str, Any]) -> None:
    """The engine's GPU cache per shard and the clients' caches, each tier of each layer
    then each tier's total (``GET .../cache``)."""
    if cache["engine_total"] is not None:
        engine = RichTable("GPU CACHE", *CACHE_COLUMNS, box=None, pad_edge=False)
        for shard in cache["shards"]:
            if shard["engine"] is not None:
                engine.add_row(f"shard {shard['index']}", *_cache_cells(shard["engine"]))
        engine.add_row("total", *_cache_cells(cache["engine_total"]))
        console.print(engine)
    if cache["clients"]:
        clients = RichTable(
            "CLIENT CACHE", "TIER", "POLICY", *CACHE_COLUMNS, box=None, pad_edge=False
        )
        for c in cache["clients"]:
            clients.add_row(f"{c['client']}/{c['layer']}", c["tier"], c["policy"], *_cache_cells(c))
        for tier, figures in cache["clients_total"].items():
            clients.add_row("total", tier, "", *_cache_cells(figures))
        console.print(clients)
    for shard in cache["shards"]:
        if shard["error"]:
            console.print(f"shard {shard['index']} cache figures unavailable: {shard['error']}")


def delete(
    kind: Annotated[str, typer.Argument(help="table | pool")] = "table",
    name: Annotated[str | None, typer.Argument(help="Table or pool name.")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--filename")] = None,
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Delete a table or pool (`delete table NAME`, `delete pool NAME`, `delete -f FILE`): a
    table's rows go (its own nodes stop, or it is dropped from its pool's); a pool's nodes
    stop once no table is placed on it."""
    doomed: list[tuple[str, str, str]] = []  # (collection, kind, name): tables first
    if file is not None:
        manifests = read_manifests(file)
        doomed += [("tables", SINGULAR, m.spec.name) for m in manifests
                   if isinstance(m, Declaration)]  # fmt: skip
        doomed += [("pools", POOL_SINGULAR, m.name) for m in manifests
                   if isinstance(m, PoolDeclaration)]  # fmt: skip
    elif name is not None and kind in TABLE_KINDS:
        doomed = [("tables", SINGULAR, name)]
    elif name is not None and kind in POOL_KINDS:
        doomed = [("pools", POOL_SINGULAR, name)]
    else:
        raise CliError(
            "usage: recstore delete table NAME | recstore delete pool NAME | "
            "recstore delete -f FILE"
        )
    client = _client(admin_url, token, state_dir)
    for collection, singular, doomed_name in doomed:
        client.request("DELETE", f"/{collection}/{doomed_name}")
        console.print(f"{singular}/{doomed_name} deleted")


def checkpoint(
    name: Annotated[str, typer.Argument(help="Table name.")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for completion; 0: don't.")] = 300,
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Checkpoint every shard of a table and wait until the nodes report it written."""
    client = _client(admin_url, token, state_dir)
    record = client.request("POST", f"/tables/{name}/checkpoints").json()
    if wait <= 0:
        console.print(f"checkpoint {record['id']} of {name} requested")
        return
    deadline = time.monotonic() + wait
    with console.status(f"checkpointing {name} ..."):
        while record["state"] in WAITING:
            if time.monotonic() > deadline:
                raise CliError(f"checkpoint {record['id']} of {name} not done after {wait:g} s")
            time.sleep(0.2)
            items = client.get(f"/tables/{name}/checkpoints", params={"limit": 100})["items"]
            record = next(item for item in items if item["id"] == record["id"])
    result = (record.get("detail") or {}).get("result") or {}
    if record["state"] == CheckpointState.failed.value:
        raise CliError(f"checkpoint {record['id']} of {name} failed: {result.get('message')}")
    console.print(f"checkpoint {record['id']} of {name}: {record['state']} ({_rows(result)} rows)")


def wait(
    name: Annotated[str, typer.Argument(help="Table name.")],
    phase: Annotated[str, typer.Option("--for", help="Phase to wait for.")] = "Ready",
    timeout: Annotated[float, typer.Option(help="Seconds before giving up.")] = 120,
    admin_url: AdminUrl = DEFAULT_ADMIN_URL,
    token: Token = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Wait until a table reaches a phase (like `kubectl wait`)."""
    client = _client(admin_url, token, state_dir)
    deadline = time.monotonic() + timeout
    with console.status(f"waiting for {name} to be {phase} ..."):
        while (current := client.get(f"/tables/{name}")["status"].get("phase")) != phase:
            if time.monotonic() > deadline:
                raise CliError(
                    f"{name} is {current or 'Pending'}, not {phase}, after {timeout:g} s"
                )
            time.sleep(0.2)
    console.print(f"{SINGULAR}/{name} {phase}")


def _all_tables(client: AdminClient) -> list[dict[str, Any]]:
    return _all(client, "tables")


def _all(client: AdminClient, collection: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        page = client.get(f"/{collection}", params={"limit": 500, "offset": len(items)})
        items += page["items"]
        if not page["items"] or len(items) >= page["total"]:
            return items


def _tables_view(items: list[dict[str, Any]]) -> RichTable:
    view = RichTable(
        "NAME", "PHASE", "READY", "POOL", "DIM", "DTYPE", "ROWS", "MEMORY", "AGE", box=None,
        pad_edge=False,
    )  # fmt: skip
    now = dt.datetime.now(dt.timezone.utc)
    for item in items:
        spec, status = item["spec"], item.get("status") or {}
        shards = status.get("shards") or []
        ready = f"{sum(1 for s in shards if s.get('ready'))}/{spec['shards']}"
        view.add_row(
            item["name"],
            status.get("phase", "Pending"),
            ready,
            item.get("pool") or "-",
            str(spec["embeddingDim"]),
            spec["dtype"],
            str(item.get("rows", 0)),
            _bytes(int(item.get("memory_bytes", 0))),
            _age(now, item["created_at"]),
        )
    return view


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n}B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f}{unit}"


def _age(now: dt.datetime, created: str) -> str:
    stamp = dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    seconds = int((now - stamp).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def register(app: typer.Typer) -> None:
    for command in (apply, get, wait, delete, checkpoint):
        app.command()(_friendly(command))


def _friendly(command: Any) -> Any:
    """User mistakes end in one line on stderr and exit status 1, never a traceback."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except (CliError, InvalidArgument) as error:
            typer.secho(f"error: {error}", err=True, fg="red")
            raise typer.Exit(1) from None

    return run
