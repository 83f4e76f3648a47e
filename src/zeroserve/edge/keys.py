"""API keys: where a request's credential is, and which configured key it is.

Strategy
--------
A credential is taken from ``Authorization: Bearer KEY`` (the openai SDK),
``api-key: KEY`` (Azure style) or ``x-api-key: KEY``, in that order. It is compared with
every configured key by ``hmac.compare_digest`` and the loop never stops early, so the
time taken says nothing about which key matched or how much of a guess was right.

Invariants: a key's secret appears only in ``ApiKey.secret``; ``repr``, error messages,
logs and metric labels use its *name* (docs/architecture.md, "The edge").
"""

from __future__ import annotations

import hmac
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl

from ..errors import Unauthorized

# A credential longer than this is refused without being compared. OpenAI keys are about
# 170 characters; 512 leaves room for JWT-like tokens while bounding the comparison work.
MAX_CREDENTIAL_BYTES: Final = 512
# Query parameters that carry a key in other servers' URLs (Google's ``key``, the
# ``api_key`` / ``access_token`` of many REST APIs). URLs end up in proxy and browser
# logs, so a key there is refused rather than accepted.
QUERY_KEY_PARAMS = frozenset({"api_key", "api-key", "apikey", "key", "access_token", "token"})
# ``Final``: every request reads these, and the compiled build then reads them as C
# constants and statics, not by a lookup in this module's dict (docs/decisions/
# 0008-types-decide-the-calls.md); the same for the comparison function, otherwise an
# attribute lookup on the ``hmac`` module per key per request.
_BEARER: Final = b"bearer "
_BEARER_LEN: Final = len(_BEARER)
# The SDKs' exact form, compared whole with each key's ("Bearer KEY"); a longer value
# cannot be one of them and is left to ``parse_credential``, which bounds it.
_SDK_BEARER: Final = b"Bearer "
_MAX_BEARER_BYTES: Final = len(_SDK_BEARER) + MAX_CREDENTIAL_BYTES
_compare_digest: Final = hmac.compare_digest
# What a 401 says: what was wrong and how to send a key, never what was sent.
HOW_TO_SEND: Final = (
    "'Authorization: Bearer <key>' (what the openai SDK's api_key sends), "
    "or an api-key or x-api-key header"
)
NO_KEY: Final = "an API key is required: send it as " + HOW_TO_SEND
UNKNOWN_KEY: Final = "invalid API key: this server has no such key; send one of its keys as " + (
    HOW_TO_SEND
)
MALFORMED_BEARER: Final = (
    "the Authorization header must be 'Bearer <key>' (the openai SDK's api_key sends it so)"
)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's quotas; ``None`` means unlimited."""

    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def limited(self) -> bool:
        return (
            self.max_concurrent is not None
            or self.requests_per_minute is not None
            or self.tokens_per_minute is not None
        )


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key. ``name`` labels metrics and logs; ``secret`` never leaves.
    ``priority`` is the class of its requests that ask for none, ``priority_min`` the
    highest class (lowest number) they may ask for (docs/architecture.md, "Priority
    classes"); ``None``: the server's default class, no cap."""

    name: str
    secret: bytes = field(repr=False)
    limits: KeyLimits = field(default_factory=KeyLimits)
    priority: int | None = None
    priority_min: int | None = None
    # May call the model control routes (load, unload, rescan): ``admin = true`` in the
    # keys file (docs/architecture.md, "Models at run time").
    admin: bool = False

    def __repr__(self) -> str:
        return (
            f"ApiKey(name={self.name!r}, limits={self.limits!r}, priority={self.priority!r}, "
            f"priority_min={self.priority_min!r}, admin={self.admin!r})"
        )


class KeyRing:
    """The configured keys. ``find`` returns which key a request's credential headers
    present, or raises ``Unauthorized`` (401); ``Edge.admit`` calls it."""

    __slots__ = ("_bearers", "_keys")

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        names = [k.name for k in keys]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"API key names must be unique: {', '.join(dupes)}")
        secrets = [k.secret for k in keys]
        if len(set(secrets)) != len(secrets):
            raise ValueError("two API keys have the same secret")
        for key in keys:
            if not key.secret or len(key.secret) > MAX_CREDENTIAL_BYTES:
                raise ValueError(
                    f"API key {key.name!r} must be 1 to {MAX_CREDENTIAL_BYTES} bytes long"
                )
            # What a header can carry as one token: a space or a control byte could never
            # be presented as sent (parsers strip a value's edges), and "Bearer KEY" is
            # compared whole below.
            if not all(0x21 <= b <= 0x7E for b in key.secret):
                raise ValueError(
                    f"API key {key.name!r} must be visible ASCII, without spaces or control "
                    "characters"
                )
        self._keys = tuple(keys)
        # Each key as the whole Authorization value the SDKs send ("Bearer KEY"):
        # comparing a request's value with these whole takes no parsing and no slice.
        self._bearers = tuple(_SDK_BEARER + k.secret for k in keys)

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The keys, in the order ``find`` numbers them."""
        return self._keys

    @property
    def names(self) -> list[str]:
        return [k.name for k in self._keys]

    def key(self, name: str) -> ApiKey:
        for k in self._keys:
            if k.name == name:
                return k
        raise KeyError(name)

    def find(self, auth: bytes | None, other: bytes | None) -> int:
        """The index in ``keys`` of the key a request presents (its ``Authorization``
        value, else its ``api-key`` / ``x-api-key`` value), or ``Unauthorized``.

        The SDKs' exact form, ``Bearer KEY``, is compared whole with every key's
        ``Bearer`` value; anything else (another case, extra spaces, the other headers)
        is parsed by ``parse_credential`` and its credential compared with every secret.
        Neither loop stops early, so the time taken says nothing about which key matched;
        that the exact form took the short way says only that it matched."""
        if auth is not None and len(auth) <= _MAX_BEARER_BYTES:
            found = -1
            for i, bearer in enumerate(self._bearers):
                if _compare_digest(bearer, auth):
                    found = i
            if found >= 0:
                return found
        return self.index(parse_credential(auth, other))

    def index(self, credential: bytes) -> int:
        """The index in ``keys`` of the key whose secret is ``credential``, or
        ``Unauthorized``."""
        found = -1
        for i, key in enumerate(self._keys):  # no early exit: constant time in which matched
            if _compare_digest(key.secret, credential):
                found = i
        if found < 0:
            raise Unauthorized(UNKNOWN_KEY)
        return found


def parse_credential(auth: bytes | None, other: bytes | None) -> bytes:
    """The credential from an ``Authorization`` value, else an ``api-key`` /
    ``x-api-key`` value; ``Unauthorized`` if neither is there or it is malformed."""
    if auth is not None:
        if auth.startswith(_SDK_BEARER) and len(auth) > _BEARER_LEN and auth[-1] > 32 < auth[7]:
            credential = auth[_BEARER_LEN:]  # the SDKs' exact form: nothing to strip
            if len(credential) > MAX_CREDENTIAL_BYTES:
                raise Unauthorized(UNKNOWN_KEY)
            return credential
        value = auth.strip()
        if len(value) <= _BEARER_LEN or value[:_BEARER_LEN].lower() != _BEARER:
            raise Unauthorized(MALFORMED_BEARER)
        credential = value[_BEARER_LEN:].strip()
    else:
        if other is None:
            raise Unauthorized(NO_KEY)
        credential = other.strip()
    if not credential or len(credential) > MAX_CREDENTIAL_BYTES:
        raise Unauthorized(UNKNOWN_KEY)
    return credential


def refuse_query_key(query: str) -> None:
    """Raise ``Unauthorized`` if the URL query carries something that looks like a key."""
    for name, _ in parse_qsl(query, keep_blank_values=True):
        if name.lower() in QUERY_KEY_PARAMS:
            raise Unauthorized(
                "API keys are not accepted in the URL; send them in the Authorization header"
            )


def load_keys_file(path: str) -> list[ApiKey]:
    """Keys from a TOML file of ``[keys.NAME]`` tables (``key`` plus optional limits
    and priority classes).
    Raises ``ValueError`` naming the table at fault, never the secret."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read API keys file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"API keys file {path} is not valid TOML: {exc}") from None
    return keys_from_mapping(data, source=path)


def keys_from_mapping(data: Mapping[str, Any], *, source: str = "keys") -> list[ApiKey]:
    unknown = sorted(set(data) - {"keys"})
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {', '.join(unknown)}")
    tables = data.get("keys", {})
    if not isinstance(tables, Mapping):
        raise ValueError(f"{source}: 'keys' must be tables like [keys.NAME]")
    out: list[ApiKey] = []
    for name, table in tables.items():
        out.append(_key_from_table(str(name), table, source))
    return out


_LIMIT_FIELDS = ("max_concurrent", "requests_per_minute", "tokens_per_minute")
# A key's priority class fields: any integers here (the range of classes is the
# runtime's, checked where the configuration is built), the default not above the cap.
_PRIORITY_FIELDS = ("priority", "priority_min")


def _key_from_table(name: str, table: Any, source: str) -> ApiKey:
    where = f"{source}: [keys.{name}]"
    if not isinstance(table, Mapping):
        raise ValueError(f"{where} must be a table")
    unknown = sorted(set(table) - {"key", "admin", *_LIMIT_FIELDS, *_PRIORITY_FIELDS})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    secret = table.get("key")
    if not isinstance(secret, str) or not secret:
        raise ValueError(f"{where}: 'key' must be a non-empty string")
    limits: dict[str, int] = {}
    for fld in _LIMIT_FIELDS:
        value = table.get(fld)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: '{fld}' must be a positive integer")
        limits[fld] = value
    admin = table.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}: 'admin' must be true or false")
    classes: dict[str, int] = {}
    for fld in _PRIORITY_FIELDS:
        value = table.get(fld)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{where}: '{fld}' must be an integer (lower runs first)")
        classes[fld] = value
    low = classes.get("priority_min")
    if low is not None and classes.get("priority", low) < low:
        raise ValueError(f"{where}: 'priority' must not be below 'priority_min'")
    try:
        encoded = secret.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: 'key' must be ASCII (it travels in an HTTP header)") from None
    return ApiKey(name, encoded, KeyLimits(**limits), **classes, admin=admin)
