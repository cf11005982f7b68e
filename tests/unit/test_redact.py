"""The one redactor (engine.domain.redact): no URL Vortos shows carries its password."""

from __future__ import annotations

import logging
import sys

import pytest

from engine.domain.database import parse_database, shown
from engine.domain.redact import (
    ScrubbingFormatter,
    is_secret_name,
    redact_url,
    remember,
    scrub,
    scrub_echoes,
    url_secrets,
)

# (URL, what is shown, the secret that must not show)
TRICKY = [
    ("postgresql://u:p@ss:w@rd@host/db", "postgresql://u:***@host/db", "p@ss:w@rd"),
    ("redis://:secret@h:6379/0", "redis://:***@h:6379/0", "secret"),
    (
        "postgresql://h/db?password=x&sslmode=require",
        "postgresql://h/db?password=***&sslmode=require",
        "password=x",
    ),
    ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db", "p%40ss"),
    ("postgresql://u:p/w@h/db", "postgresql://u:***@h/db", "p/w"),
    ("postgresql://u:p?w@h/db", "postgresql://u:***@h/db", "p?w"),
    ("postgresql://u:p/w?x@h/db", "postgresql://u:***@h/db", "w?x"),
    ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db", "pw@"),
    ("postgresql://u:pw@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db", "pw@"),
    ("postgresql://:hunter2@h/db", "postgresql://:***@h/db", "hunter2"),
    ("postgresql://me@corp:hunter2@h/db", "postgresql://me@corp:***@h/db", "hunter2"),
    ("postgresql://u:hunter2/db", "postgresql://u:***/db", "hunter2"),
    (
        "postgresql:///db?host=/tmp&user=me@corp&password=hunter2",
        "postgresql:///db?host=/tmp&user=me@corp&password=***",
        "hunter2",
    ),
    (
        "postgresql://h/db?sslpassword=a1&passfile=/p&sslkey=/k&sslmode=verify-full",
        "postgresql://h/db?sslpassword=***&passfile=***&sslkey=***&sslmode=verify-full",
        "a1",
    ),
    (
        "unix:///run/redis.sock?password=hunter2&db=0",
        "unix:///run/redis.sock?password=***&db=0",
        "hunter2",
    ),
    ("unix://:hunter2@/run/redis.sock", "unix://:***@/run/redis.sock", "hunter2"),
    ("rediss://default:hunter2@h:6380/1", "rediss://default:***@h:6380/1", "hunter2"),
    ("redis://h:6379/0?api_token=t0k3n", "redis://h:6379/0?api_token=***", "t0k3n"),
    (
        "host=db password='two words' dbname=v",
        "host=db password=*** dbname=v",
        "two words",
    ),
    ("host=db password=hunter2 sslkey=/k", "host=db password=*** sslkey=***", "hunter2"),
]

# Nothing secret: shown exactly as given.
PLAIN = [
    "postgresql://u@h/db",
    "postgresql://h:5432/db?sslmode=require&application_name=a@b",
    "postgresql://[::1]:5432/db",
    "redis://h:6379/0",
    "unix:///run/redis.sock?db=0",
    "/var/lib/vortos/vortos.db",
]


@pytest.mark.parametrize(("url", "expected", "secret"), TRICKY)
def test_a_url_is_shown_without_its_secrets(url: str, expected: str, secret: str) -> None:
    assert redact_url(url) == expected
    assert secret not in redact_url(url)


@pytest.mark.parametrize("url", PLAIN)
def test_a_url_without_secrets_is_shown_as_it_is(url: str) -> None:
    assert redact_url(url) == url
    assert url_secrets(url) == ()


def test_the_secrets_of_a_url_are_found_as_written_and_decoded() -> None:
    found = url_secrets("postgresql://u:p%40ss@h/db?token=a%2Fb")
    assert found == ("p%40ss", "a%2Fb", "p@ss", "a/b")


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("password", True),
        ("sslpassword", True),
        ("passfile", True),
        ("API_Token", True),
        ("client-secret", True),
        ("sslkey", True),
        ("auth", True),
        ("sslmode", False),
        ("application_name", False),
        ("target_session_attrs", False),
        ("host", False),
    ],
)
def test_parameter_names_that_suggest_a_secret(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_urls_inside_free_text_are_redacted() -> None:
    text = "cannot connect to postgresql://u:p@ss:w@rd@h/db; and redis://:hunter2@r:6379/0 either"
    said = scrub(text)
    assert "p@ss" not in said
    assert "w@rd" not in said
    assert "hunter2" not in said
    assert "postgresql://u:***@h/db;" in said
    assert "redis://:***@r:6379/0" in said


def test_a_drivers_echo_of_half_a_password_is_scrubbed() -> None:
    """libpq reads `u:p@ss:w@rd@host` as password p, port `w@rd@host`, and says so."""
    url = "postgresql://u:p@ss:w@rd@host/db"
    said = scrub_echoes('invalid integer value "w@rd@host" for connection option "port"', url)
    assert "w@rd" not in said
    assert 'for connection option "port"' in said
    spaced = scrub_echoes(
        'unexpected spaces found in "sec ret", use %20', "postgresql://u:sec ret@h/d"
    )
    assert "sec ret" not in spaced
    assert "use %20" in spaced


def test_remembered_secrets_are_scrubbed_from_any_text() -> None:
    remember("postgresql://u:Remembered-Pw-93@h/db")
    assert scrub("a plug-in said Remembered-Pw-93 aloud") == "a plug-in said *** aloud"


def test_log_lines_are_scrubbed_messages_and_tracebacks_alike() -> None:
    formatter = ScrubbingFormatter("%(message)s")
    try:
        _fail("lost postgresql://u:Tb-Secret-71@h/db")
    except RuntimeError:
        record = logging.LogRecord(
            "vortos",
            logging.ERROR,
            __file__,
            1,
            "at %s",
            ("redis://:Msg-Secret-72@h/0",),
            sys.exc_info(),
        )
    line = formatter.format(record)
    assert "Tb-Secret-71" not in line
    assert "Msg-Secret-72" not in line
    assert "redis://:***@h/0" in line


def _fail(message: str) -> None:
    raise RuntimeError(message)


def test_the_database_is_shown_through_the_redactor() -> None:
    assert shown("postgresql://u:p@ss:w@rd@host/db") == "postgresql://u:***@host/db"


def test_a_libpq_keyword_string_is_refused_without_showing_its_password() -> None:
    """Taken as a file name it would show its password wherever the file is named."""
    with pytest.raises(ValueError, match="postgresql:// URL") as refused:
        parse_database("host=db dbname=v password=hunter2")
    assert "hunter2" not in str(refused.value)
    assert str(parse_database("./host=db")) == "host=db"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:Qz@Xk:J9w@127.0.0.1:5432/test",  # two `@`: which one ends the password?
        "postgresql://me@corp:Qz@h/db",
        "postgresql://app:Qz#Jx@127.0.0.1/test",  # a `#` before the host: a fragment, or not?
        "postgresql://app:Qz/Jx@127.0.0.1/test",  # a `/` ends the authority
        "postgresql://app:Qz?Jx@127.0.0.1/test",
        "postgres://app:Qz/Jx?Vk@127.0.0.1/test",
    ],
)
def test_a_url_whose_host_cannot_be_told_from_its_password_is_refused_unshown(url: str) -> None:
    """A driver handed such a URL reads a piece of the password as the host or port, and
    quotes it in its complaint: the URL is refused before any driver sees it."""
    with pytest.raises(ValueError, match="percent-encode @ as %40") as refused:
        parse_database(url)
    for piece in ("Qz", "Xk", "J9w", "Jx", "Vk"):
        assert piece not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:Qz%40Xk%3AJ9w%23%2F@127.0.0.1:5432/test",
        "postgresql://app:pass:word@127.0.0.1/test",  # a `:` in the password is unambiguous
        "postgresql://h1:5432,h2:5433/db?application_name=a@b&target_session_attrs=any",
        "postgresql:///db?host=/tmp&user=me@corp&password=Qz@Xk",
        "postgresql://u@[::1]:5432/db",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/db",
    ],
)
def test_an_unambiguous_url_is_taken_as_it_is(url: str) -> None:
    assert parse_database(url).location == url
