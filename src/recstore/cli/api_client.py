"""The CLI's admin API client: where the platform is, who we are, and clean errors.

Every table command talks to the admin API (the platform `recstore up` starts,
or a cluster's). Failures become one-line `CliError`s — the command layer
prints them without a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from recstore.core.tls import ClientTls, TlsConfigError, http_verify
from recstore.local.state_dir import ADMIN_TOKEN_FILE, PS_TOKEN_FILE

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def resolve_token(
    token: str | None, state_dir: Path, *, env: str = "RECSTORE_TOKEN", file: str = ADMIN_TOKEN_FILE
) -> str | None:
    """--token, else $RECSTORE_TOKEN, else the token `recstore up` wrote in its state dir
    (``env`` and ``file`` name another token's: ``resolve_ps_token``)."""
    if token:
        return token
    if value := os.environ.get(env):
        return value
    path = state_dir / file
    return path.read_text().strip() if path.exists() else None


def resolve_ps_token(token: str | None, state_dir: Path) -> str | None:
    """The PS nodes' write token: --ps-token, $RECSTORE_PS_TOKEN, or `recstore up`'s file."""
    return resolve_token(token, state_dir, env="RECSTORE_PS_TOKEN", file=PS_TOKEN_FILE)


def resolve_tls(url: str, state_dir: Path) -> ClientTls | None:
    """$RECSTORE_TLS_*, else for an https URL the CA `recstore up --tls` keeps in its state dir."""
    try:
        tls = ClientTls.from_environment()
    except TlsConfigError as error:
        raise CliError(str(error)) from None
    local_ca = state_dir / "tls" / "ca.pem"
    if tls is None and url.startswith("https://") and local_ca.exists():
        tls = ClientTls(local_ca)
    return tls


class AdminClient:
    """An https URL is verified with ``tls``'s CA (default: ``RECSTORE_TLS_*``)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        tls: ClientTls | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if tls is None:
            try:
                tls = ClientTls.from_environment()
            except TlsConfigError as error:
                raise CliError(str(error)) from None
        verify = http_verify(tls)
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, verify=verify
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            reply = self._http.request(method, f"/api/v1{path}", **kwargs)
        except httpx.TransportError as error:
            raise CliError(
                f"cannot reach the admin API at {self.url} ({error}); is `recstore up` running?"
            ) from error
        if reply.status_code >= 400:
            raise CliError(
                f"{method} {path}: {reply.status_code} {_reason(reply)}", reply.status_code
            )
        return reply

    def get_or_none(self, path: str) -> Any:
        """GET a resource; None when it does not exist (404)."""
        try:
            return self.get(path)
        except CliError as error:
            if error.status == 404:
                return None
            raise

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    def close(self) -> None:
        self._http.close()


def _reason(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text.strip()[:300]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI validation errors
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', [])[1:])}: {item.get('msg')}"
            for item in detail
            if isinstance(item, dict)
        )
    return str(detail)
