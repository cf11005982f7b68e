"""The lease suite: what every implementation of LeasePort must guarantee."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext

import pytest

from engine.domain.clock import ManualClock
from engine.domain.errors import LeaseError, LeaseExpired, LeaseNotOwned
from engine.ports.lease import Lease, LeasePort
from engine.testing.conformance.storage import T0

KEY = "scheduler"
TTL_MS = 30_000

# The threads that race for one key, and how many keys they race for, one after another.
THREADS = 8
THREAD_ROUNDS = 20

# The guarantees, as the failure messages name them.
MUTUAL_EXCLUSION = "mutual exclusion"
EXPIRY = "expiry"
NO_RESURRECTION = "renew never resurrects an expired lease"
RELEASE_BY_NON_HOLDER = "release by a non-holder must raise LeaseNotOwned and leave the lease"


class LeaseConformance:
    """Subclass this suite and implement `open_leases` to check a LeasePort implementation.

    The guarantees it checks, each named in the message of the assertion that fails:
    - mutual exclusion: at most one token holds a key at any instant; `acquire` succeeds only
      when the key is free, its lease expired, or the caller's own token holds it;
    - expiry: a lease ends `ttl_ms` after it was last acquired or renewed, judged on the clock
      given to `open_leases`, and is then free without anyone cleaning it up;
    - renew extends only the token's live lease, and never resurrects an expired one;
    - release frees the key at once; release by a non-holder must raise LeaseNotOwned and
      leave the lease; releasing a free or expired lease is a no-op.

    Each test gets a new, empty store on a ManualClock that starts at T0; the suite moves the
    clock itself. For example:

        class TestEtcdLease(LeaseConformance):
            def open_leases(self, clock):
                return closing(EtcdLease("http://127.0.0.1:2379", clock))

    Implement `open_contender` too when the implementation has clients of its own (sessions,
    connections): the suite then checks exclusion between two clients, not within one.
    """

    def open_leases(self, clock: ManualClock) -> AbstractContextManager[LeasePort]:
        """A context manager giving a new, empty lease store whose expiry is judged on `clock`,
        closed at its end."""
        raise NotImplementedError(f"{type(self).__name__} must implement open_leases")

    def open_contender(
        self, leases: LeasePort, clock: ManualClock
    ) -> AbstractContextManager[LeasePort]:
        """A context manager giving a second, independent client of the store `leases` is a
        client of, as another node would open it, closed at its end. By default `leases`
        itself: override it where clients are separate (a session, a connection each)."""
        return nullcontext(leases)

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(T0)

    @pytest.fixture
    def leases(self, clock: ManualClock) -> Iterator[LeasePort]:
        with self.open_leases(clock) as opened:
            yield opened

    @pytest.fixture
    def contender(self, leases: LeasePort, clock: ManualClock) -> Iterator[LeasePort]:
        with self.open_contender(leases, clock) as opened:
            yield opened

    # --- acquire ---------------------------------------------------------------------------

    def test_acquire_on_a_free_key_returns_a_lease(self, leases: LeasePort) -> None:
        lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        assert lease is not None, "acquire: a free key must be granted"
        assert leases.current(KEY) == lease, "acquire: current() must show the lease just granted"

    def test_acquire_is_refused_while_another_token_holds_the_key(self, leases: LeasePort) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        second = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert second is None, _two_holders(held, second)

    def test_refused_acquire_leaves_the_holder_in_place(self, leases: LeasePort) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        current = leases.current(KEY)

        assert current == held, (
            f"{MUTUAL_EXCLUSION}: a refused acquire must leave the holder in place; "
            f"held {held}, now {current}"
        )

    def test_different_keys_are_independent(self, leases: LeasePort) -> None:
        first = leases.acquire("key-1", "token-a", "node-a", TTL_MS)
        second = leases.acquire("key-2", "token-b", "node-b", TTL_MS)

        assert first is not None, "acquire: a free key must be granted"
        assert second is not None, "acquire: holding one key must not block another key"
        assert leases.current("key-1") == first
        assert leases.current("key-2") == second

    def test_lease_names_the_key_token_and_holder(self, leases: LeasePort) -> None:
        lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        assert lease is not None, "acquire: a free key must be granted"
        assert (lease.key, lease.token, lease.holder) == (KEY, "token-a", "node-a")

    def test_lease_expires_ttl_after_it_was_acquired(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        now = clock.now_ms()

        lease = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        assert lease is not None, "acquire: a free key must be granted"
        assert lease.acquired_at == now, f"{EXPIRY}: acquired_at must be the clock's now"
        assert lease.expires_at == now + TTL_MS, f"{EXPIRY}: a lease must end ttl_ms after now"

    def test_acquire_by_the_holding_token_keeps_the_lease(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS // 2)

        again = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        assert again is not None, "acquire: the holding token must be granted its key again"
        assert (again.token, again.holder) == ("token-a", "node-a")
        assert again.expires_at == clock.now_ms() + TTL_MS, (
            f"{EXPIRY}: acquiring again must extend the lease to now + ttl_ms"
        )
        assert leases.current(KEY) == again

    # --- expiry ----------------------------------------------------------------------------

    def test_current_is_none_on_a_free_key(self, leases: LeasePort) -> None:
        current = leases.current(KEY)

        assert current is None, f"current: a key never acquired must be free, not {current}"

    def test_current_is_none_once_the_lease_expired(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        current = leases.current(KEY)

        assert current is None, f"{EXPIRY}: a lease past its TTL must be free, not {current}"

    def test_expired_lease_can_be_acquired_by_another_token(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert taken is not None, f"{EXPIRY}: another token must be able to take an expired lease"
        assert (taken.token, taken.holder) == ("token-b", "node-b")
        assert taken.expires_at == clock.now_ms() + TTL_MS, (
            f"{EXPIRY}: a lease taken over must end ttl_ms after now"
        )
        assert leases.current(KEY) == taken

    def test_expired_lease_can_be_acquired_again_by_its_former_token(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        again = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        assert again is not None, f"{EXPIRY}: its former token must be able to acquire it again"
        assert again.expires_at == clock.now_ms() + TTL_MS

    def test_lease_not_yet_expired_blocks_another_token(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS - 1)

        second = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert second is None, _two_holders(held, second, "1 ms before its expiry")

    # --- renew -----------------------------------------------------------------------------

    def test_renew_extends_the_expiry_from_now(self, leases: LeasePort, clock: ManualClock) -> None:
        acquired = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        assert acquired is not None, "acquire: a free key must be granted"
        _advance_ms(clock, TTL_MS // 2)

        renewed = leases.renew(KEY, "token-a", TTL_MS)

        assert renewed.expires_at == clock.now_ms() + TTL_MS, (
            f"renew: must extend the lease to now + ttl_ms; got {renewed}"
        )
        assert renewed.expires_at > acquired.expires_at
        assert leases.current(KEY) == renewed, "renew: current() must show the renewed lease"

    def test_renew_keeps_the_key_token_and_holder(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, 1000)

        renewed = leases.renew(KEY, "token-a", TTL_MS)

        assert (renewed.key, renewed.token, renewed.holder) == (KEY, "token-a", "node-a")

    def test_renew_with_another_token_raises_not_owned(self, leases: LeasePort) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        with _must_raise(LeaseNotOwned, f"{MUTUAL_EXCLUSION}: renew by a non-holder"):
            leases.renew(KEY, "token-b", TTL_MS)

    def test_renew_with_another_token_leaves_the_lease_unchanged(self, leases: LeasePort) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        with _must_raise(LeaseNotOwned, f"{MUTUAL_EXCLUSION}: renew by a non-holder"):
            leases.renew(KEY, "token-b", TTL_MS)

        current = leases.current(KEY)
        assert current == held, (
            f"{MUTUAL_EXCLUSION}: a refused renew must leave the lease; held {held}, now {current}"
        )

    def test_renew_of_a_free_key_raises_not_owned(self, leases: LeasePort) -> None:
        with _must_raise(LeaseNotOwned, "renew of a key nobody holds"):
            leases.renew(KEY, "token-a", TTL_MS)

    def test_renew_after_expiry_raises_expired_even_if_nobody_took_it(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        with _must_raise(LeaseExpired, NO_RESURRECTION):
            leases.renew(KEY, "token-a", TTL_MS)

    def test_renew_after_expiry_does_not_resurrect_the_lease(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        with _must_raise(LeaseExpired, NO_RESURRECTION):
            leases.renew(KEY, "token-a", TTL_MS)

        current = leases.current(KEY)
        assert current is None, f"{NO_RESURRECTION}: after the refused renew, found {current}"
        assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is not None, (
            f"{NO_RESURRECTION}: another token must still be able to take the key"
        )

    def test_renew_after_another_token_took_the_expired_lease_raises_not_owned(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)
        taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)
        assert taken is not None, f"{EXPIRY}: another token must be able to take an expired lease"

        with _must_raise(LeaseNotOwned, f"{MUTUAL_EXCLUSION}: renew by a deposed token"):
            leases.renew(KEY, "token-a", TTL_MS)

    def test_renewed_lease_still_blocks_a_competitor_past_the_first_expiry(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS - 1000)
        renewed = leases.renew(KEY, "token-a", TTL_MS)
        _advance_ms(clock, 2000)  # past the first expiry, within the renewed one

        second = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert second is None, _two_holders(renewed, second, "past its first expiry, renewed")
        current = leases.current(KEY)
        assert current is not None, f"{EXPIRY}: a renewed lease must outlive its first expiry"
        assert (current.token, current.holder) == ("token-a", "node-a")

    # --- release ---------------------------------------------------------------------------

    def test_release_frees_the_key_at_once(self, leases: LeasePort) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        leases.release(KEY, "token-a")

        current = leases.current(KEY)
        assert current is None, f"release: must free the key at once, found {current}"

    def test_release_allows_another_token_to_acquire_immediately(self, leases: LeasePort) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        leases.release(KEY, "token-a")

        taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert taken is not None, "release: another token must be able to take the key at once"
        assert (taken.token, taken.holder) == ("token-b", "node-b")

    def test_release_of_a_free_key_is_a_no_op(self, leases: LeasePort) -> None:
        leases.release(KEY, "token-a")

        assert leases.current(KEY) is None

    def test_release_of_an_expired_lease_is_a_no_op(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        leases.release(KEY, "token-a")

        assert leases.current(KEY) is None
        assert leases.acquire(KEY, "token-b", "node-b", TTL_MS) is not None, (
            f"{EXPIRY}: another token must be able to take an expired, released lease"
        )

    def test_release_of_an_expired_lease_by_another_token_is_a_no_op(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        try:
            leases.release(KEY, "token-b")
        except LeaseNotOwned as refused:
            pytest.fail(
                f"{EXPIRY}: an expired lease has no holder to protect, so its release by "
                f"another token must be a no-op; raised {refused!r}"
            )

        assert leases.current(KEY) is None

    def test_release_twice_is_a_no_op(self, leases: LeasePort) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        leases.release(KEY, "token-a")

        leases.release(KEY, "token-a")

        assert leases.current(KEY) is None

    def test_release_with_another_token_raises_not_owned(self, leases: LeasePort) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        with _must_raise(LeaseNotOwned, RELEASE_BY_NON_HOLDER):
            leases.release(KEY, "token-b")

    def test_release_with_another_token_leaves_the_lease_in_place(self, leases: LeasePort) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        with _must_raise(LeaseNotOwned, RELEASE_BY_NON_HOLDER):
            leases.release(KEY, "token-b")

        current = leases.current(KEY)
        assert current == held, f"{RELEASE_BY_NON_HOLDER}: held {held}, now {current}"
        second = leases.acquire(KEY, "token-b", "node-b", TTL_MS)
        assert second is None, _two_holders(held, second, "after a refused release")

    def test_release_by_a_deposed_token_leaves_the_new_holder_in_place(
        self, leases: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)
        taken = leases.acquire(KEY, "token-b", "node-b", TTL_MS)
        assert taken is not None, f"{EXPIRY}: another token must be able to take an expired lease"

        with _must_raise(LeaseNotOwned, f"{RELEASE_BY_NON_HOLDER} (a deposed token)"):
            leases.release(KEY, "token-a")

        current = leases.current(KEY)
        assert current == taken, f"{RELEASE_BY_NON_HOLDER}: held {taken}, now {current}"

    def test_acquire_release_acquire_cycle_passes_the_lease_back_and_forth(
        self, leases: LeasePort
    ) -> None:
        first = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        assert first is not None, "acquire: a free key must be granted"
        second = leases.acquire(KEY, "token-b", "node-b", TTL_MS)
        assert second is None, _two_holders(first, second)
        leases.release(KEY, "token-a")
        first = leases.acquire(KEY, "token-b", "node-b", TTL_MS)
        assert first is not None, "release: another token must be able to take the key at once"
        second = leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        assert second is None, _two_holders(first, second)
        leases.release(KEY, "token-b")
        assert leases.acquire(KEY, "token-a", "node-a", TTL_MS) is not None, (
            "release: the former holder must be able to take the key back"
        )

    # --- two clients of one store ----------------------------------------------------------

    def test_another_client_is_refused_while_the_key_is_held(
        self, leases: LeasePort, contender: LeasePort
    ) -> None:
        held = leases.acquire(KEY, "token-a", "node-a", TTL_MS)

        second = contender.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert second is None, _two_holders(held, second, "by another client")
        current = contender.current(KEY)
        assert current == held, (
            f"{MUTUAL_EXCLUSION}: another client must see the holder's lease; "
            f"held {held}, seen {current}"
        )

    def test_another_client_takes_over_an_expired_lease(
        self, leases: LeasePort, contender: LeasePort, clock: ManualClock
    ) -> None:
        leases.acquire(KEY, "token-a", "node-a", TTL_MS)
        _advance_ms(clock, TTL_MS + 1)

        taken = contender.acquire(KEY, "token-b", "node-b", TTL_MS)

        assert taken is not None, f"{EXPIRY}: another client must be able to take an expired lease"
        with _must_raise(LeaseNotOwned, f"{MUTUAL_EXCLUSION}: renew by a deposed client"):
            leases.renew(KEY, "token-a", TTL_MS)
        current = leases.current(KEY)
        assert current is not None, f"{MUTUAL_EXCLUSION}: the new holder's lease was lost"
        assert (current.token, current.holder) == ("token-b", "node-b"), (
            f"{MUTUAL_EXCLUSION}: the deposed client sees {current}"
        )

    # --- mutual exclusion under concurrency ------------------------------------------------

    def test_threads_racing_to_acquire_a_free_key_yield_exactly_one_holder(
        self, leases: LeasePort, contender: LeasePort
    ) -> None:
        # Half the threads go through each client: exclusion within one client and between two.
        clients = [leases if n % 2 == 0 else contender for n in range(THREADS)]
        barrier = threading.Barrier(THREADS)

        def contend(client: LeasePort, key: str, token: str) -> Lease | None:
            barrier.wait(timeout=30)  # start every acquire together
            return client.acquire(key, token, f"thread-{token}", TTL_MS)

        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            for round_no in range(THREAD_ROUNDS):
                key = f"thread-race-{round_no}"
                futures = [
                    pool.submit(contend, client, key, uuid.uuid4().hex) for client in clients
                ]
                won = [lease for f in futures if (lease := f.result(timeout=60)) is not None]

                assert len(won) == 1, (
                    f"{MUTUAL_EXCLUSION}: {len(won)} of {THREADS} racing threads acquired {key} "
                    f"(round {round_no}): {[lease.token for lease in won]}"
                )
                for client in (leases, contender):
                    current = client.current(key)
                    assert current is not None, f"acquire: {key} was won, but nobody holds it"
                    assert current.token == won[0].token, (
                        f"{MUTUAL_EXCLUSION}: {won[0].token} won {key}, "
                        f"but {current.token} holds it"
                    )


def _advance_ms(clock: ManualClock, ms: int) -> None:
    clock.advance(ms / 1000)


def _two_holders(held: Lease | None, second: Lease | None, when: str = "") -> str:
    """The message for a second token granted a held key."""
    holder = "nobody" if held is None else held.token
    granted = "" if second is None else second.token
    return (
        f"{MUTUAL_EXCLUSION}: {granted} was granted {KEY!r} while {holder} held it"
        + (f" ({when})" if when else "")
        + f"; held {held}, granted {second}"
    )


@contextmanager
def _must_raise(error: type[LeaseError], guarantee: str) -> Iterator[None]:
    """Fail, naming `guarantee`, unless the block raises `error`.

    Unlike pytest.raises this says which guarantee was broken, also when the block raised
    another lease error (anything else propagates as the bug it is)."""
    try:
        yield
    except error:
        return
    except LeaseError as other:
        pytest.fail(f"{guarantee}: must raise {error.__name__}, raised {other!r}")
    pytest.fail(f"{guarantee}: must raise {error.__name__}, returned normally")
