"""The bearer token: where it comes from, what makes it acceptable, and the route dependency that checks it.

The check is a FastAPI dependency attached to each guarded route, not a look at the request path, so it holds
however the app is mounted (``/dash``) or proxied (``root_path``).
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

TOKEN_ENV = "ELASTRAIN_DASHBOARD_TOKEN"  # noqa: S105 - the name of the variable, not a token
MIN_TOKEN_CHARS = 16
_MAKE_ONE = "e.g. `openssl rand -hex 32`"
# A token file is a few dozen bytes; reading a large file by mistake (a log, a key store) is refused early.
_MAX_FILE_BYTES = 4096


def check_token(token: object, source: str = "the token") -> str:
    """The token itself, or ``ValueError`` saying what is wrong with it and how to make a good one."""
    if not isinstance(token, str):
        raise ValueError(f"{source} must be a string, got {type(token).__name__}")
    if not token:
        raise ValueError(f"{source} is empty: give a token of at least {MIN_TOKEN_CHARS} characters ({_MAKE_ONE})")
    if not all("!" <= char <= "~" for char in token):
        raise ValueError(
            f"{source} holds a space, line break or non-ASCII character, which an HTTP header cannot carry as is: "
            f"use letters, digits and punctuation only ({_MAKE_ONE})"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{source} has {len(token)} characters; it needs at least {MIN_TOKEN_CHARS} ({_MAKE_ONE})")
    return token


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a file (one line; a final line break is ignored), or ``ValueError`` saying what to change."""
    shown = f"token file {os.fspath(path)!r}"
    file = Path(path)
    try:
        info = file.stat()
    except FileNotFoundError:
        raise ValueError(
            f"{shown} does not exist: write the token into it ({_MAKE_ONE} > FILE; chmod 600 FILE)"
        ) from None
    except OSError as error:
        raise ValueError(f"{shown} cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{shown} is not a regular file: give the path of the file that holds the token")
    if info.st_size > _MAX_FILE_BYTES:
        raise ValueError(f"{shown} has {info.st_size} bytes, too many for a token: is it the right file?")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{shown} cannot be read: {getattr(error, 'strerror', None) or error}") from None
    token = text.removesuffix("\n").removesuffix("\r")
    if not token.strip():
        raise ValueError(f"{shown} is empty: write the token into it ({_MAKE_ONE} > FILE)")
    if "\n" in token:
        raise ValueError(f"{shown} has more than one line: keep only the token in it")
    return check_token(token, shown)


def token_file_warning(path: str | os.PathLike[str]) -> str | None:
    """A warning when other users of this machine may read the token file (not refused: mounted secrets
    are often group-readable)."""
    mode = Path(path).stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return (
            f"token file {os.fspath(path)!r} is readable by other users (mode {stat.S_IMODE(mode):o}); "
            f"`chmod 600 {os.fspath(path)}` keeps it to you"
        )
    return None


# auto_error=False: a missing header reaches require_token, which answers 401 (HTTPBearer alone says 403).
_BEARER = HTTPBearer(auto_error=False, description="The dashboard's token: `Authorization: Bearer <token>`.")
UNAUTHORIZED = "Missing or wrong bearer token: send 'Authorization: Bearer <token>'."


def bearer_dependency(token: str) -> Callable[..., None]:
    """A dependency that lets a request through only with ``Authorization: Bearer <token>``."""
    expected = token.encode()

    def require_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        given = b"" if credentials is None else credentials.credentials.encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):  # constant time: the comparison does not leak a prefix
            raise HTTPException(401, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})

    return require_token
