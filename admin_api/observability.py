"""Request metrics for /metrics and catalogue gauges read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from recstore.admin.models import NodeRecord, TableRecord


class CatalogueCollector(Collector):
    """Tables per phase and ready nodes, counted when Prometheus scrapes."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tables = GaugeMetricFamily("recstore_admin_tables", "Tables by phase", labels=["phase"])
        nodes = GaugeMetricFamily("recstore_admin_nodes", "Registered nodes", labels=["ready"])
        try:
            with self._sessions() as session:
                for phase, count in session.execute(
                    select(TableRecord.phase, func.count()).group_by(TableRecord.phase)
                ):
                    tables.add_metric([phase], count)
                for ready, count in session.execute(
                    select(NodeRecord.ready, func.count()).group_by(NodeRecord.ready)
                ):
                    nodes.add_metric([str(bool(ready)).lower()], count)
        except Exception:  # a scrape must not fail because the database blinked
            return
        yield tables
        yield nodes


def install_metrics(
    app: FastAPI, registry: CollectorRegistry, sessions: sessionmaker[Session]
) -> None:
    requests = Counter(
        "recstore_admin_requests",
        "HTTP requests served",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        "recstore_admin_request_duration_seconds",
        "HTTP request latency",
        ["method", "route"],
        registry=registry,
    )
    registry.register(CatalogueCollector(sessions))

    @app.middleware("http")
    async def measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        # The route template (with its router prefix), not the raw path, keeps labels bounded.
        matched = request.scope.get("effective_route_context") or request.scope.get("route")
        label = getattr(matched, "path", None) or "unmatched"
        requests.labels(request.method, label, str(response.status_code)).inc()
        latency.labels(request.method, label).observe(time.perf_counter() - started)
        return response
