"""Signed one-time approve/deny links of a `blocked` notification (docs/observability.md).

A link names the approval, the decision and its expiry, signed with HMAC-SHA256 under the
store's link key (`web_links`, made by `ui --public-url`). It is one-time because the
approval is: once decided (by this link, its twin, the CLI or the view) it is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from msgspec import Struct

LINK_PATH = "/link/"


class LinkClaim(Struct, frozen=True):
    run_id: str
    approval_id: int
    decision: str  # approved | denied
    expires: int  # unix seconds


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, body: str) -> str:
    return _b64(hmac.new(bytes.fromhex(secret), body.encode(), hashlib.sha256).digest())


def make_token(secret: str, claim: LinkClaim) -> str:
    body = _b64(
        json.dumps(
            {"r": claim.run_id, "a": claim.approval_id, "d": claim.decision, "e": claim.expires},
            separators=(",", ":"),
        ).encode()
    )
    return f"{body}.{_mac(secret, body)}"


def read_token(secret: str, token: str, now: float | None = None) -> LinkClaim | str:
    """The claim, or why the link is refused: "tampered" or "expired"."""
    body, _, mac = token.partition(".")
    if not body or not hmac.compare_digest(mac.encode(), _mac(secret, body).encode()):
        return "tampered"
    try:
        data: Any = json.loads(_unb64(body))
        claim = LinkClaim(str(data["r"]), int(data["a"]), str(data["d"]), int(data["e"]))
    except (ValueError, KeyError, TypeError):
        return "tampered"
    if (time.time() if now is None else now) >= claim.expires:
        return "expired"
    return claim


def approval_links(
    public_url: str, secret: str, run_id: str, approval_id: int, ttl_s: float
) -> dict[str, str]:
    """{"approve": URL, "deny": URL}, valid for `ttl_s` seconds."""
    expires = int(time.time() + ttl_s)
    base = public_url.rstrip("/") + LINK_PATH
    return {
        verb: base + make_token(secret, LinkClaim(run_id, approval_id, decision, expires))
        for verb, decision in (("approve", "approved"), ("deny", "denied"))
    }
