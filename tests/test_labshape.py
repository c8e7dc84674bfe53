"""Reading a lab's shaping back from tc and putting it back after a temporary reshape."""

from __future__ import annotations

import re
import subprocess

import pytest

from microbench.lab import shaping as labshape

FILTERS = """filter parent 1: protocol ip pref 1 u32 chain 0
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:10 not_in_hw
  match 0ad50002/ffffffff at 16
filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::801 order 2049 key ht 800 bkt 0 *flowid 1:11 not_in_hw
  match 0ad50004/ffffffff at 16
"""
CLASSES = """class htb 1:10 root prio 0 rate 200Mbit ceil 200Mbit burst 262100b cburst 262100b
class htb 1:11 root prio 0 rate 100Gbit ceil 100Gbit burst 125000000b cburst 125000000b
class htb 1:2 root prio 0 rate 1Gbit ceil 1Gbit burst 1250000b cburst 1250000b
"""


def test_parse_htb_links_maps_each_filtered_peer_to_its_class_rate():
    assert labshape.parse_htb_links(CLASSES, FILTERS) == [("10.213.0.2", 2 * 10**8), ("10.213.0.4", None)]
    assert labshape.parse_htb_links("", "") == []


def test_current_keeps_only_the_exceptions_and_each_link_once():
    plan = labshape.current(10**9, {0: 10**9, 1: 10**9, 2: 10**8, 3: 10**9},
                            {0: [(1, 2 * 10**8)], 1: [(0, 2 * 10**8)], 2: [], 3: []})
    assert plan == labshape.Shaping(10**9, {2: 10**8}, {(0, 1): 2 * 10**8})


def _tc(name: str, hosts: int) -> list[str]:
    """Each host's qdisc, class and filter configuration; htb's direct_packets_stat is a packet
    counter (a packet sent before the classes exist bumps it), not configuration."""
    out = []
    for i in range(hosts):
        for what in ("qdisc", "class", "filter"):
            out.append(subprocess.run(["tc", "-n", f"mb-{name}-h{i}", what, "show", "dev", "lab0"],
                                      capture_output=True, text=True, check=True).stdout)
    return [re.sub(r"direct_packets_stat \d+ ", "", text) for text in out]


@pytest.mark.slow
@pytest.mark.root
def test_link_profiles_put_back_the_host_and_pair_exceptions(run_cli, lab_name):
    from microbench.lab import namespaces as labmod

    up = run_cli("lab", "up", "--hosts", "3", "--link", "1gbit", "--host-link", "h2=100mbit",
                 "--pair-link", "h0-h1=200mbit", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    before = _tc(lab_name, 3)
    assert "rate 100Mbit" in before[6] and "rate 200Mbit" in before[1] and "0ad50002" in before[2]
    plan = labmod.current_shaping(labmod.get(lab_name))
    assert plan == labshape.Shaping(10**9, {2: 10**8}, {(0, 1): 2 * 10**8})

    done = run_cli("nccl", "--lab", lab_name, "--link-profiles", "1gbit,100mbit", "--sizes", "64K",
                   "--ops", "all_reduce", "--warmup", "1", "--iters", "2", "--budget", "0.3", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ratio = 100mbit / 1gbit" in done.stdout
    assert _tc(lab_name, 3) == before


@pytest.mark.slow
@pytest.mark.root
def test_restore_after_a_plain_reshape_with_only_a_host_exception(lab_name):
    from microbench.lab import namespaces as labmod

    labmod.up(lab_name, 4, 10**9, host_rates={2: 10**8})
    before = _tc(lab_name, 4)
    lab = labmod.get(lab_name)
    plan = labmod.current_shaping(lab)
    labmod.shape(lab_name, 10**8)
    assert _tc(lab_name, 4) != before
    labmod.restore(lab, plan)
    assert _tc(lab_name, 4) == before
