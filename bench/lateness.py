"""Firing lateness: 1,000 schedules every second for 30 s on the system clock (`--quick`: 5 s).

Lateness is the wall clock after the dispatch commit returned minus the slot instant (from the
instant for a fire written ahead of it). The daemon's defaults (its 1 s lookahead); run with all
schedules on one anchor (1,000 slots due at the same instant each second) and with the anchors
spread over the second.
"""

from __future__ import annotations

from bench._common import parse_args, quiet_logging
from bench._sustained import print_sustained, run_sustained


def main() -> None:
    args = parse_args(__doc__ or "")
    quiet_logging()
    for spread in (False, True):
        result = run_sustained(1_000, 5 if args.quick else 30, spread=spread)
        print_sustained(result, target_p99_ms=50)


if __name__ == "__main__":
    main()
