"""`recstore up` keeps its state dir to its owner: a new one is private, an open one tightened."""

from __future__ import annotations

import logging
import sqlite3
import stat
from pathlib import Path

import pytest

from recstore.local.platform import LocalPlatform
from recstore.local.state_dir import InsecureStateDir, secure_state_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _open_state_dir(state: Path) -> None:
    """A state dir as a hand-made ``mkdir`` and an older version left it: others may read."""
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # whatever the umask
    with sqlite3.connect(state / "admin.db") as db:
        db.execute("CREATE TABLE kept (value TEXT)")
        db.execute("INSERT INTO kept VALUES ('catalogue rows')")
    (state / "admin.db").chmod(0o644)


def test_a_new_state_dir_and_its_catalogue_are_its_owners_alone(tmp_path: Path) -> None:
    catalogue = secure_state_dir(tmp_path / "new" / "state")
    assert _mode(tmp_path / "new" / "state") == 0o700
    assert catalogue == tmp_path / "new" / "state" / "admin.db"
    assert _mode(catalogue) == 0o600 and catalogue.stat().st_size == 0


def test_an_open_state_dir_is_tightened_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    _open_state_dir(state)
    (state / "admin.db-wal").write_bytes(b"")
    (state / "admin.db-wal").chmod(0o664)
    with caplog.at_level(logging.WARNING, logger="recstore.local.state_dir"):
        secure_state_dir(state)
    assert (_mode(state), _mode(state / "admin.db"), _mode(state / "admin.db-wal")) == (
        0o700, 0o600, 0o600,
    )  # fmt: skip
    said = caplog.text
    assert f"{state} was open to other users (mode 0755): now 0700" in said
    assert f"{state / 'admin.db'} was open to other users (mode 0644): now 0600" in said
    with sqlite3.connect(state / "admin.db") as db:  # the catalogue is kept as it was
        assert db.execute("SELECT value FROM kept").fetchall() == [("catalogue rows",)]
    caplog.clear()
    secure_state_dir(state)  # private already: nothing to say
    assert not caplog.text


def test_a_state_dir_that_cannot_be_tightened_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    _open_state_dir(state)

    def not_yours(path: Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(Path, "chmod", not_yours)
    with pytest.raises(InsecureStateDir, match=r"mode 0755\) and cannot be made private"):
        secure_state_dir(state)


def test_recstore_up_on_an_open_state_dir_tightens_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    first = LocalPlatform(state, port=0)  # a first run: the catalogue, as SQLite makes it
    first.start()
    first.stop()
    state.chmod(0o755)
    (state / "admin.db").chmod(0o644)
    platform = LocalPlatform(state, port=0)
    platform.start()
    platform.stop()
    assert (_mode(state), _mode(state / "admin.db")) == (0o700, 0o600)
    for name in ("admin-token", "provisioner-token", "ps-token", "ps-read-only-token"):
        assert _mode(state / name) == 0o600
