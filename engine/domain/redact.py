"""The one redactor: every URL or connection string Vortos shows (tables, JSON, logs, doctor,
console, error messages) goes through here, so a password shows nowhere (pure: no I/O).

What counts as secret in a URL: its password (the userinfo after the first `:`; the userinfo
ends at the LAST `@` before the query, so `u:p@ss:w@rd@host` hides all of `p@ss:w@rd`), and the
value of every query or keyword parameter whose name suggests one (SECRET_WORDS: `password=`,
`sslpassword=`, `passfile=`, `token=`, `secret=`, `api_key=`, `auth=`, ...). The user, host, port,
database and other parameters stay, so a message still says where. A URL too malformed to tell
its host from its password is hidden past the scheme rather than guessed at.

Driver messages can echo pieces of a URL they could not parse (libpq: `unexpected spaces found
in "sec ret"`); `scrub` removes the secrets of URLs it is told about from such text.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
# A parameter whose name holds one of these (case and `_`/`-` ignored) has a secret value.
SECRET_WORDS = (
    "pass",  # password, passwd, passfile, sslpassword, passphrase
    "pwd",
    "secret",
    "token",
    "key",  # sslkey, api_key, access_key
    "auth",
    "cred",
    "signature",
    "private",
    "jwt",
)
# Shorter secrets are not scrubbed out of free text (they would blank ordinary words).
MIN_SCRUBBED = 4

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# A URL inside free text: up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`]*")
# `name=value` of a libpq keyword string: at the start or after whitespace; value quoted or not.
_KEYWORD = re.compile(r"(?:(?<=\s)|^)([A-Za-z_][A-Za-z0-9_.\-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)")
_PORTS = re.compile(r"\d*")


def is_secret_name(name: str) -> bool:
    """True for a parameter name that suggests a secret (password=, sslkey=, api_token=, ...)."""
    folded = name.lower().replace("_", "").replace("-", "")
    return any(word in folded for word in SECRET_WORDS)


def redact_url(text: str) -> str:
    """`text` (a URL, or a libpq `key=value` string) with its password and every secret
    parameter replaced by ***."""
    found = _SCHEME.match(text)
    if found is None:
        return _mask_keywords(text)
    scheme, rest = text[: found.end()], text[found.end() :]
    cut = _userinfo_end(rest)
    if cut < 0:
        return scheme + _mask_query(_mask_bad_port(rest))
    user, colon, _ = rest[:cut].partition(":")
    return scheme + (f"{user}:{MASK}" if colon else user) + _mask_query(rest[cut:])


def url_secrets(text: str) -> tuple[str, ...]:
    """The secret values in a URL or keyword string, as written and percent-decoded."""
    values: list[str] = []
    found = _SCHEME.match(text)
    if found is None:
        for match in _KEYWORD.finditer(text):
            if is_secret_name(match.group(1)):
                values.append(match.group(3).strip("'"))
    else:
        rest = text[found.end() :]
        cut = _userinfo_end(rest)
        if cut >= 0:
            _, colon, password = rest[:cut].partition(":")
            if colon:
                values.append(password)
            rest = rest[cut:]
        elif _bad_port(_authority(rest)):
            values.append(_authority(rest).split(":", 1)[1])
        _, question, query = rest.partition("?")
        for pair in query.split("&") if question else ():
            name, equals, value = pair.partition("=")
            if equals and is_secret_name(name):
                values.append(value)
    decoded = [unquote(v) for v in values]
    return tuple(dict.fromkeys(v for v in (*values, *decoded) if v))


def url_userinfo(text: str) -> str | None:
    """The userinfo (`user:password`) of a URL as the redactor reads it, up to its last `@`
    before the query; None for a URL without one, or a text that is no URL."""
    found = _SCHEME.match(text)
    if found is None:
        return None
    rest = text[found.end() :]
    cut = _userinfo_end(rest)
    return rest[:cut] if cut >= 0 else None


def scrub(text: str, urls: Iterable[str] = ()) -> str:
    """Free text (an error message, a log line) with every URL in it redacted, and every secret
    of `urls` and of the URLs remembered by `remember` replaced by ***."""
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    secrets = set(_remembered.values())
    for url in urls:
        secrets.update(url_secrets(url))
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_SCRUBBED and secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_echoes(text: str, url: str) -> str:
    """A driver's complaint about `url` without the secrets or any fragment of them it quotes
    (libpq quotes the piece it could not parse, which may be half a password)."""
    secrets = [s for s in url_secrets(url) if s]
    if not secrets:
        return scrub(text)

    def echoed(match: re.Match[str]) -> str:
        piece = match.group(0)
        return MASK if any(_overlap(piece, s) for s in secrets) else piece

    return scrub(re.sub(r"\"[^\"]*\"|'[^']*'|\S+", echoed, text), [url])


class _Remembered:
    """The secrets of the URLs this process was configured with, so a message that mentions
    one by accident (a driver's text, a plug-in's log line) is scrubbed anyway."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()

    def add(self, url: str) -> None:
        found = url_secrets(url)
        with self._lock:
            self._secrets.update(found)

    def values(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._secrets)


_remembered = _Remembered()


def remember(url: str) -> None:
    """Scrub the secrets of `url` out of every later `scrub` in this process."""
    _remembered.add(url)


# -- the parts of a URL -------------------------------------------------------------------------


def _userinfo_end(rest: str) -> int:
    """Where the userinfo of `rest` (a URL after its `scheme://`) ends: the index of its last
    `@` before the query string, or -1 without one. The query starts at the first `?` after
    the first `/`: a `?` before that belongs to the password (libpq accepts one there)."""
    slash = rest.find("/")
    query = rest.find("?", slash) if slash >= 0 else -1
    head = rest if query < 0 else rest[:query]
    cut = head.rfind("@")
    if cut < 0 and "@" in rest and _bad_port(_authority(rest)):
        # `u:p/w?x@host`: a raw `/` in the password; hide up to the last `@` rather than guess.
        cut = rest.rfind("@")
    return cut


def _authority(rest: str) -> str:
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def _bad_port(authority: str) -> bool:
    """True when what follows a `:` of the authority is no port: then it is a password."""
    for host in authority.split(","):
        bare = host.rsplit("]", 1)[-1] if host.startswith("[") else host
        if ":" in bare and not _PORTS.fullmatch(bare.rsplit(":", 1)[1]):
            return True
    return False


def _mask_bad_port(rest: str) -> str:
    """`u:secret/db` (no `@`): the text after the `:` is no port but a password; hide it."""
    authority = _authority(rest)
    if not _bad_port(authority):
        return rest
    return authority.split(":", 1)[0] + ":" + MASK + rest[len(authority) :]


def _mask_query(rest: str) -> str:
    before, question, query = rest.partition("?")
    if not question:
        return rest
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}={MASK}" if equals and is_secret_name(name) else pair)
    return before + "?" + "&".join(pairs)


def _mask_keywords(text: str) -> str:
    def masked(match: re.Match[str]) -> str:
        name, equals, _ = match.groups()
        return f"{name}{equals}{MASK}" if is_secret_name(name) else match.group(0)

    return _KEYWORD.sub(masked, text) if "=" in text else text


def _overlap(piece: str, secret: str) -> bool:
    """True when `piece` holds any run of the secret's characters long enough to matter."""
    size = min(MIN_SCRUBBED, len(secret))
    return any(secret[i : i + size] in piece for i in range(len(secret) - size + 1))


class ScrubbingFormatter(logging.Formatter):
    """A log formatter whose every line (message, arguments, traceback) goes through `scrub`:
    whatever a library or plug-in logs, a URL's password does not reach the log."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))
