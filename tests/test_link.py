"""The link probe: loopback ranks (native and Python loops), lab hosts, a link taken down
mid-sweep, and the nccl comparisons that use the lab and the link result."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest

from microbench.targets import fallback, native

from conftest import last_line

QUICK = ("--warmup", "1", "--iters", "3", "--budget", "0.5")


def _pair():
    a, b = socket.socketpair()
    for s in (a, b):
        s.setblocking(False)
    return a, b


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_python_loop_matches_the_protocol(mode):
    a, b = _pair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(1, fallback.tcp_link([b], 1, mode, 300_000, 3, 10)))
    t.start()
    out[0] = fallback.tcp_link([a], 0, mode, 300_000, 3, 10)
    t.join(20)
    assert len(out[0]) == 3 and len(out[1]) == 3 and all(x > 0 for x in out[0] + out[1])


@pytest.mark.skipif(not native.available(), reason="native module not built")
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_native_loop_interoperates_with_python_loop(mode):
    a, b = _pair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(1, fallback.tcp_link([b], 1, mode, 100_000, 2, 10)))
    t.start()
    out[0] = native.module().tcp_link([a.fileno()], 0, mode, 100_000, 2, 10.0)
    t.join(20)
    assert len(out[0]) == 2 and len(out[1]) == 2


@pytest.mark.xdist_group("timed")
@pytest.mark.skipif(not native.available(), reason="native module not built")
def test_native_loop_times_out_when_the_peer_is_silent():
    a, _b = _pair()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        native.module().tcp_link([a.fileno()], 1, 0, 1 << 20, 1, 0.3)
    assert time.monotonic() - start < 5


@pytest.mark.slow
@pytest.mark.parametrize("no_native", ["0", "1"])
def test_link_loopback_cli(run_cli, tmp_path, no_native):
    proc = run_cli("link", "--sizes", "1M-2M", "--lat-sizes", "8,4K", "--streams", "2", "--json", "l.json", *QUICK,
                   env={"MICROBENCH_NO_NATIVE": no_native})
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "l.json").read_text())
    assert record["implementation"]["name"] == ("python" if no_native == "1" else "native")
    ops = {(r["op"], r["size_bytes"]) for r in record["rows"]}
    assert ("uni", 1 << 20) in ops and ("bidir", 2 << 20) in ops and ("rtt", 8) in ops
    rtt = next(r for r in record["rows"] if r["op"] == "rtt")
    assert 0 < rtt["rtt_us_p50"] <= rtt["rtt_us_p99"] and rtt["rtt_samples"] >= 3
    assert record["summary"]["link_gbps"] > 0 and "rtt" in proc.stdout


@pytest.mark.parametrize("args,needle", [(["--streams", "0"], "--streams"), (["--streams", "65"], "--streams"),
                                         (["--ops", "tx"], "--ops"), (["--lat-sizes", "1Q"], "--lat-sizes")])
def test_link_bad_input(cli, args, needle):
    proc = cli("link", *args)
    assert proc.returncode == 2 and needle in last_line(proc.stderr) and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.root
def test_link_on_lab_and_link_result_feeds_nccl(run_cli, lab, tmp_path):
    proc = run_cli("link", "--lab", lab.name, "--sizes", "1M-4M", "--lat-sizes", "8", "--json", "link.json", *QUICK)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "link.json").read_text())
    assert record["implementation"]["hosts"][1].startswith(f"mb-{lab.name}-h1")
    # 1 Gbit/s is 0.125 GB/s; anything far above it would mean the traffic bypassed the shaper.
    assert 0 < record["summary"]["link_gbps"] < 0.2
    nccl = run_cli("nccl", "--lab", lab.name, "--sizes", "1M-2M", "--ops", "all_gather", "--link-result", "link.json",
                   *QUICK, timeout=240)
    assert nccl.returncode == 0, nccl.stderr
    assert "% of the measured link" in nccl.stdout


def test_nccl_link_result_must_be_a_link_record(cli, tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"kind": "nccl", "summary": {}}))
    proc = cli("nccl", "--sizes", "1M", "--link-result", "x.json")
    assert proc.returncode == 2 and "not a finished `microbench link` record" in last_line(proc.stderr)


def test_link_profiles_need_a_lab(cli):
    proc = cli("nccl", "--link-profiles", "1gbit,unlimited")
    assert proc.returncode == 2 and "needs --lab" in last_line(proc.stderr)


@pytest.mark.slow
@pytest.mark.root
def test_nccl_link_profiles_side_by_side(run_cli, lab):
    proc = run_cli("nccl", "--lab", lab.name, "--link-profiles", "100mbit,unlimited", "--sizes", "1M",
                   "--ops", "all_gather", *QUICK, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "ratio = unlimited / 100mbit" in proc.stdout
    ratio_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("all_gather"))
    assert ratio_line.rstrip().endswith("x")
    # The lab's own shaping is back after the comparison.
    from microbench.lab import namespaces as labmod
    assert labmod.find(lab.name).rate == "1gbit"


@pytest.mark.slow
@pytest.mark.root
def test_link_taken_down_mid_sweep_names_the_host_and_keeps_rows(run_cli, lab, tmp_path):
    result = {}
    veth = f"mb-{lab.name}-v1"

    def run():
        result["proc"] = run_cli("link", "--lab", lab.name, "--ops", "uni", "--sizes", "1M-64M", "--timeout", "8",
                                 "--json", "down.json", "--warmup", "0", "--iters", "3", timeout=200)

    worker = threading.Thread(target=run)
    worker.start()
    taken_down_at = None
    deadline = time.monotonic() + 150
    while worker.is_alive() and time.monotonic() < deadline:
        try:
            rows = json.loads((tmp_path / "down.json").read_text())["rows"]
        except (OSError, ValueError, KeyError):
            rows = []
        if len(rows) >= 1:
            subprocess.run(["ip", "link", "set", veth, "down"], check=True)
            taken_down_at = time.monotonic()
            break
        time.sleep(0.1)
    worker.join(200)
    assert taken_down_at is not None, "the sweep never finished a size"
    proc = result["proc"]
    # Ends within --timeout (8 s) of the failure, plus teardown of the two ranks.
    assert time.monotonic() - taken_down_at < 8 + 20
    assert proc.returncode == 1, proc.stdout
    line = last_line(proc.stderr)
    assert f"mb-{lab.name}-h1" in line and "link down" in line and "partial" in line
    record = json.loads((tmp_path / "down.json").read_text())
    assert record["status"] == "partial" and len(record["rows"]) >= 1
