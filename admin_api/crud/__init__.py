"""Catalogue operations, one module per resource (as the routes are): keyword-only functions
over a Session, each mutation writing its audit event through ``audit``.

Operations flush but do not commit (see ``writes``): the route calls ``commit``
once the provisioner has accepted the change. The names below are the API the
routes use, as ``crud.<name>``.
"""

from __future__ import annotations

from recstore.admin.crud.checkpoints import list_checkpoints, recent_checkpoints, request_checkpoint
from recstore.admin.crud.events import list_events
from recstore.admin.crud.nodes import (
    delete_node,
    forget_removed_nodes,
    get_node,
    heartbeat,
    list_nodes,
    register_node,
)
from recstore.admin.crud.pools import (
    create_pool,
    delete_pool,
    find_pool,
    get_pool,
    held_spec,
    list_pools,
    patch_pool,
    placed_spec,
    set_pool_status,
    tables_on,
)
from recstore.admin.crud.tables import (
    create_table,
    delete_table,
    get_table,
    list_tables,
    patch_table,
    record_recovery,
    record_reshard,
    set_status,
)
from recstore.admin.crud.tokens import active_token, create_token, list_tokens, revoke_token
from recstore.admin.crud.writes import against_newest, commit

__all__ = [
    "active_token",
    "against_newest",
    "commit",
    "create_pool",
    "create_table",
    "create_token",
    "delete_node",
    "delete_pool",
    "delete_table",
    "find_pool",
    "forget_removed_nodes",
    "get_node",
    "get_pool",
    "get_table",
    "heartbeat",
    "held_spec",
    "list_checkpoints",
    "list_events",
    "list_nodes",
    "list_pools",
    "list_tables",
    "list_tokens",
    "patch_pool",
    "patch_table",
    "placed_spec",
    "recent_checkpoints",
    "record_recovery",
    "record_reshard",
    "register_node",
    "request_checkpoint",
    "revoke_token",
    "set_pool_status",
    "set_status",
    "tables_on",
]
