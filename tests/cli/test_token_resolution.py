"""Where the CLI finds a token: the option, then the environment, then `recstore up`'s file."""

from __future__ import annotations

from pathlib import Path

import pytest

from recstore.cli.api_client import resolve_ps_token, resolve_token
from recstore.local.state_dir import ADMIN_TOKEN_FILE, PS_TOKEN_FILE


@pytest.mark.parametrize(
    ("option", "env", "files", "admin", "ps"),
    [
        ("opt", {}, {}, "opt", "opt"),
        (None, {"RECSTORE_TOKEN": "a-env", "RECSTORE_PS_TOKEN": "p-env"}, {}, "a-env", "p-env"),
        (None, {}, {ADMIN_TOKEN_FILE: "a-file\n", PS_TOKEN_FILE: "p-file\n"}, "a-file", "p-file"),
        (None, {"RECSTORE_PS_TOKEN": "p-env"}, {PS_TOKEN_FILE: "p-file"}, None, "p-env"),
        (None, {}, {}, None, None),
    ],
)
def test_a_token_comes_from_the_option_the_environment_or_the_state_dir(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    option: str | None,
    env: dict[str, str],
    files: dict[str, str],
    admin: str | None,
    ps: str | None,
) -> None:
    for name in ("RECSTORE_TOKEN", "RECSTORE_PS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert resolve_token(option, tmp_path) == admin
    assert resolve_ps_token(option, tmp_path) == ps
