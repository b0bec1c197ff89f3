"""`make demo` in compact form: the very script, fewer training steps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_demo_script_trains_checkpoints_and_stops(tmp_path: Path) -> None:
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/demo.sh")],
        env={**os.environ, "PY": sys.executable, "DEMO_STEPS": "60", "DEMO_STATE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "embeddingtable/demo-clicks created" in out
    assert "embeddingtable/demo-clicks Ready" in out
    loss = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+) over 60 steps", out)
    assert loss is not None, out[-3000:]
    assert float(loss.group(2)) < float(loss.group(1))
    assert re.search(r"checkpoint \d+ of demo-clicks: Completed \((\d+) rows\)", out)
    assert "stopping the platform" in out
    # Both nodes hold checkpoints on disk (the requested one, then the final one).
    shards = sorted((tmp_path / "tables" / "demo-clicks").glob("shard-*/checkpoints"))
    assert len(shards) == 2 and all(any(s.iterdir()) for s in shards)
