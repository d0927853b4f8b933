"""The console's login: the API's own token kept in a cookie, and the CSRF check of its forms.

- The cookie holds the bearer token a person typed on the login page (the same tokens as
  the API, or a ServiceAccount token in ``kubernetes`` mode): ``HttpOnly`` (no script reads
  it), ``SameSite=Strict`` (no other site's page sends it) and ``Secure`` over https
  (PHASEGATE_CONSOLE_SECURE_COOKIE). Every request checks it again with the API's
  authenticator, so revoking a token ends its console sessions at once; nothing is stored
  server side, so any orchestrator replica serves any session.
- Every form that changes something carries a CSRF token: an HMAC of a fixed label keyed with
  the session's own token. A page of another origin can neither read the cookie nor compute
  the HMAC; the cookie's SameSite and an ``Origin`` check are the second and third locks.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "phasegate_console"
CSRF_FIELD = "csrf"
# Tokens we issue are URL-safe base64; ServiceAccount tokens are JWTs (base64url and dots).
TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9._~+/=-]{1,8192}$")
_LABEL = b"phasegate-console-csrf-v1"
# ``none`` auth mode has no token to key the HMAC with: a key of this process (that mode is
# loopback-only and single-replica).
_PROCESS_KEY = secrets.token_bytes(32)


def session_token(request: Request) -> str | None:
    value = request.cookies.get(COOKIE)
    return value if value and TOKEN_PATTERN.fullmatch(value) else None


def csrf_for(token: str | None) -> str:
    key = token.encode() if token else _PROCESS_KEY
    return hmac.new(key, _LABEL, hashlib.sha256).hexdigest()


def csrf_ok(token: str | None, submitted: str | None) -> bool:
    return submitted is not None and hmac.compare_digest(csrf_for(token), submitted)


def same_origin(request: Request) -> bool:
    """False when the browser says the form came from another origin (Origin, else Referer).
    Browsers send Origin on every cross-site POST; a missing header is not proof of anything,
    so the CSRF token stays the check that counts."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return claimed is None
    parts = urlsplit(claimed)
    return parts.netloc == request.headers.get("host", request.url.netloc)


def is_https(request: Request) -> bool:
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip()
    return request.url.scheme == "https" or forwarded == "https"


def set_session(response: Response, request: Request, token: str,
                secure: bool | None) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=is_https(request) if secure is None else secure)


def clear_session(response: Response, request: Request, secure: bool | None) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=is_https(request) if secure is None else secure)


SECURITY_HEADERS = {
    # Scripts and styles from this origin only (the console ships its own two files); no
    # frames, forms post only here.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
