"""Leased test ports: never ones ``bind(0)`` hands out, and never the same one twice at once."""

import json
import random
import subprocess
import sys
import textwrap

from powerfleet.broker.embedded import free_loopback_port
from powerfleet.testing.ports import PortLease, ephemeral_low, leasable_range


def test_leased_ports_lie_below_the_ephemeral_range_that_probed_ports_come_from(tmp_path) -> None:
    with PortLease(4, lock_dir=tmp_path) as lease:
        assert len(set(lease.ports)) == 4
        assert all(p < ephemeral_low() and p in leasable_range() for p in lease.ports), lease.ports
        probed = {free_loopback_port() for _ in range(50)}
        assert not probed & set(lease.ports)
        assert min(probed) >= ephemeral_low(), sorted(probed)[:3]


def _lease_in_a_child(lock_dir, seed: int) -> list[int]:
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, random
        from pathlib import Path
        from powerfleet.testing.ports import PortLease
        print(json.dumps(PortLease(3, lock_dir=Path({str(lock_dir)!r}), rng=random.Random({seed})).ports))
    """)], capture_output=True, text=True, check=True)
    return json.loads(child.stdout)


def test_a_port_held_by_another_process_is_not_leased_until_it_lets_go(tmp_path) -> None:
    # The same seed draws the same order, so only the lock keeps the second lease off the first's ports.
    with PortLease(3, lock_dir=tmp_path, rng=random.Random(7)) as first:
        held = first.ports
        assert not set(_lease_in_a_child(tmp_path, 7)) & set(held)
    # Released: the same draw gets them back (all three unless a parallel test binds one meanwhile).
    assert set(_lease_in_a_child(tmp_path, 7)) & set(held)
