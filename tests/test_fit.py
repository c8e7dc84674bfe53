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


def test_an_exact_model_is_fitted():
    fit = fit_latency_bandwidth(rows_for(25.0, 10.0, 1.0, SIZES))
    assert fit["fitted"] is True and "not_fitted" not in fit


def _measured(busbw_by_size):
    """Rows as a noisy 1gbit lab run writes them (factor 1): time from the measured busbw."""
    return [{"size_bytes": s, "placement": "out", "time_us": {"p50": s / (g * 1e9) * 1e6}, "algbw_gbps": g,
             "busbw_gbps": g} for s, g in busbw_by_size]


# The case: busbw falling with size (a noisy 1gbit run); least squares puts the line
# through size 0 below zero (latency clamped to 0.0 us, half of peak at 0 B) and its slope
# under the measured maximum (0.08 vs 0.12 GB/s).
DEGENERATE = [(1 << 20, 0.12), (4 << 20, 0.10), (16 << 20, 0.08), (64 << 20, 0.08)]


def test_a_degenerate_fit_is_not_fitted_and_says_why():
    fit = fit_latency_bandwidth(_measured(DEGENERATE))
    assert fit["latency_us"] == 0.0 and fit["half_peak_size_bytes"] == 0 and fit["peak_busbw_gbps"] < 0.12
    assert fit["fitted"] is False and fit["not_fitted"].startswith(
        "at 1M the model gives 0.0979 GB/s busbw, outside the 0.109-0.132 GB/s measured there (its iterations' "
        "range, at least 10 % either side of the median 0.12 GB/s)")
    assert fit["measured_max_busbw_gbps"] == pytest.approx(0.12)


def test_a_fitted_peak_below_the_measured_maximum_is_not_fitted():
    # A positive latency, but the best point beats the model's peak by 50%.
    rows = rows_for(100.0, 1.0, 1.0, SIZES)
    rows[-3]["busbw_gbps"] = rows[-3]["algbw_gbps"] = 1.5
    rows[-3]["time_us"] = {"p50": rows[-3]["size_bytes"] / 1.5e9 * 1e6}
    fit = fit_latency_bandwidth(rows)
    assert fit["latency_us"] > 0
    assert fit["fitted"] is False and "either side of the median 1.5 GB/s" in fit["not_fitted"]


def test_a_flat_curve_and_a_single_size_are_not_fitted():
    flat = [{"size_bytes": s, "placement": "out", "time_us": {"p50": 100.0}, "algbw_gbps": s / 1e-4 / 1e9,
             "busbw_gbps": s / 1e-4 / 1e9} for s in (1024, 4096, 16384)]
    assert "no size was bandwidth-bound" in fit_latency_bandwidth(flat)["not_fitted"]
    assert "one size" in fit_latency_bandwidth(rows_for(0, 3, 1.0, [1 << 20]))["not_fitted"]


def test_the_nccl_table_prints_not_fitted_with_why_and_no_model():
    from microbench.probes.nccl.table import fit_lines

    lines = fit_lines(fit_latency_bandwidth(_measured(DEGENERATE)))
    assert lines[0].startswith("# fit (out-of-place): not fitted, ")
    assert lines[1] == "# best measured busbw 0.12 GB/s at 1.0 MiB"
    text = "\n".join(lines)
    assert "latency 0.0 us" not in text and "half of peak" not in text
    good = fit_lines(fit_latency_bandwidth(rows_for(25.0, 10.0, 1.0, SIZES)))
    assert good[0].startswith("# fit (out-of-place): latency 25.0 us, peak busbw 10.00 GB/s")


# ------------------------------------------------------------------ the one criterion

def test_times_proportional_to_size_are_fitted_with_no_latency():
    """The 1gbit lab's reduce_scatter: 8791 us at 1M, 17587 us at 2M. The line meets size 0 just
    below zero; that is a link whose per-message cost is lost in its transfer time, not a
    failure: latency 0, the peak the slope gives."""
    rows = [{"size_bytes": s, "placement": "out", "time_us": {"p50": t}, "algbw_gbps": s / t / 1e3,
             "busbw_gbps": s / t / 1e3 * 0.5} for s, t in ((1 << 20, 8791.0), (2 << 20, 17587.0))]
    fit = fit_latency_bandwidth(rows)
    assert fit["fitted"] is True and "not_fitted" not in fit
    assert fit["latency_us"] == 0.0
    assert fit["peak_busbw_gbps"] == pytest.approx(0.0596, rel=1e-3)
    assert fit["fit_max_error_pct"] < 0.1


@pytest.mark.parametrize("peak, best, fitted", [(1.75, 1.77, True), (1.73, 1.83, True), (1.60, 1.83, False)])
def test_a_peak_under_the_best_point_is_judged_by_the_one_tolerance(peak, best, fitted):
    """The issue's pair (1.75 under 1.77 accepted, 1.73 under 1.83 refused): both are within 10 %
    of the model, so both are fitted; 1.60 under 1.83 is 13 % off and is not."""
    rows = rows_for(50.0, peak, 1.0, SIZES)
    at = rows[-2]
    t_us = at["size_bytes"] / (best * 1e9) * 1e6    # the best point, consistent with its own time
    at.update(time_us={"p50": t_us}, algbw_gbps=best, busbw_gbps=best)
    fit = fit_latency_bandwidth(rows)
    assert fit["measured_max_busbw_gbps"] == best
    assert fit["fitted"] is fitted, fit.get("not_fitted")
    if not fitted:
        assert "at least 10 % either side of the median 1.83 GB/s" in fit["not_fitted"]


def test_a_size_whose_iterations_spread_widely_allows_the_model_within_that_spread():
    """The window at a size is what was measured there: a noisy size whose iterations ranged
    over +-40 % does not refuse a model 25 % off its median; a quiet one (+-2 %) would."""
    rows = rows_for(50.0, 2.0, 1.0, SIZES)
    at = rows[4]
    t = at["time_us"]["p50"] * 1.25
    at["time_us"] = {"p50": t, "min": t * 0.6, "max": t * 1.4}
    at["busbw_gbps"] = at["algbw_gbps"] = at["size_bytes"] / (t * 1e-6) / 1e9
    assert fit_latency_bandwidth(rows)["fitted"] is True
    at["time_us"].update(min=t * 0.98, max=t * 1.02)
    assert fit_latency_bandwidth(rows)["fitted"] is False


def test_fit_of_a_world_of_one_has_no_bus_model():
    from microbench.core.fit import fit_latency_bandwidth

    rows = [{"size_bytes": s, "time_us": {"p50": 10 + s / 1e4}, "algbw_gbps": s / (10 + s / 1e4) / 1e3,
             "busbw_gbps": 0.0, "placement": "out"} for s in (1 << 20, 1 << 22)]
    fit = fit_latency_bandwidth(rows)
    assert fit["points"] == 0 and "busbw is 0" in fit["reason"]
