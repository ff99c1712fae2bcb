"""The host budget shared between tenants (capacity/share.py): dominant resource fairness."""

from __future__ import annotations

from pathlib import Path

from socialweb_computer.capacity import share

NODE = share.Amount(2, 2048, 8192)
TOTAL = share.Amount(8, 8192, 65536)  # room for four such nodes


def test_one_tenant_gets_what_fits() -> None:
    granted = share.share(TOTAL, TOTAL, {}, [share.Demand("a", 10, NODE)])
    assert granted == {"a": 4}


def test_two_tenants_asking_at_once_split_the_budget() -> None:
    granted = share.share(TOTAL, TOTAL, {}, [share.Demand("big", 20, NODE), share.Demand("small", 2, NODE)])
    assert granted == {"big": 2, "small": 2}


def test_the_tenant_holding_less_is_served_first() -> None:
    held = {"a": NODE.times(2)}
    free = TOTAL - NODE.times(2)
    granted = share.share(free, TOTAL, held, [share.Demand("a", 5, NODE), share.Demand("b", 5, NODE)])
    assert granted == {"a": 0, "b": 2}


def test_shares_are_by_the_dominant_resource() -> None:
    # "mem" nodes use half the memory each; "cpu" nodes a quarter of the vCPUs and little memory.
    mem = share.Amount(1, 4096, 1024)
    cpu = share.Amount(2, 512, 1024)
    granted = share.share(TOTAL, TOTAL, {}, [share.Demand("mem", 5, mem), share.Demand("cpu", 5, cpu)])
    # mem's first node is a 1/2 share, cpu's is 1/4: cpu gets nodes until its share passes mem's.
    assert granted == {"mem": 1, "cpu": 3}


def test_a_size_that_no_longer_fits_drops_out_and_smaller_ones_go_on() -> None:
    big = share.Amount(6, 1024, 1024)
    small = share.Amount(1, 512, 1024)
    free = share.Amount(4, 8192, 65536)
    granted = share.share(free, TOTAL, {}, [share.Demand("big", 1, big), share.Demand("small", 3, small)])
    assert granted == {"big": 0, "small": 3}


def test_nothing_free_grants_nothing() -> None:
    assert share.share(share.Amount(), TOTAL, {}, [share.Demand("a", 1, NODE)]) == {"a": 0}


def test_shortage_names_each_short_resource() -> None:
    text = share.describe_shortage(NODE, share.Amount(1, 4096, 100), TOTAL)
    assert text == "vCPU: 1 of 8 free, a node needs 2; disk MiB: 100 of 65536 free, a node needs 8192"


def test_the_budget_defaults_to_the_host(tmp_path: Path) -> None:
    total = share.host_total(tmp_path, None, None, None)
    assert total.vcpu >= 1 and total.memory > 0 and total.disk > 0
    assert share.host_total(tmp_path, 3, 1000, 2000) == share.Amount(3, 1000, 2000)
