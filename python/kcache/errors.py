"""errors: the C library's kc_err codes as Python exceptions.

Every exception carries the C error's number (`code`), its symbol name
(`name`, "KC_NOT_FOUND"), its wire code (`wire`, "not_found") and the
sentence libkcache wrote (`message`). A few codes have their own subclass so
that callers can catch what they act on (absent, unreachable, refused).
"""

from __future__ import annotations

from typing import Dict, Type


class Error(Exception):
    """A libkcache call failed. str(e) is "<KC_NAME>: <message>"."""

    code: int
    name: str
    wire: str
    message: str

    def __init__(self, code: int, name: str, wire: str, message: str):
        super().__init__("%s: %s" % (name, message))
        self.code = code
        self.name = name
        self.wire = wire
        self.message = message


class NotFound(Error):
    """KC_NOT_FOUND: no such bundle, blob or file."""


class Unavailable(Error):
    """KC_UNAVAILABLE: kcached cannot be reached."""


class Timeout(Error):
    """KC_TIMEOUT or KC_DEADLINE: a request or a warmup ran out of time."""


class Unauthorized(Error):
    """KC_UNAUTHORIZED: a missing or invalid token."""


class Forbidden(Error):
    """KC_FORBIDDEN: the token lacks the role (a read token uploading), or a
    cache directory others may write."""


class Conflict(Error):
    """KC_CONFLICT or KC_LEASED: a different bundle holds the key, or another
    builder holds the lease."""


class Corrupt(Error):
    """KC_CORRUPT, KC_DIGEST_MISMATCH, KC_KEY_MISMATCH: bytes failed their
    verification and were not used."""


class InvalidArgument(Error):
    """KC_EINVAL, KC_BAD_KEY, KC_BAD_MANIFEST, KC_BAD_WARMUP, KC_BAD_JSON,
    KC_UNSAFE_PATH: bad input, refused before anything was done."""


_BY_NAME: Dict[str, Type[Error]] = {
    "KC_NOT_FOUND": NotFound,
    "KC_UNAVAILABLE": Unavailable,
    "KC_TIMEOUT": Timeout,
    "KC_DEADLINE": Timeout,
    "KC_UNAUTHORIZED": Unauthorized,
    "KC_FORBIDDEN": Forbidden,
    "KC_CONFLICT": Conflict,
    "KC_LEASED": Conflict,
    "KC_CORRUPT": Corrupt,
    "KC_DIGEST_MISMATCH": Corrupt,
    "KC_KEY_MISMATCH": Corrupt,
    "KC_EINVAL": InvalidArgument,
    "KC_BAD_KEY": InvalidArgument,
    "KC_BAD_MANIFEST": InvalidArgument,
    "KC_BAD_WARMUP": InvalidArgument,
    "KC_BAD_JSON": InvalidArgument,
    "KC_UNSAFE_PATH": InvalidArgument,
}


def make_error(code: int, message: str = "") -> Error:
    """The exception for a kc_err code; message defaults to kc_strerror."""
    from . import _lib

    name = _lib.lib.kc_err_name(code).decode()
    wire = _lib.lib.kc_err_code(code).decode()
    if not message:
        message = _lib.lib.kc_strerror(code).decode()
    return _BY_NAME.get(name, Error)(code, name, wire, message)


def check(code: int, err) -> None:
    """Raises the exception for code unless it is KC_OK (0)."""
    if code != 0:
        text = err.value.decode("utf-8", "replace") if err is not None else ""
        raise make_error(code, text)
