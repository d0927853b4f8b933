"""Who is calling the API: bearer tokens from a file, Kubernetes TokenReview, or nobody.

``PHASEGATE_API_AUTH`` picks the mode (docs/how-to/security.md):

- ``tokens`` (the default): ``PHASEGATE_API_TOKENS_FILE`` holds one token a line,
  ``NAME ROLE[,ROLE...] SHA256HEX`` -- the hex digest of the token, so the server never holds a
  plain token. The file is re-read when its mtime, size or inode changes (a rotated Secret
  shows up without a restart); a file that stops parsing keeps the last good one in force.
- ``kubernetes``: the caller's ServiceAccount token is checked with a TokenReview and the
  account (``NAMESPACE:NAME``) mapped to roles by ``PHASEGATE_API_SERVICE_ACCOUNTS``.
- ``none``: every caller is an admin. Only with an explicit setting and a loopback bind.

API roles nest: ``viewer`` < ``operator`` < ``admin``. Any other role a token carries is for
the read policy (``PHASEGATE_READ_POLICY``) only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from phasegate.access import ROLE_PATTERN, parse_service_accounts

log = structlog.get_logger("phasegate.auth")

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
LEVELS = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")
HEX_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# A bearer token longer than this is not one we issued (``token_urlsafe(32)`` is 43 chars; a
# ServiceAccount JWT is ~1 KB); refusing it early bounds the hashing a stranger can ask for.
MAX_TOKEN_CHARS = 8192
# TokenReview answers are cached this long, so a busy dashboard is not one apiserver call per
# request; a revoked ServiceAccount token stops working within this time.
REVIEW_CACHE_S = 30.0
REVIEW_CACHE_SIZE = 1024
REVIEW_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: ``name`` goes to logs and the action log, never the token."""

    name: str
    roles: frozenset[str]

    @property
    def level(self) -> int:
        return max((LEVELS.get(r, 0) for r in self.roles), default=0)

    def may(self, role: str) -> bool:
        return self.level >= LEVELS[role]


class AuthUnavailable(Exception):
    """The caller could not be checked (the apiserver is unreachable): the API answers 503."""


class Authenticator(Protocol):
    mode: str

    async def authenticate(self, token: str | None) -> Caller | None:
        """The caller for a bearer token; None when it is missing or not valid."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return "pgt_" + secrets.token_urlsafe(32)


def token_line(name: str, roles: list[str], token: str) -> str:
    """The tokens-file line for ``token`` (only its digest is written)."""
    return f"{name} {','.join(roles)} {token_digest(token)}"


@dataclass(frozen=True)
class TokenEntry:
    name: str
    roles: frozenset[str]
    digest: bytes


def parse_tokens(text: str) -> list[TokenEntry]:
    """The tokens file -> entries; ValueError naming the line (never its digest) when bad."""
    entries: list[TokenEntry] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3:
            raise ValueError(f"line {number}: expected 'NAME ROLE[,ROLE...] SHA256HEX'")
        name, roles_text, hex_digest = fields
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(f"line {number}: a name is 1-64 chars of [A-Za-z0-9_.:@-]")
        roles = frozenset(roles_text.split(","))
        if not all(ROLE_PATTERN.fullmatch(r) for r in roles):
            raise ValueError(f"line {number}: roles are 1-64 chars of [A-Za-z0-9_.:-], "
                             "separated by commas")
        if not HEX_PATTERN.fullmatch(hex_digest):
            raise ValueError(f"line {number}: the third field must be the sha256 of the token "
                             "as 64 lowercase hex digits (phasegate token new prints it)")
        if name in names:
            raise ValueError(f"line {number}: the name {name!r} is used twice")
        digest = bytes.fromhex(hex_digest)
        if digest in digests:
            raise ValueError(f"line {number}: the same token is listed twice")
        names.add(name)
        digests.add(digest)
        entries.append(TokenEntry(name, roles, digest))
    return entries


class TokenFile:
    """``tokens`` mode: the file of token digests, re-read when it changes."""

    mode = "tokens"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[TokenEntry] = []
        self._reload(initial=True)

    def _stat(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _reload(self, *, initial: bool = False) -> None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return
            entries = parse_tokens(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            if initial:
                raise ValueError(f"{self.path}: {exc}") from None
            # A half-written or broken file must not lock everyone out or let anyone in: the
            # last good file stays in force and the problem is logged (without any digest).
            log.error("api_tokens_file_unusable", path=str(self.path),
                      error=f"{type(exc).__name__}: {exc}"[:300])
            return
        with self._lock:
            self._entries = entries
            self._stamp = stamp
        if not initial:
            log.info("api_tokens_reloaded", path=str(self.path), tokens=len(entries))

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    def lookup(self, token: str) -> Caller | None:
        self._reload()
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: TokenEntry | None = None
        # Every line is compared, in constant time each, so the answer's timing does not say
        # which line (or how much of a digest) matched.
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return Caller(found.name, found.roles) if found else None

    async def authenticate(self, token: str | None) -> Caller | None:
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        return self.lookup(token)


class NoAuth:
    """``none`` mode: every caller is an admin named ``anonymous``."""

    mode = "none"
    caller = Caller("anonymous", frozenset({ADMIN}))

    async def authenticate(self, token: str | None) -> Caller | None:
        return self.caller


SA_PREFIX = "system:serviceaccount:"


class KubernetesAuth:
    """``kubernetes`` mode: a TokenReview per new token, answers cached briefly."""

    mode = "kubernetes"

    def __init__(self, api_client: Any, accounts: dict[str, frozenset[str]],
                 audiences: list[str] | None = None) -> None:
        self.api_client = api_client
        self.accounts = accounts
        self.audiences = audiences
        self._cache: OrderedDict[bytes, tuple[float, Caller | None]] = OrderedDict()

    @classmethod
    def in_cluster(cls, accounts: dict[str, frozenset[str]]) -> KubernetesAuth:
        from kubernetes import client, config

        config.load_incluster_config()
        return cls(client.ApiClient(), accounts)

    @classmethod
    def for_host(cls, host: str, accounts: dict[str, frozenset[str]], *,
                 token: str | None = None) -> KubernetesAuth:
        """An explicit API server (tests point this at a local stand-in)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        return cls(client.ApiClient(configuration), accounts)

    def close(self) -> None:
        self.api_client.close()

    async def authenticate(self, token: str | None) -> Caller | None:
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            username = await asyncio.to_thread(self._review, token)
        except Exception as exc:
            log.warning("token_review_failed", error=f"{type(exc).__name__}"
                                                     f" {getattr(exc, 'status', '')}".strip())
            raise AuthUnavailable("cannot check the token with the Kubernetes API") from None
        caller = self._caller(username)
        self._cache[key] = (now + REVIEW_CACHE_S, caller)
        self._cache.move_to_end(key)
        while len(self._cache) > REVIEW_CACHE_SIZE:
            self._cache.popitem(last=False)
        return caller

    def _caller(self, username: str | None) -> Caller | None:
        if username is None:
            return None
        if not username.startswith(SA_PREFIX):
            # Authenticated, but not a ServiceAccount: a caller with no roles (403).
            return Caller("user", frozenset())
        account = username.removeprefix(SA_PREFIX)
        return Caller(account, self.accounts.get(account, frozenset()))

    def _review(self, token: str) -> str | None:
        from kubernetes import client

        api = client.AuthenticationV1Api(self.api_client)
        review = api.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(
                token=token, audiences=self.audiences)),
            _request_timeout=REVIEW_TIMEOUT_S)
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return None
        username: str | None = status.user.username
        return username


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authenticator_from(*, mode: str, tokens_file: str | None, service_accounts: str | None,
                       host: str) -> Authenticator:
    """The authenticator the settings ask for; ValueError (naming the setting) if it cannot
    be built -- the orchestrator refuses to start rather than serve an open API."""
    if mode == "none":
        if not is_loopback(host):
            raise ValueError(f"PHASEGATE_API_AUTH=none serves the API to anyone; it is only "
                             f"allowed on a loopback address, not {host!r}")
        log.warning("api_auth_disabled",
                    message="PHASEGATE_API_AUTH=none: every caller of the API is an admin")
        return NoAuth()
    if mode == "kubernetes":
        accounts = parse_service_accounts(service_accounts or "{}")
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ValueError("PHASEGATE_API_AUTH=kubernetes needs to run in a Kubernetes pod "
                             "(KUBERNETES_SERVICE_HOST is unset)")
        return KubernetesAuth.in_cluster(accounts)
    if not tokens_file:
        raise ValueError("PHASEGATE_API_AUTH=tokens needs PHASEGATE_API_TOKENS_FILE (create a "
                         "token with `phasegate token new NAME --role operator`)")
    return TokenFile(tokens_file)
