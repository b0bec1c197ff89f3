"""The state directory of ``recstore up``: its secrets, and that only its owner reads any of it.

Everything the local platform keeps lives under one directory (docs/local.md,
"State"): the catalogue, the nodes' data and logs, and four tokens. Other local
users must read none of it. A new directory is made 0700; an existing one that
others may enter (made by hand, or by an older version) is tightened to its
owner alone, and so is the catalogue, with a warning saying what changed. A
token file is created 0600 once and reused; one that others can read is refused,
not tightened: whoever read it holds its rights, so it has to be replaced.

The CLI reads the admin token from here (``ADMIN_TOKEN_FILE``); trainers are
given the PS token (``PS_TOKEN_FILE``) and serving processes the read-only one.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path.home() / ".recstore"
#: the admin API's bootstrap admin token: the user's, the CLI's and the dashboard's
ADMIN_TOKEN_FILE = "admin-token"
#: the local provisioner's identity: the only one that registers nodes and writes status
PROVISIONER_TOKEN_FILE = "provisioner-token"
#: the token every PS node requires (trainers send it: RECSTORE_PS_TOKEN)
PS_TOKEN_FILE = "ps-token"
#: the token the nodes of inference tables also accept, for reads only
PS_READ_ONLY_TOKEN_FILE = "ps-read-only-token"
#: the catalogue (SQLite) and the files SQLite keeps beside it
CATALOGUE_FILE = "admin.db"
_CATALOGUE_FILES = (CATALOGUE_FILE, *(CATALOGUE_FILE + s for s in ("-wal", "-shm", "-journal")))
#: permission bits other users hold
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


class InsecureStateDir(RuntimeError):
    """Part of the state dir can be read by other users and cannot be made private."""


def secure_state_dir(state_dir: Path) -> Path:
    """Create ``state_dir`` (0700) or make an existing one, and its catalogue, its owner's alone.

    The catalogue is created empty at 0600 (SQLite takes an empty file as an empty
    database and gives the files it adds beside it the same mode). Returns the
    catalogue's path.
    """
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _owner_only(state_dir)
    catalogue = state_dir / CATALOGUE_FILE
    os.close(os.open(catalogue, os.O_WRONLY | os.O_CREAT, 0o600))
    for name in _CATALOGUE_FILES:
        if (state_dir / name).exists():
            _owner_only(state_dir / name)
    return catalogue


def _owner_only(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & _OTHERS:
        return
    try:
        path.chmod(mode & ~_OTHERS)
    except OSError as error:
        raise InsecureStateDir(
            f"{path} is readable by other users (mode {mode:04o}) and cannot be made private "
            f"({error.strerror}): use a state dir of your own (--state-dir)"
        ) from None
    log.warning(
        "%s was open to other users (mode %04o): now %04o, its owner's alone",
        path, mode, mode & ~_OTHERS,
    )  # fmt: skip


def ensure_token(state_dir: Path, name: str = ADMIN_TOKEN_FILE) -> str:
    """The token in ``state_dir/name``: created once, readable by its owner only.

    A token file others can read is refused: anyone who read it holds its rights.
    """
    path = state_dir / name
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InsecureStateDir(
            f"token file {path} is readable by other users (mode {mode:04o}); it grants "
            f"{name.removesuffix('-token')} rights: run `chmod 600 {path}` (or remove it "
            "for a new token), then start again"
        )
    return path.read_text().strip()
