"""`recstore up`'s options that are checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from recstore.cli import app


@pytest.mark.parametrize("rate", ["-5", "inf", "nan", "fast"])
def test_a_wrong_copy_rate_is_refused_before_the_platform_starts(tmp_path: Path, rate: str) -> None:
    state = tmp_path / "state"
    result = CliRunner().invoke(
        app, ["up", "--state-dir", str(state), "--port", "0", "--reshard-copy-rate", rate]
    )
    assert result.exit_code == 2, result.output
    assert "--reshard-copy-rate" in result.output
    assert not state.exists()  # nothing was started or written


def test_the_copy_rate_is_also_read_from_the_environment(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = CliRunner().invoke(
        app, ["up", "--state-dir", str(state), "--port", "0"],
        env={"RECSTORE_RESHARD_COPY_RATE": "-1"},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "RECSTORE_RESHARD_COPY_RATE" in result.output and not state.exists()
