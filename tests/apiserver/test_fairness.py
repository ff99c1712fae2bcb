"""A logical cluster's share of the gateway (apiserver.fairness) and upstream's slow-start
batches (controllers.podcontrol), checked directly; tests/gateway/test_isolation.py drives the
same limits through a real gateway."""

from __future__ import annotations

import asyncio

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import fairness
from socialweb_computer.controllers import podcontrol


async def test_creates_past_a_limit_are_a_quota_style_403_after_a_recount() -> None:
    budget = fairness.Budget(fairness.Limits(objects=3, pods=2))
    counts = {"objects": 2, "pods": 2}

    async def recount() -> tuple[int, int]:
        return counts["objects"], counts["pods"]

    budget.set_counter(recount)
    await budget.load()
    with pytest.raises(errors.StatusError) as refused:
        await budget.admit_create("", "pods", "web-1")
    assert (refused.value.code, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message.startswith(
        'pods "web-1" is forbidden: exceeded the cluster\'s limit: requested: pods=1, used: pods=2, '
        "limited: pods=2")
    await budget.admit_create("", "configmaps", "c")  # objects: 2 of 3
    budget.on_write("", "configmaps", "ADDED")
    counts["objects"] = 3
    with pytest.raises(errors.StatusError):
        await budget.admit_create("", "configmaps", "d")
    await budget.admit_create("", "events", "e")  # Events are not counted
    counts["objects"], counts["pods"] = 1, 0  # gone without hooks (a CRD's objects): the recount sees it
    budget.on_write("", "pods", "DELETED")
    await budget.admit_create("", "pods", "web-2")


async def test_watches_and_requests_in_flight() -> None:
    budget = fairness.Budget(fairness.Limits(watches=1, requests_in_flight=1))
    with budget.watch_slot():
        with pytest.raises(errors.StatusError) as refused, budget.watch_slot():
            pass
        assert refused.value.code == 429
    with budget.watch_slot():
        pass
    async with budget.request_turn():
        with pytest.raises(errors.StatusError) as busy:
            async with budget.request_turn():
                pass
        assert (busy.value.code, busy.value.retry_after) == (429, 1)


async def test_requests_take_turns() -> None:
    budget = fairness.Budget()
    running = peak = 0

    async def request() -> None:
        nonlocal running, peak
        async with budget.request_turn():
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1

    await asyncio.gather(*(request() for _ in range(20)))
    assert peak == fairness.TURNS


async def test_the_write_budget_paces_writes() -> None:
    moments = [0.0]
    bucket = fairness.TokenBucket(rate=10, burst=2, now=lambda: moments[0])
    await bucket.acquire()
    await bucket.acquire()
    waited = asyncio.ensure_future(bucket.acquire())
    await asyncio.sleep(0)
    assert not waited.done()  # the burst is spent: the third waits for a token
    moments[0] = 0.2
    await asyncio.wait_for(waited, 2)


async def test_slow_start_doubles_batches_and_stops_at_the_first_failure() -> None:
    made: list[int] = []

    async def make() -> None:
        if len(made) == 6:
            raise errors.StatusError(403, "Forbidden", "no more")
        made.append(len(made))

    assert await podcontrol.slow_start(3, make) == 3
    made.clear()
    with pytest.raises(errors.StatusError):
        await podcontrol.slow_start(100, make)
    assert len(made) == 6  # batches 1, 2, 4: the seventh call failed and nothing more was tried


async def test_a_cluster_alone_never_waits_for_the_loop() -> None:
    budget = fairness.Budget(share=fairness.LoopShare())
    budget.charge(10.0)  # far more than any share: alone, nothing is owed
    waiting = asyncio.ensure_future(budget.wait_for_share())
    await asyncio.sleep(0)
    assert waiting.done()
    assert budget.statistics()["loopSeconds"] == 10.0


async def test_a_cluster_that_kept_the_loop_busy_waits_and_its_neighbour_does_not() -> None:
    moments = [100.0]
    share = fairness.LoopShare()
    busy = fairness.Budget(share=share, now=lambda: moments[0])
    quiet = fairness.Budget(share=share, now=lambda: moments[0])
    quiet.charge(0.001)
    busy.charge(1.0)  # a second of the loop while the neighbour competed for it
    neighbour_waits = asyncio.ensure_future(quiet.wait_for_share())
    busy_waits = asyncio.ensure_future(busy.wait_for_share())
    await asyncio.sleep(0)
    assert neighbour_waits.done()  # within its share: served at once
    assert not busy_waits.done()  # in debt: waits, earning half the clock (two compete)
    moments[0] += 0.1
    quiet.charge(0.001)  # the neighbour is still there: not yet
    await asyncio.sleep(0)
    assert not busy_waits.done()
    moments[0] += 2.0  # half of two seconds pays the debt back
    await asyncio.wait_for(busy_waits, 5)


async def test_a_neighbour_that_left_no_longer_holds_a_share() -> None:
    moments = [100.0]
    share = fairness.LoopShare()
    busy = fairness.Budget(share=share, now=lambda: moments[0])
    gone = fairness.Budget(share=share, now=lambda: moments[0])
    gone.charge(0.001)
    busy.charge(5.0)
    assert share.competing(busy, moments[0]) == 2
    moments[0] += fairness.LoopShare.ACTIVE + 0.1  # the neighbour has used nothing since
    assert share.competing(busy, moments[0]) == 1
    await asyncio.wait_for(busy.wait_for_share(), 5)  # alone again: the debt is forgiven


async def test_charged_work_is_timed_step_by_step_and_behaves_as_awaited() -> None:
    budget = fairness.Budget(share=fairness.LoopShare())
    steps: list[float] = []
    budget.charge = steps.append  # type: ignore[method-assign]

    async def work(fail: bool) -> str:
        for _ in range(3):
            await asyncio.sleep(0)
        if fail:
            raise ValueError("no")
        return "done"

    assert await budget.charged(work(False)) == "done"
    assert len(steps) == 4  # three suspensions, four steps
    with pytest.raises(ValueError, match="no"):
        await budget.charged(work(True))

    # A cancellation reaches the work (its cleanup runs) and leaves as a cancellation.
    cleaned = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    task = asyncio.ensure_future(budget.charged(forever()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


async def test_work_cancelled_while_its_cluster_waits_is_closed_unstarted() -> None:
    moments = [100.0]
    share = fairness.LoopShare()
    busy = fairness.Budget(share=share, now=lambda: moments[0])
    neighbour = fairness.Budget(share=share, now=lambda: moments[0])
    neighbour.charge(0.001)
    busy.charge(1.0)
    started = False

    async def work() -> None:
        nonlocal started
        started = True

    pending = work()
    task = asyncio.ensure_future(busy.charged(pending))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not started and pending.cr_frame is None  # closed: no "never awaited" warning
