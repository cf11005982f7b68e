"""Fair dispatch: a tenant's share of a dispatch transaction, for every backend.

The choice is made here, without I/O; each backend passes the two queries it needs, run inside
its dispatch transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from engine.ports.dispatch import DispatchReport

# A due schedule as the due scan returns it: (id, version, cursor, tenant, next_fire_at).
DueRow = tuple[Any, ...]
# The tenants with any active schedule.
TenantsQuery = Callable[[], Sequence[str]]
# Up to `n` due schedules of each of `tenants`, soonest first per tenant.
DueInTenantsQuery = Callable[[Sequence[str], int], Sequence[DueRow]]


def fair_share(
    due: list[DueRow],
    limit: int,
    cap: int,
    report: DispatchReport,
    tenants: TenantsQuery,
    due_in: DueInTenantsQuery,
) -> list[DueRow]:
    """The due schedules of this transaction, at most `cap` per tenant while another tenant
    has schedules due.

    The first `limit` due schedules (`due`) are taken as they are unless a tenant holds more
    than `cap` of them while more is due than fits: another tenant's due schedules may then
    sit behind them in the due order, and would wait for the whole backlog. So every tenant
    with due schedules gets up to `cap` of this transaction, found through its own index
    range; what is left of the transaction goes, in due order, to the tenants over the cap.
    A tenant alone with a backlog is not slowed down.
    """
    if len(due) < limit:
        return due  # everything due fits: nobody waits
    per_tenant = Counter(r[3] for r in due)
    crowding = {t for t, n in per_tenant.items() if n > cap}
    if not crowding:
        return due
    others = [t for t in tenants() if t not in crowding]
    if not others:
        return due  # no other tenant has an active schedule: nobody to wait
    chosen: dict[str, DueRow] = {r[0]: r for r in due_in(others, cap)}
    taken = Counter[str]()
    for r in due:  # the crowding tenants' first `cap`, in due order
        if r[3] in crowding and taken[r[3]] < cap:
            chosen[r[0]] = r
            taken[r[3]] += 1
    for r in due:  # then what is left of the transaction, in due order
        if len(chosen) >= limit:
            break
        chosen.setdefault(r[0], r)
    selected = sorted(chosen.values(), key=lambda r: (r[4], r[0]))[:limit]
    kept = Counter(r[3] for r in selected)
    report.capped = {t: per_tenant[t] - kept[t] for t in crowding if per_tenant[t] > kept[t]}
    report.truncated = True  # the crowding tenants have more due
    return selected
