"""Entry module for ``kopf run -m recstore.operator.main``: handlers in kopf's default registry.

``recstore operator`` is the supported way to start the operator; this module
exists so the plain kopf CLI runs the same handlers, configured from the
environment.
"""

from __future__ import annotations

import kopf

from recstore.operator.handlers import register

register(kopf.get_default_registry())
