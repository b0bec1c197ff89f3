"""The node's bearer-token check and token file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recstore.ps.serve.auth import is_authorized, read_token_file


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ((("authorization", "Bearer s3cret"),), True),
        ((("authorization", "bearer s3cret"),), True),
        ((("authorization", "Bearer wrong"),), False),
        ((("authorization", "s3cret"),), False),
        ((("authorization", "Basic s3cret"),), False),
        ((("x-other", "Bearer s3cret"),), False),
        ((("authorization", "Bearer s3crét"),), False),  # non-ASCII: refused, not an error
        ((), False),
        (None, False),
    ],
)
def test_bearer_token(metadata: Any, ok: bool) -> None:
    assert is_authorized(metadata, "s3cret") is ok


def test_token_file(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("abc\n")
    assert read_token_file(tmp_path / "t") == "abc"
    (tmp_path / "e").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token_file(tmp_path / "e")
