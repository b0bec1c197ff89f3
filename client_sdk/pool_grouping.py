"""One ``emb_pool_many`` call for the bags of a compiled forward that can share it.

A model holding one ``recstore.nn.EmbeddingBag`` per feature (DLRM) traces one
``emb_pool_many`` per bag, and each call's backward is one
``emb_update_pooled_many``: 16 op calls a step for 8 bags. Every op call
crosses the dispatcher (its list arguments converted to C++ and back into
Python), which costs more than the engine's work for a small batch. This
inductor graph pass, run on the graph dynamo captured (before autograd is
traced), merges each run of pool calls that nothing separates into one call
over all their tables, so that forward and backward each make one call,
as an ``EmbeddingBagCollection`` does. Results do not change: the op pools
each table's bags on its own, whichever call carries them.

A run ends at anything the merged call must not be moved across: a use of
a member's rows, another RecStore op (``max_norm`` renormalisation writes
rows), a change of grad mode or autocast, a module call. The merged call
takes the place of the run's last member, so every input is defined by
then. Registered as ``torch._inductor.config.pre_grad_custom_pass`` when
``recstore.client`` is imported and no other pass is set there (a model with
passes of its own lists ``POOL_GROUPING`` with them).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

#: ``emb_pool_many``'s list arguments after ``anchor``, in schema order
_LISTS = range(1, 7)
#: calls that change what a later call sees: a pool call never moves across them
_STATE_CHANGES = {
    torch._C._set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast,
    torch.amp.autocast_mode._exit_autocast,
}


def _pool_targets() -> set[Any]:
    packet = torch.ops.recstore.emb_pool_many
    return {packet, packet.default}


def _is_pool(node: torch.fx.Node, targets: set[Any]) -> bool:
    return (
        node.op == "call_function"
        and node.target in targets
        and not node.kwargs
        and len(node.args) == 7
        and all(u.op == "call_function" and u.target is operator.getitem for u in node.users)
    )


def _is_barrier(node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if target in _STATE_CHANGES or isinstance(target, torch._ops.HigherOrderOperator):
        return True
    namespace = getattr(target, "namespace", None) or getattr(
        getattr(target, "_overloadpacket", None), "namespace", None
    )
    return namespace == "recstore"


def _runs(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    """Runs of pool calls with nothing between them that a merged call may not cross."""
    targets = _pool_targets()
    runs: list[list[torch.fx.Node]] = []
    run: list[torch.fx.Node] = []
    rows: set[torch.fx.Node] = set()  # the run's calls and their getitems

    def close() -> None:
        nonlocal run
        if len(run) > 1:
            runs.append(run)
        run = []
        rows.clear()

    for node in graph.nodes:
        if node in rows:
            continue  # a getitem of a member
        uses_rows = any(arg in rows for arg in node.all_input_nodes)
        if _is_pool(node, targets):
            if uses_rows:
                close()
            run.append(node)
            rows.add(node)
            rows.update(node.users)
        elif uses_rows or _is_barrier(node):
            close()
    close()
    return runs


def _merge(graph: torch.fx.Graph, run: list[torch.fx.Node]) -> None:
    trainable = [any(member.args[6]) for member in run]  # type: ignore[arg-type]
    anchor = run[trainable.index(True) if True in trainable else 0].args[0]
    lists: list[list[Any]] = [[] for _ in _LISTS]
    for member in run:
        for merged, position in zip(lists, _LISTS, strict=True):
            merged.extend(member.args[position])  # type: ignore[arg-type]
    with graph.inserting_before(run[-1]):
        call = graph.call_function(run[0].target, (anchor, *lists))  # type: ignore[arg-type]
        for key in ("example_value", "val"):  # dynamo's and export's fake results
            values: list[Any] = [m.meta.get(key) for m in run]
            if all(isinstance(v, list | tuple) for v in values):
                call.meta[key] = [row for value in values for row in value]
        base = 0
        for member in run:
            for item in list(member.users):
                index: Any = item.args[1]
                assert isinstance(index, int)
                replacement = graph.call_function(operator.getitem, (call, base + index))
                replacement.meta = dict(item.meta)
                item.replace_all_uses_with(replacement)
                graph.erase_node(item)
            base += len(member.args[1])  # type: ignore[arg-type]
    for member in run:
        graph.erase_node(member)


def group_pool_calls(graph: torch.fx.Graph) -> None:
    """Merge each run of ``emb_pool_many`` calls of ``graph`` into one call."""
    for run in _runs(graph):
        _merge(graph, run)


class PoolGrouping(CustomGraphPass):
    """``group_pool_calls`` as an inductor pass (its uuid lets inductor cache graphs)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        group_pool_calls(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


POOL_GROUPING = PoolGrouping()


def register() -> None:
    """Run ``POOL_GROUPING`` in inductor's pre-grad passes unless a pass is set already."""
    config = torch._inductor.config
    if config.pre_grad_custom_pass is None:
        config.pre_grad_custom_pass = POOL_GROUPING
