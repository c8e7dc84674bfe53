"""The latency-bandwidth fit on curves whose answer is known."""

import pytest

from microbench.core.fit import fit_latency_bandwidth


def rows_for(latency_us, peak_gbps, factor, sizes, placement="out"):
    rows = []
    for size in sizes:
        t_us = latency_us + size * factor / (peak_gbps * 1e9) * 1e6
        algbw = size / (t_us * 1e-6) / 1e9
        rows.append({"size_bytes": size, "placement": placement, "time_us": {"p50": t_us},
                     "algbw_gbps": algbw, "busbw_gbps": algbw * factor})
    return rows


SIZES = [1 << p for p in range(10, 31, 2)]  # 1K .. 1G


@pytest.mark.parametrize("latency_us, peak_gbps, factor", [(25.0, 10.0, 1.0), (5.0, 180.0, 1.75), (800.0, 1.2, 0.5)])
def test_recovers_an_exact_model(latency_us, peak_gbps, factor):
    fit = fit_latency_bandwidth(rows_for(latency_us, peak_gbps, factor, SIZES))
    assert fit["points"] == len(SIZES)
    assert fit["latency_us"] == pytest.approx(latency_us, rel=1e-6)
    assert fit["peak_busbw_gbps"] == pytest.approx(peak_gbps, rel=1e-6)
    # Half the peak where S*factor = latency * peak.
    assert fit["half_peak_size_bytes"] == pytest.approx(latency_us * 1e-6 * peak_gbps * 1e9 / factor, rel=1e-4, abs=1)
    bound = [s for s in SIZES if s >= 4 * fit["half_peak_size_bytes"]]
    assert fit["bw_bound_sizes"] == len(bound)
    # Sizes >= 4x the half-peak size reach at least 80% of the peak.
    assert peak_gbps * 0.8 <= fit["avg_busbw_bw_bound_gbps"] <= peak_gbps


def test_prefers_out_of_place_rows():
    rows = rows_for(10, 5, 1.0, SIZES, "in") + rows_for(20, 2, 1.0, SIZES, "out")
    fit = fit_latency_bandwidth(rows)
    assert fit["placement"] == "out"
    assert fit["peak_busbw_gbps"] == pytest.approx(2, rel=1e-6)


def test_in_place_only_ops_fit_their_in_place_rows():
    fit = fit_latency_bandwidth(rows_for(10, 5, 2.0, SIZES, "in"))
    assert fit["placement"] == "in"
    assert fit["peak_busbw_gbps"] == pytest.approx(5, rel=1e-6)


def test_flat_curve_is_latency_bound_everywhere():
    rows = [{"size_bytes": s, "placement": "out", "time_us": {"p50": 100.0}, "algbw_gbps": s / 1e-4 / 1e9,
             "busbw_gbps": s / 1e-4 / 1e9} for s in (1024, 4096, 16384)]
    fit = fit_latency_bandwidth(rows)
    assert fit["peak_busbw_gbps"] == pytest.approx(max(r["busbw_gbps"] for r in rows))
    assert fit["latency_us"] >= 0
    assert fit["bw_bound_sizes"] >= 1


def test_single_point_and_no_point():
    one = fit_latency_bandwidth(rows_for(0, 3, 1.0, [1 << 20]))
    assert one["points"] == 1 and one["peak_busbw_gbps"] == pytest.approx(3, rel=1e-6)
    assert one["bw_bound_basis"]
    assert fit_latency_bandwidth([])["points"] == 0
