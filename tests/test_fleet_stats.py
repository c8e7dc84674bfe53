"""The fleet gate's statistics and verdicts on golden inputs (pure: no records, no I/O)."""

from __future__ import annotations

import math
import statistics

import pytest

from microbench.accept.fleet import stats
from microbench.accept.fleet.groups import Group, NodePrint, drift, flat_fingerprint, peer_groups
from microbench.accept.fleet.metrics import Sample
from microbench.accept.fleet.verdicts import (choose_sizes, findings_of, fleet_lines, merged_values, node_verdict,
                                              sister_lines)


def test_robust_sigma_is_1_4826_mad():
    values = [10.0, 11.0, 12.0, 13.0, 100.0]
    # median 12, absolute deviations 2, 1, 0, 1, 88 -> MAD 1
    assert stats.median(values) == 12.0
    assert stats.robust_sigma(values) == pytest.approx(1.4826)


def test_k_keeps_a_healthy_fleet_within_its_budget_in_95_percent_of_runs():
    # budget 1: lambda with P(Poisson <= 1) = 0.95 is 0.3554; over 20,000 tests p = 1.78e-5
    lam = stats.expected_false_flags(1)
    assert lam == pytest.approx(0.3554, abs=1e-3)
    assert stats.poisson_cdf(1, lam) == pytest.approx(0.95, abs=1e-6)
    k = stats.k_for_budget(1, 20_000)
    assert k == pytest.approx(statistics.NormalDist().inv_cdf(1 - lam / 20_000))
    assert 4.0 < k < 4.3
    # budget 0: no false flag in 95% of runs (lambda = -ln 0.95); a larger budget lowers k
    assert stats.expected_false_flags(0) == pytest.approx(-math.log(0.95), rel=1e-4)
    assert stats.k_for_budget(0, 100) > stats.k_for_budget(1, 100) > stats.k_for_budget(5, 100)


def test_a_budget_that_allows_half_the_tests_is_refused():
    with pytest.raises(ValueError, match="half"):
        stats.k_for_budget(70, 100)


def test_flagged_needs_both_z_and_the_minimum_fraction():
    peers = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.0]
    # a tight fleet: 97 is many MADs away but only 3% worse: not flagged
    tight = stats.gate_one(97.0, peers, 3.0, 0.05, True)
    assert tight.z is not None and tight.z < -3 and not tight.flagged
    # 90 is 10% worse and far in z: flagged; the band's edge is the stricter of the two
    bad = stats.gate_one(90.0, peers, 3.0, 0.05, True)
    assert bad.flagged and bad.edge == pytest.approx(95.0)
    # a latency: higher is worse
    slow = stats.gate_one(112.0, peers, 3.0, 0.05, False)
    assert slow.flagged and slow.worse_fraction == pytest.approx(0.12)


def test_identical_peers_leave_the_decision_to_the_fraction():
    g = stats.gate_one(80.0, [100.0] * 7, 4.0, 0.05, True)
    assert g.sigma == 0 and g.z == -math.inf and g.flagged
    same = stats.gate_one(100.0, [100.0] * 7, 4.0, 0.05, True)
    assert same.z is None and not same.flagged


def test_under_eight_nodes_each_node_is_held_against_the_others():
    values = {"a": 10.0, "b": 10.2, "c": 9.9, "d": 10.1, "e": 5.0}
    gates = stats.gate(values, 3.0, 0.05, True)
    assert gates["e"].reference == pytest.approx(stats.median([10.0, 10.2, 9.9, 10.1]))
    assert gates["e"].flagged and not any(gates[n].flagged for n in "abcd")
    # with 8 or more the group's own median and MAD
    eight = {f"n{i}": 10.0 + 0.1 * (i % 3) for i in range(8)} | {"bad": 5.0}
    gates = stats.gate(eight, 3.0, 0.05, True)
    assert gates["bad"].reference == stats.median(list(eight.values())) and gates["bad"].flagged


def test_noise_turns_a_flag_into_fail_or_inconclusive():
    g = stats.gate_one(80.0, [100.0, 101.0, 99.0, 100.5], 3.0, 0.05, True)
    assert stats.noise_verdict(g, best=85.0, higher_better=True) == "FAIL"        # best still past the edge
    assert stats.noise_verdict(g, best=99.0, higher_better=True) == "INCONCLUSIVE"  # reaches back into the band
    ok = stats.gate_one(100.0, [100.0, 101.0, 99.0, 100.5], 3.0, 0.05, True)
    assert stats.noise_verdict(ok, best=100.0, higher_better=True) == "PASS"


def test_repeats_merge_to_the_median_and_the_widest_range():
    assert stats.merge_repeats([(10, 9, 11), (8, 7, 9), (12, 11, 13)], True) == (10, 7, 13)
    assert stats.merge_repeats([(10, 11, 9), (8, 9, 7)], False) == (9, 11, 7)


def _sample(metric: str, value: float, size: int | None = 1 << 20, *, best: float | None = None, position: str = "",
            higher: bool = True, kind: str = "memory") -> Sample:
    return Sample("memory", metric, size, value, value, value if best is None else best, higher, kind,
                  "host memory (golden)", position)


def test_each_metric_is_compared_at_one_size():
    samples = {f"n{i}": [_sample("m copy_gbps", 10, 1 << 20), _sample("m copy_gbps", 20, 1 << 28),
                         _sample("lat rtt_us_p50", 5, 8, higher=False), _sample("lat rtt_us_p50", 50, 1 << 20, higher=False)]
               for i in range(4)}
    samples["n9"] = [_sample("m copy_gbps", 30, 1 << 30)]     # a size only one node measured
    sizes = choose_sizes(samples)
    assert sizes[("m copy_gbps", "")] == 1 << 28     # the largest most nodes have, for a bandwidth
    assert sizes[("lat rtt_us_p50", "")] == 8        # the smallest, for a latency


def test_golden_fleet_lines_name_the_outlier_and_its_device():
    samples = {f"n{i}": [_sample("memory memcpy copy_gbps", v, best=v * 1.02)]
               for i, v in enumerate([10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.02, 4.0, 9.98])}
    samples["n7"] = [_sample("memory memcpy copy_gbps", 4.0, best=4.1)]
    merged = merged_values(samples, choose_sizes(samples))
    lines = fleet_lines("g", merged, 3.5, 0.05)
    bad = [line for line in lines if line.verdict != "PASS"]
    assert [(line.node, line.verdict) for line in bad] == [("n7", "FAIL")]
    assert bad[0].ratio == pytest.approx(0.4, abs=0.01) and bad[0].device == "host memory (golden)"
    assert bad[0].metric == "memory memcpy copy_gbps @ 1M"
    assert "worse than the median" in bad[0].reason
    assert findings_of(bad) == ["memory failed on host memory (golden) (1 metric, median ratio 0.40x)"]


def test_a_flagged_node_whose_best_iteration_is_in_the_band_is_inconclusive():
    samples = {f"n{i}": [_sample("x bw_gbps", 10.0 + 0.01 * i)] for i in range(8)}
    samples["n8"] = [_sample("x bw_gbps", 8.0, best=10.0)]
    lines = fleet_lines("g", merged_values(samples, choose_sizes(samples)), 3.5, 0.05)
    assert {(line.node, line.verdict) for line in lines if line.verdict != "PASS"} == {("n8", "INCONCLUSIVE")}


def test_sister_devices_name_the_slow_gpu():
    samples = {"n0": [_sample("m h2d copy_gbps", 50.0, position=f"gpu={g}") for g in range(7)]
               + [_sample("m h2d copy_gbps", 30.0, position="gpu=7")]}
    merged = merged_values(samples, choose_sizes(samples))
    lines = sister_lines("n0", merged, 0.05)
    assert [(line.verdict, line.device) for line in lines] == [("FAIL", "host memory (golden) (gpu=7)")]
    assert "60% of the median of its 7 sister device(s)" in lines[0].reason


def test_node_verdict_order():
    assert node_verdict([], ["driver"], []) == "DRIFT"
    assert node_verdict([], [], ["no memory record"]) == "PARTIAL"
    assert node_verdict([], ["driver"], ["x"]) == "DRIFT"
    fail = fleet_lines("g", merged_values({"a": [_sample("x bw_gbps", 1.0)], **{f"p{i}": [_sample("x bw_gbps", 10.0)]
                                                                             for i in range(3)}},
                                          {("x bw_gbps", ""): 1 << 20}), 3.0, 0.05)
    assert node_verdict([line for line in fail if line.node == "a"], ["driver"], []) == "FAIL"


def _env(driver: str = "550.90", gpus: int = 8, memory: int = 1024 << 30) -> dict:
    return {"cpu_model": "EPYC 9654", "cpu_count": 192, "kernel": "6.8", "torch": "2.5", "cuda": "12.4",
            "nccl": "2.21.5", "memory": {"total_bytes": memory},
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "driver": driver} for i in range(gpus)],
            "nics": [{"name": "ib0", "physical": True, "model": "mlx5_core 15b3:101b", "speed_mbps": 400000,
                      "firmware": "28.39"}, {"name": "veth1", "physical": False}]}


def test_drift_names_the_field_and_the_majority():
    prints = {f"n{i}": NodePrint(f"n{i}") for i in range(64)}
    for i, p in enumerate(prints.values()):
        p.add(flat_fingerprint(_env(driver="550.54" if i == 17 else "550.90",
                                    memory=(1024 << 30) + i * (1 << 20))))
    (group,) = peer_groups(prints)
    found, split = drift(group, prints)
    assert found == {"n17": ["gpu_driver 550.54 on n17; 550.90 on 63 of 64"]}
    assert split == []


def test_a_node_whose_own_records_disagree_drifts():
    prints = {f"n{i}": NodePrint(f"n{i}") for i in range(3)}
    for p in prints.values():
        p.add(flat_fingerprint(_env()))
        p.add(flat_fingerprint(_env()))
    prints["n1"].add(flat_fingerprint({**_env(), "kernel": "6.9"}))
    found, _ = drift(peer_groups(prints)[0], prints)
    assert list(found) == ["n1"] and "kernel differs between n1's own records" in found["n1"][0]


def test_kinds_make_groups_and_counts_drift():
    prints = {f"n{i}": NodePrint(f"n{i}") for i in range(4)}
    for i, p in enumerate(prints.values()):
        p.add(flat_fingerprint(_env(gpus=7 if i == 2 else 8)))
    other = NodePrint("a0")
    other.add(flat_fingerprint({**_env(), "gpus": [{"index": 0, "name": "NVIDIA A100", "driver": "550.90"}]}))
    prints["a0"] = other
    groups = peer_groups(prints)
    assert [g.nodes for g in groups] == [["n0", "n1", "n2", "n3"], ["a0"]]
    found, _ = drift(groups[0], prints)
    assert found["n2"][0] == "gpu_count 7 on n2; 8 on 3 of 4"
    # a few MiB of memory apart is the same memory; the veth is no NIC of the fingerprint
    assert flat_fingerprint(_env())["nic_models"] == "mlx5_core 15b3:101b"
    assert isinstance(groups[1], Group)


# --------------------------------------------------------------------------- pairs and cost

from microbench.accept.fleet import cost as fleet_cost  # noqa: E402
from microbench.accept.fleet.pairs import PairSet, judge  # noqa: E402
from microbench.accept.fleet.verdicts import Line  # noqa: E402


def _matrix(hosts: list[str], slow_send: dict[str, float] = {}, slow_links: dict[frozenset, float] = {}) -> PairSet:
    pairs = PairSet()
    for i, a in enumerate(hosts):
        for j, b in enumerate(hosts):
            if a != b:
                gbps = 0.12 * (1 + 0.001 * ((i * 7 + j * 3) % 5))
                gbps *= slow_send.get(a, 1.0) * slow_links.get(frozenset((a, b)), 1.0)
                pairs.add(a, b, gbps)
    return pairs


def test_a_host_slow_with_every_partner_is_the_bad_node():
    hosts = [f"h{i}" for i in range(6)]
    verdicts = judge(_matrix(hosts, slow_send={"h2": 0.5}), 3.0, 0.05, {"h2": "NIC lab0"})
    assert [(line.node, line.verdict, line.device) for line in verdicts.lines] == [("h2", "FAIL", "NIC lab0")]
    assert "slow with 5 of 5 partners" in verdicts.lines[0].reason and "sending" in verdicts.lines[0].metric
    assert verdicts.lines[0].ratio == pytest.approx(0.5, abs=0.01) and verdicts.links == []


def test_a_slow_pair_of_healthy_hosts_is_a_link_with_the_command_that_bisects_it():
    hosts = [f"n{i}" for i in range(5)]
    verdicts = judge(_matrix(hosts, slow_links={frozenset(("n1", "n3")): 0.4}), 3.0, 0.05, {})
    assert verdicts.lines == []
    (link,) = verdicts.links
    assert link.nodes == ["n1", "n3"] and "slow link n1 <-> n3" in link.text
    assert link.command == "srun --nodelist=n1,n3,n0 --ntasks-per-node=1 microbench hunt"
    lab = _matrix(hosts, slow_links={frozenset(("n1", "n3")): 0.4})
    lab.labs.add("fl1")
    assert judge(lab, 3.0, 0.05, {}).links[0].command == "microbench hunt --lab fl1"


def test_a_healthy_node_slow_only_with_two_bad_nodes_is_not_blamed():
    hosts = [f"h{i}" for i in range(6)]
    verdicts = judge(_matrix(hosts, slow_send={"h1": 0.5, "h4": 0.5}), 3.0, 0.05, {})
    assert sorted(line.node for line in verdicts.lines) == ["h1", "h4"] and verdicts.links == []


def _failing(kind: str, ratio: float, median: float, device: str = "dev") -> Line:
    return Line("n7", f"{kind} metric", None, "FAIL", median * ratio, median, ratio, -9.0, device, "", kind, "fleet")


def test_cost_prices_network_compute_and_storage_with_the_composer():
    job = fleet_cost.Job("llama-3.1-8b", 8, 8, "h100", 400.0, 50.0)
    costs = fleet_cost.price(job, "n7", [_failing("network", 0.61, 50.0, "NIC ib0"), _failing("compute", 0.8, 400.0),
                                         _failing("storage", 0.25, 5.0, "disk nvme0"), _failing("memory", 0.5, 20.0)])
    by_kind = {c.kind: c for c in costs}
    assert set(by_kind) == {"network", "compute", "storage", "memory"}
    assert "n7's NIC ib0 at 61% of the fleet makes every step of this job" in by_kind["network"].text
    assert by_kind["network"].slowdown >= 1.0 and by_kind["compute"].slowdown == pytest.approx(1 / 0.8, rel=0.2)
    assert by_kind["storage"].slowdown == pytest.approx(4.0, rel=1e-3) and "checkpoint save" in by_kind["storage"].text
    assert "not priced" in by_kind["memory"].text and by_kind["memory"].slowdown is None
    assert fleet_cost.gpu_name("NVIDIA H100 80GB HBM3") == "h100" and fleet_cost.gpu_name("Tesla T4") is None


def test_large_budgets_use_the_normal_approximation_of_the_poisson_count():
    lam = stats.expected_false_flags(200)
    assert stats.poisson_cdf(200, lam) == pytest.approx(0.95, abs=0.01)
    with pytest.raises(ValueError, match="half"):
        stats.k_for_budget(1e6, 1000)


def test_a_collective_s_node_groups_give_each_node_its_own_figure():
    from microbench.accept.fleet.pairs import collect

    record = {"kind": "nccl", "implementation": {"backend": "nccl", "device": "cuda"},
              "summary": {"topology": {"nodes": 3, "ranks_per_node": 2, "hosts": ["a", "b", "c"]}},
              "rows": [{"op": "all_reduce", "group": "node", "size_bytes": 1 << 20, "busbw_gbps": 100.0,
                        "time_us": {"p50": 400.0}, "per_rank_time_us_p50": [100, 110, 400, 200, 100, 120]},
                       {"op": "all_reduce", "group": "cross", "size_bytes": 1 << 20, "busbw_gbps": 10.0,
                        "time_us": {"p50": 50.0}, "per_rank_time_us_p50": [50] * 6}]}
    found = collect([("groups.json", record)])
    values = {node: [s.value for s in samples] for node, samples in found.node_samples.items()}
    # the node group of b took 400 us (its slowest rank), a's 110 us: a's busbw is 400/110 of the row's
    assert values == {"a": [pytest.approx(100 * 400 / 110)], "b": [100.0], "c": [pytest.approx(100 * 400 / 120)]}
    assert found.node_samples["b"][0].metric == "nccl node group all_reduce busbw_gbps"
    assert any("cross-node groups" in why for why in found.unattributed) and found.values == {}
    unnamed = collect([("old.json", {**record, "summary": {"topology": {"nodes": 3, "ranks_per_node": 2}}})])
    assert unnamed.node_samples == {} and "no host names" in unnamed.unattributed[0]


def test_a_best_iteration_within_the_peers_slowest_iterations_is_inconclusive():
    """compare's noise rule with the fleet as the other run: a node whose fastest iteration was
    as good as a typical peer's slowest is within the fleet's band, whatever its median."""
    g = stats.gate_one(80.0, [100.0, 101.0, 99.0, 100.5], 3.0, 0.05, True)
    worst = stats.typical_worst({"a": 88.0, "b": 89.0, "c": 87.0, "d": 90.0, "n": 70.0})
    assert worst["n"] == 88.5                                  # the others' slowest, not its own
    assert stats.noise_verdict(g, best=90.0, higher_better=True, peers_worst=worst["n"]) == "INCONCLUSIVE"
    assert stats.noise_verdict(g, best=90.0, higher_better=True, peers_worst=97.5) == "FAIL"
    assert stats.noise_edge(g, None, True) == g.edge
    lat = stats.gate_one(120.0, [100.0, 101.0, 99.0, 100.5], 3.0, 0.05, False)
    assert stats.noise_verdict(lat, best=110.0, higher_better=False, peers_worst=112.0) == "INCONCLUSIVE"


def test_the_spread_of_a_group_is_never_tighter_than_its_nodes_repeatability():
    values = {"a": 1.883, "b": 1.884, "c": 1.881, "d": 1.885, "e": 1.713}
    tight = stats.gate(values, 0.001, 0.05, True)
    assert tight["e"].flagged                  # 9% worse, many MADs of four hosts within 0.2%
    noisy = stats.gate(values, 0.001, 0.05, True, spread={n: 0.04 for n in values})
    assert not noisy["e"].flagged and noisy["e"].sigma == pytest.approx(0.04)   # each host's own iterations move 2%
