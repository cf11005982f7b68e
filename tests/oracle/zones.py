"""The zones the property tests draw from.

`UNUSUAL_ZONES` is every zone (of the system's tz database, 2025b when this was written) with a
transition between 1970 and 2040 that is not a plain one-hour change between whole-hour
offsets: a gap or repeat other than 1 h (30 min in Lord Howe, 2 h, 3 h in Casey, 24 h in Apia),
or an offset with 30, 45 or odd minutes (St John's, Kathmandu, Chatham, Monrovia's -00:44:30).
It is what `derive_unusual_zones` returns, frozen here because deriving it reads every zone's
offsets hour by hour for 71 years (minutes of CPU); `VORTOS_DERIVE_ZONES=1` makes
test_cron_properties check that the frozen list is still the derived one.
"""

from __future__ import annotations

import calendar
import zoneinfo

from tests.oracle.cron_oracle import HOUR, Transition, zone_of

UNUSUAL_ZONES: tuple[str, ...] = (
    "Africa/Monrovia",
    "America/Argentina/Catamarca",
    "America/Argentina/ComodRivadavia",
    "America/Argentina/Cordoba",
    "America/Argentina/Jujuy",
    "America/Argentina/La_Rioja",
    "America/Argentina/Mendoza",
    "America/Argentina/Salta",
    "America/Argentina/San_Juan",
    "America/Argentina/San_Luis",
    "America/Argentina/Tucuman",
    "America/Bahia_Banderas",
    "America/Caracas",
    "America/Catamarca",
    "America/Cordoba",
    "America/Danmarkshavn",
    "America/Goose_Bay",
    "America/Guyana",
    "America/Indiana/Winamac",
    "America/Inuvik",
    "America/Iqaluit",
    "America/Jujuy",
    "America/Juneau",
    "America/Mendoza",
    "America/Montevideo",
    "America/Pangnirtung",
    "America/Paramaribo",
    "America/Rosario",
    "America/Santo_Domingo",
    "America/Scoresbysund",
    "America/Sitka",
    "America/St_Johns",
    "Antarctica/Casey",
    "Antarctica/Davis",
    "Antarctica/Rothera",
    "Antarctica/Troll",
    "Antarctica/Vostok",
    "Asia/Aqtau",
    "Asia/Chita",
    "Asia/Colombo",
    "Asia/Kathmandu",
    "Asia/Katmandu",
    "Asia/Kuala_Lumpur",
    "Asia/Magadan",
    "Asia/Pyongyang",
    "Asia/Singapore",
    "Asia/Tehran",
    "Asia/Thimbu",
    "Asia/Thimphu",
    "Asia/Ust-Nera",
    "Australia/Adelaide",
    "Australia/Broken_Hill",
    "Australia/Eucla",
    "Australia/LHI",
    "Australia/Lord_Howe",
    "Australia/South",
    "Australia/Yancowinna",
    "Canada/Newfoundland",
    "Europe/Simferopol",
    "Iran",
    "Kwajalein",
    "NZ-CHAT",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Pacific/Enderbury",
    "Pacific/Fakaofo",
    "Pacific/Kanton",
    "Pacific/Kiritimati",
    "Pacific/Kwajalein",
    "Pacific/Nauru",
    "Pacific/Norfolk",
    "Pacific/Pitcairn",
    "Pacific/Rarotonga",
    "Singapore",
)

# Named by the brief whatever the derivation says (Dublin's negative DST, Casablanca's Ramadan
# breaks, the rule changes of Moscow), Boa Vista's one-week summer of 2000 (the closest pair of
# transitions of any zone, 1970-2040), and the ordinary zones of both hemispheres.
REQUIRED_ZONES: tuple[str, ...] = (
    "Pacific/Apia",
    "Pacific/Kiritimati",
    "Pacific/Kwajalein",
    "Pacific/Fakaofo",
    "Antarctica/Casey",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/St_Johns",
    "Europe/Dublin",
    "Africa/Casablanca",
    "Europe/Moscow",
    "America/Boa_Vista",  # the closest two transitions since 1970: 2000-10-08 and -15
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Sao_Paulo",
    "America/Santiago",
    "Australia/Sydney",
    "Pacific/Auckland",
    "Asia/Kolkata",
    "UTC",
)

ALL_TEST_ZONES: tuple[str, ...] = tuple(dict.fromkeys((*REQUIRED_ZONES, *UNUSUAL_ZONES)))


def is_unusual(t: Transition) -> bool:
    return abs(t.after - t.before) != HOUR or t.before % HOUR != 0 or t.after % HOUR != 0


def derive_unusual_zones(first_year: int = 1970, last_year: int = 2040) -> list[str]:
    """Every available zone with an unusual transition in [first_year, last_year]."""
    found = []
    for key in sorted(zoneinfo.available_timezones()):
        zone = zone_of(key)
        low = calendar.timegm((first_year, 1, 1, 0, 0, 0))
        high = calendar.timegm((last_year + 1, 1, 1, 0, 0, 0))
        if any(is_unusual(t) for t in zone.transitions(low, high)):
            found.append(key)
    return found
