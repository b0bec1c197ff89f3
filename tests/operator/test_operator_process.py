"""Smoke test: the operator as a separate process (``kopf run`` and ``recstore operator``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import ET, NS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BIN = Path(sys.executable).parent
COMMANDS = {
    "kopf-run": [str(BIN / "kopf"), "run", "-m", "recstore.operator.main", "--standalone", "-A"],
    "recstore-operator": [str(BIN / "recstore"), "operator", "--standalone", "-A"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
async def test_operator_process_reconciles_a_table(
    command: str, api_server: object, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    env = {**os.environ, "RECSTORE_PS_IMAGE": "smoke/ps:1", "RECSTORE_STATUS_INTERVAL": "0.5"}
    log = (tmp_path / "operator.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *COMMANDS[command], env=env, stdout=log, stderr=asyncio.subprocess.STDOUT
    )
    try:
        cr = {
            "apiVersion": "recstore.io/v1alpha1",
            "kind": "EmbeddingTable",
            "metadata": {"name": "smoke", "namespace": NS},
            "spec": {"numEmbeddings": 10, "embeddingDim": 4},
        }
        (await api.post(ET, json=cr)).raise_for_status()
        sts_url = f"/apis/apps/v1/namespaces/{NS}/statefulsets/smoke-ps"

        async def statefulset() -> dict | None:
            response = await api.get(sts_url)
            return response.json() if response.status_code == 200 else None

        sts = await wait_for(statefulset, timeout=60, what="the operator process's StatefulSet")
        image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "smoke/ps:1"

        async def phase() -> str | None:
            return ((await api.get(f"{ET}/smoke")).json().get("status") or {}).get("phase")

        assert await wait_for(phase, timeout=30, what="a status phase") in (
            "Pending",
            "Provisioning",
        )
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "operator.log").read_text()[-3000:]
