"""Card data is kept only while a flow needs it.

A flow that pays with a card (MOTO, three steps, init/pay, card verification) must keep the card in its
record until its last gateway call, so that a crash never loses the payment. Once the flow ends the
record keeps only what a support desk may see: the first six and last four digits. The CVV and expiry
date are dropped, as are wallet payment tokens. (PCI DSS forbids keeping the CVV after authorization;
Redis holding flows in flight should be protected as cardholder data: TLS, ACLs, no public access.)
"""

from __future__ import annotations

from typing import Any

REDACTED = "redacted"


def mask_pan(pan: str) -> str:
    """First six and last four digits (what PCI DSS allows to show); anything too short to be a card
    number is hidden whole."""
    digits = pan.strip()
    if len(digits) < 13:
        return "***"
    return digits[:6] + "*" * (len(digits) - 10) + digits[-4:]


def scrub(data: Any) -> Any:
    """A copy of a flow input without card secrets (``card.pan`` masked, ``cvv``/``expiryDate`` and
    ``walletPaymentData`` removed), at any depth."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key == "card" and isinstance(value, dict):
                out[key] = {"pan": mask_pan(str(value.get("pan", "")))} if value.get("pan") else {}
            elif key == "walletPaymentData":
                out[key] = REDACTED
            else:
                out[key] = scrub(value)
        return out
    if isinstance(data, list):
        return [scrub(item) for item in data]
    return data
