"""Card data at rest: sealed before it is written to Redis, opened only to build a gateway request.

A flow that pays with a card keeps it in its record until its last gateway call (a crash must not lose
the payment), and the record is erased of it once the flow ends. But what Redis once held stays in its
files: the append-only file keeps every write until a rewrite, an RDB snapshot or a replica keeps what
was there when it was made, and a backup keeps both. So the card fields never reach Redis in the
clear: the card of a flow's input (``card``: PAN, expiry date, CVV) and a wallet's payment data
(``walletPaymentData``, the wallet's token) are written sealed with AES-256-GCM (the ``cryptography``
package), under a key of the ``DURAPAY_CARD__KEYS`` setting, which never enters Redis:

* **Sealed form.** ``card`` becomes ``{"pan": <first six and last four>, "expiryDate": "***",
  "cvv": "***", "sealed": "dpc1.<key id>.<nonce and ciphertext, base64>"}`` (the masked fields are what
  every view shows anyway); ``walletPaymentData`` becomes ``{"sealed": ...}``. The ciphertext is bound
  to its flow and place (the associated data is ``<flow id>|<path>``): moved to another flow or field,
  it does not open.
* **Where.** :meth:`CardVault.seal` is applied by the store to the input ``create.lua`` writes
  (``FlowStore._create_call``), the one place a flow's input is written; :meth:`CardVault.open` by the
  step protocol when it types the input for a step (``StepProtocol._typed_input``) and by an operator's
  retry of a failed flow. Nothing else reads the card: views show the sealed form (``presented``), and
  erasing the card at the flow's end (``sensitive.scrub``) drops the ciphertext with the rest.
* **Start keys.** A repeated start is compared with the first by a hash of its input
  (``input_hash``); for a card-carrying input the card parts are hashed with a key derived from the
  card key (HMAC-SHA256), never plainly (an unkeyed hash of a card number can be searched for).
* **Rotation.** The first key seals; any key of the list opens what it sealed (the key id travels
  with the ciphertext). :meth:`CardVault.reseal` seals an input again under the first key
  (``durapay cards reseal``, docs/operations.md).
* **No key, no card.** A start that carries a card with no key configured is refused
  (:class:`CardKeyMissing`); ``durapay dev`` and the demo generate a key and keep it in their folder.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from durapay.config.settings import CARD_KEY_BYTES, CardSettings, parse_card_key
from durapay.workflows.engine.jsonform import compact_sorted
from durapay.workflows.engine.sensitive import HIDDEN, mask_pan

if TYPE_CHECKING:
    from durapay.workflows.engine.api import Engine

#: The sealed form's version: ``dpc1.<key id>.<base64url(nonce | ciphertext and tag)>``.
PREFIX = "dpc1"
NONCE_BYTES = 12
KEY_BYTES = CARD_KEY_BYTES
#: The input's fields that hold card data, sealed wherever they are in it.
CARD = "card"
WALLET = "walletPaymentData"
SEALED = "sealed"
#: The card key's setting, named in the errors.
SETTING = "DURAPAY_CARD__KEYS"


class CardKeyMissing(Exception):
    """A card-carrying start, or a sealed card, with no key to seal or open it (a configuration error:
    nothing is written; retry once the key is configured)."""


class CardUnreadable(Exception):
    """A sealed card that no configured key opens (its key was removed, or the text was altered)."""


@dataclass(frozen=True)
class CardKey:
    id: str
    secret: bytes = field(repr=False)


def parse_key(text: str) -> CardKey:
    """``<id>:<key, base64 of 32 bytes>`` as a key (the rule is the setting's, ``config.settings``)."""
    return CardKey(*parse_card_key(text))


def new_key(key_id: str = "") -> str:
    """A fresh key entry for ``DURAPAY_CARD__KEYS`` (``<id>:<base64>``); the id from the time by default."""
    key_id = key_id or "k" + secrets.token_hex(3)
    parse_key(f"{key_id}:{'A' * 43}")  # the id's rule
    return f"{key_id}:{base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode().rstrip('=')}"


#: The file ``durapay dev`` and the demo keep their generated key in (their folder; owner-readable only).
KEY_FILE = "card-keys"


def kept_keys(folder: Path, *, make: bool) -> list[str]:
    """The key entries kept in ``folder``'s :data:`KEY_FILE`; with ``make``, one generated and kept the
    first time (``durapay dev``, the demo: their own store, their own key, kept across runs)."""
    path = folder / KEY_FILE
    try:
        kept = path.read_text().split()
    except FileNotFoundError:
        kept = []
    if kept or not make:
        return kept
    entry = new_key("dev")
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(entry + "\n")
    return [entry]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _compact(value: Any) -> bytes:
    return compact_sorted(value).encode()


def _places(data: Any, path: str = "") -> Iterator[tuple[dict[str, Any], str, str]]:
    """Each (dict, key, path) of ``data`` holding card data: a ``card`` object, a ``walletPaymentData``."""
    if isinstance(data, dict):
        for key, value in data.items():
            # The path is built only where it is used (every start walks its input: most hold no card).
            if (key == CARD and isinstance(value, dict) and value) or (key == WALLET and value is not None):
                yield data, key, f"{path}.{key}" if path else str(key)
            elif isinstance(value, dict | list):
                yield from _places(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from _places(item, f"{path}.{index}")


def _copy(data: Any) -> Any:
    result: Any = json.loads(json.dumps(data))
    return result


def is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get(SEALED), str) and value[SEALED].startswith(PREFIX + ".")


def may_carry(text: str) -> bool:
    """Whether an input whose compact JSON (``store.compact_json``) is ``text`` may hold card data: False
    only when neither field name is in it as a key (a key is followed by ``:`` there, a string's own
    quotes are escaped), so a start without card data is told by a search of the text it writes anyway,
    not by a walk of its input."""
    return f'"{CARD}":' in text or f'"{WALLET}":' in text


def carries(data: Any) -> bool:
    """Whether ``data`` (an input) holds card data in the clear."""
    return any(not is_sealed(holder[key]) for holder, key, _ in _places(data))


class CardVault:
    """Seals and opens the card data of flows' inputs with the configured keys (the first seals)."""

    def __init__(self, keys: Sequence[CardKey]) -> None:
        self.keys = list(keys)
        self._by_id = {key.id: AESGCM(key.secret) for key in self.keys}
        # A key of its own for the start keys' hashes (never the cipher's key itself).
        self._hashing = [hmac.new(key.secret, b"durapay input hash", hashlib.sha256).digest() for key in self.keys]

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> CardVault:
        return cls([parse_key(text) for text in texts])

    @classmethod
    def from_settings(cls, settings: CardSettings) -> CardVault:
        return cls.from_texts([key.get_secret_value() for key in settings.keys])

    @property
    def configured(self) -> bool:
        return bool(self.keys)

    # -- sealing ---------------------------------------------------------------------------------

    def seal(self, flow_id: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``data`` with its card data sealed under the first key (CardKeyMissing without one).
        An input with no card data in the clear (most) is copied shallowly, not through JSON: nothing in it
        changes, and the store only serialises it."""
        if not carries(data):
            return dict(data)
        copy: dict[str, Any] = _copy(dict(data))
        for holder, key, where in list(_places(copy)):
            if is_sealed(holder[key]):
                continue
            if not self.keys:
                raise CardKeyMissing(
                    f"{where}: card data is written to Redis only encrypted, and {SETTING} is not set: "
                    "set it (docs/security.md, Card data at rest; `durapay cards new-key` makes one)"
                )
            holder[key] = self._sealed(flow_id, where, holder[key])
        return copy

    def _sealed(self, flow_id: str, where: str, value: Any) -> dict[str, Any]:
        key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        text = self._by_id[key.id].encrypt(nonce, _compact(value), f"{flow_id}|{where}".encode())
        envelope = f"{PREFIX}.{key.id}.{_b64(nonce + text)}"
        if where.rsplit(".", 1)[-1] == CARD and isinstance(value, dict):
            shown: dict[str, Any] = {"pan": mask_pan(str(value.get("pan", "")))} if value.get("pan") else {}
            shown |= {name: HIDDEN for name in ("expiryDate", "cvv") if value.get(name)}
            return shown | {SEALED: envelope}
        return {SEALED: envelope}

    # -- opening ---------------------------------------------------------------------------------

    def open(self, flow_id: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``data`` with its card data in the clear (what a record written before sealing
        holds in the clear stays so). CardKeyMissing / CardUnreadable when a sealed part does not open."""
        if not any(is_sealed(holder[key]) for holder, key, _ in _places(data)):
            return dict(data)
        copy: dict[str, Any] = _copy(dict(data))
        for holder, key, where in list(_places(copy)):
            if is_sealed(holder[key]):
                holder[key] = self._opened(flow_id, where, holder[key][SEALED])
        return copy

    def _opened(self, flow_id: str, where: str, envelope: str) -> Any:
        _, key_id, text = envelope.split(".", 2)
        cipher = self._by_id.get(key_id)
        if cipher is None:
            raise CardKeyMissing(
                f"{where}: sealed with card key {key_id!r}, which {SETTING} does not hold: put it back in the list "
                "(docs/operations.md, Rotating the card key)"
            )
        raw = _unb64(text)
        try:
            plain = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], f"{flow_id}|{where}".encode())
        except InvalidTag:
            raise CardUnreadable(f"{where}: the sealed card data of flow {flow_id} does not open with key {key_id!r}") from None
        return json.loads(plain)

    def key_ids(self, data: Any) -> set[str]:
        """The ids of the keys that sealed ``data``'s card parts."""
        return {holder[key][SEALED].split(".", 2)[1] for holder, key, _ in _places(data) if is_sealed(holder[key])}

    def reseal(self, flow_id: str, data: Mapping[str, Any]) -> dict[str, Any] | None:
        """``data`` sealed again under the first key when a part of it was sealed by another; else None."""
        if not self.keys or self.key_ids(data) <= {self.keys[0].id}:
            return None
        return self.seal(flow_id, self.open(flow_id, data))

    # -- start keys ------------------------------------------------------------------------------

    def digests(self, data: Mapping[str, Any], plain: Callable[[Mapping[str, Any]], str]) -> list[str]:
        """The hashes a repeated start's input is compared by: ``plain(data)`` for an input without card
        data; with card data, ``plain`` of the input whose card parts are replaced by their keyed hash,
        under each key (the first is written; any of them matches, across a rotation)."""
        if not carries(data):
            return [plain(data)]
        if not self._hashing:
            raise CardKeyMissing(f"card data cannot be hashed for a start key: {SETTING} is not set")
        forms = []
        for hashing in self._hashing:
            copy: dict[str, Any] = _copy(dict(data))
            for holder, key, _ in list(_places(copy)):
                holder[key] = {"hmac": hmac.new(hashing, _compact(holder[key]), hashlib.sha256).hexdigest()}
            forms.append(plain(copy))
        # Accepted, never written: the plain hash a record created before card data was sealed holds.
        return [*forms, plain(data)]


def presented(data: Any) -> Any:
    """``data`` as views show it: each sealed part without its ciphertext (its masked fields stay)."""
    if isinstance(data, dict):
        if is_sealed(data):
            shown = {key: value for key, value in data.items() if key != SEALED}
            return shown or HIDDEN  # a wallet's payment data: nothing of it is shown
        return {key: presented(value) for key, value in data.items()}
    if isinstance(data, list):
        return [presented(item) for item in data]
    return data


@dataclass
class InFlight:
    """The flows in flight that hold sealed card data, by the id of the key that sealed it."""

    by_key: dict[str, int] = field(default_factory=dict)
    resealed: int = 0
    flows: int = 0


def in_flight(engine: Engine, *, reseal: bool = False, limit: int = 100_000) -> InFlight:
    """Count the flows not yet ended (at most ``limit``) by the card keys that sealed their data, and with
    ``reseal`` seal again under the first key each one sealed by another (``reseal.lua``: only while its
    input is the one read). After a rotation: ``durapay cards keys`` says when an old key seals nothing
    any more and may be removed; ``durapay cards reseal`` makes that now (docs/operations.md)."""
    from durapay.workflows.engine.scripts import register, source
    from durapay.workflows.engine.states import TERMINAL, FlowState

    store, vault = engine.store, engine.cards
    script = register(engine.redis, "engine/lua/reseal.lua", source("engine/lua/reseal.lua"))
    seen = InFlight()
    ids = [flow_id for state in FlowState if state not in TERMINAL for _, flow_id in store.ids(state=state)][:limit]
    for start in range(0, len(ids), 200):
        for record in store.many(ids[start : start + 200]):
            if record.finished or record.packed:
                continue
            used = vault.key_ids(record.input)
            if not used:
                continue
            seen.flows += 1
            sealed = vault.reseal(record.id, record.input) if reseal else None
            if sealed is not None and script(keys=[engine.keys.flow(record.id)], args=[record.fields["input"], _json(sealed)]):
                seen.resealed += 1
                used = {vault.keys[0].id}
            for key_id in used:
                seen.by_key[key_id] = seen.by_key.get(key_id, 0) + 1
    return seen


def _json(value: Any) -> str:
    """The store's one JSON form (``store.compact_json``)."""
    from durapay.workflows.engine.store import compact_json

    return compact_json(value)
