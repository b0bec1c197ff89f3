"""A bounded soak of the local platform: concurrent clients, no errors, flat memory.

The full figure (32 clients x 60 s) comes from `python bench/soak.py`; CI runs a
shorter one so a leak or a concurrency failure still shows up on every change.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_mixed_soak_has_no_errors_and_flat_memory(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("recstore_soak", ROOT / "bench/soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = soak  # dataclasses look their module up there
    spec.loader.exec_module(soak)
    result = soak.main(
        ["--clients", "8", "--seconds", "8", "--rows", "50000", "--dim", "32",
         "--out", str(tmp_path / "soak.json")]
    )  # fmt: skip
    assert result["errors"] == 0, result["first_errors"]
    assert result["node_restarts"] == [0, 0]
    assert int(result["requests"]) > 100
    assert abs(float(result["rss_drift"])) < 0.05, result
