"""A resource's declaration, checked: the table and placement to run, or why nothing may run.

The reconciler and the reshard control both act on it; it lives apart so that
neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recstore.core.errors import InvalidArgument
from recstore.core.reconcile import Declaration, PoolPlacing, parse_declaration
from recstore.operator import render
from recstore.operator.config import OperatorConfig
from recstore.operator.render import Owner


@dataclass
class Validated:
    declaration: Declaration | None
    problem: str | None
    #: a table on a pool: where it stands there
    placing: PoolPlacing | None = None
    #: whose StatefulSet runs the table's shards: its pool's (None: the table's own)
    fleet: Owner | None = None

    def runs_on(self, owner: Owner) -> Owner:
        """The owner of the StatefulSet and pods that hold the table."""
        return self.fleet or owner

    @property
    def held(self) -> bool:
        """Whether nothing may be created for it on its pool (waiting, or too large)."""
        p = self.placing
        return p is not None and (p.waiting is not None or p.capacity is not None)


def validate(
    owner: Owner, spec: Mapping[str, Any], config: OperatorConfig | None = None
) -> Validated:
    """The declaration, or why nothing may run for it (``config``: its image allow-list)."""
    problem = render.name_problem(owner.name)
    try:
        declaration = parse_declaration(spec, default_name=owner.name)
    except InvalidArgument as exc:
        return Validated(None, "; ".join(filter(None, [problem, str(exc)])))
    if config is not None and declaration.pool is None:
        image = config.image_problem(declaration.placement.image)
        problem = "; ".join(filter(None, [problem, image])) or None
    return Validated(declaration if problem is None else None, problem)
