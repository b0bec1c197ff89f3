"""glibc malloc tuning: buffers of a step reused instead of faulted in afresh.

Each case runs in a child process: malloc's settings are the whole process's.
The churn is a step's worth of buffers (eight of 5 MiB and one of 13 MiB, all
alive at once, then freed), what a trainer's or a node's step allocates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from recstore.core import malloc_tuning

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)"
)

CHURN = """
import json, resource, sys

def step():
    buffers = [bytearray(5 << 20) for _ in range(8)] + [bytearray(13 << 20)]
    del buffers

def faults_per_step():
    for _ in range(2):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
"""
PAGES_PER_STEP = (8 * 5 + 13) * (1 << 20) // 4096


def _child(body: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.pop(malloc_tuning.ENV, None)
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", CHURN + body], env=environ, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_untuned_malloc_faults_a_steps_buffers_in_again() -> None:
    """The premise: glibc's defaults give the heap's top back, so every step faults."""
    got = _child("print(json.dumps({'faults': faults_per_step()}))")
    assert got["faults"] > PAGES_PER_STEP / 4  # type: ignore[operator]


def test_tuned_malloc_reuses_a_steps_buffers() -> None:
    got = _child(
        "from recstore.core import malloc_tuning\n"
        "ok = malloc_tuning.apply()\n"
        "print(json.dumps({'ok': ok, 'faults': faults_per_step()}))"
    )
    assert got["ok"] is True
    assert got["faults"] < PAGES_PER_STEP / 50  # type: ignore[operator]


SDK = """
from recstore.client import RecStoreClient
from recstore.core import malloc_tuning
client = RecStoreClient(role="malloc-check")
client.set_ps_endpoints(["127.0.0.1:9"])  # the gRPC backend; nothing is called
client.close()
print(json.dumps({'faults': faults_per_step()}))
"""


def test_the_sdks_grpc_backend_tunes_its_process() -> None:
    assert _child(SDK)["faults"] < PAGES_PER_STEP / 50  # type: ignore[operator]


MIGRATION_RUNNER = """
from recstore.core.reshard.protocol import ReshardRun
ReshardRun("t", [], store=None)  # nothing is called
print(json.dumps({'faults': faults_per_step()}))
"""


def test_a_reshard_runner_tunes_its_process() -> None:
    """Every page of a move passes through the runner's process as messages."""
    assert _child(MIGRATION_RUNNER)["faults"] < PAGES_PER_STEP / 50  # type: ignore[operator]
    off = _child(MIGRATION_RUNNER, **{malloc_tuning.ENV: "0"})
    assert off["faults"] > PAGES_PER_STEP / 4  # type: ignore[operator]


@pytest.mark.parametrize("off", ["0", "false", "No", " off "])
def test_the_environment_keeps_the_sdk_off_malloc(off: str) -> None:
    got = _child(SDK, **{malloc_tuning.ENV: off})
    assert got["faults"] > PAGES_PER_STEP / 4  # type: ignore[operator]


@pytest.mark.parametrize(
    ("value", "wanted"),
    [(None, True), ("", True), ("1", True), ("on", True), ("yes", True),
     ("0", False), ("false", False), ("FALSE", False), ("no", False), ("off", False)],
)  # fmt: skip
def test_wanted_reads_the_environment(value: str | None, wanted: bool) -> None:
    environ = {} if value is None else {malloc_tuning.ENV: value}
    assert malloc_tuning.wanted(environ) is wanted
