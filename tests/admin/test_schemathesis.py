"""Property-based run over the OpenAPI schema: generated requests never cause a server error.

A 5xx the operation documents (discovery's 503 while a shard has no endpoint) is an answer,
not a crash; any other 5xx fails the run.
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok

#: Examples per operation: enough to hit every validator, small enough for ~1 minute on 2 cores.
MAX_EXAMPLES = 25
#: Routes only the provisioner identity may call: fuzzed with its token, the rest as admin.
PROVISIONER_ROUTES = {
    ("POST", "/api/v1/nodes"),
    ("POST", "/api/v1/nodes/{node_id}/heartbeat"),
    ("PUT", "/api/v1/tables/{name}/status"),
    ("POST", "/api/v1/tables/{name}/resharding-events"),
}


@pytest.mark.slow
def test_no_server_errors(
    app: FastAPI, admin_headers: dict[str, str], provisioner_headers: dict[str, str]
) -> None:
    with TestClient(app) as client:  # seed a table and a node so some paths find a resource
        spec = {"name": "seed", "numEmbeddings": 10, "embeddingDim": 4, "shards": 2}
        assert client.post("/api/v1/tables", json=spec, headers=admin_headers).status_code == 201
        node = {"table": "seed", "shard_index": 0, "endpoint": "127.0.0.1:5000"}
        r = client.post("/api/v1/nodes", json=node, headers=provisioner_headers)
        assert r.status_code == 201

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the OpenAPI schema has an invalid operation: {result!r}"
        operation = result.ok()

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def exercise(case: schemathesis.Case) -> None:
            nonlocal calls
            route = (case.operation.method.upper(), case.operation.path)
            headers = provisioner_headers if route in PROVISIONER_ROUTES else admin_headers
            response = case.call(headers=headers)
            calls += 1
            documented = str(response.status_code) in case.operation.definition.raw["responses"]
            if response.status_code >= 500 and not documented:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: "
                    f"{response.text[:200]} (body {case.body!r:.200})"
                )

        exercise()
    assert not failures, "\n".join(failures[:20])
    print(f"schemathesis: {calls} calls")
    assert calls >= MAX_EXAMPLES  # the run really exercised the API
