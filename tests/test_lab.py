"""The lab: pure parsing and tc commands here; real namespaces in the tests that use the
`lab` fixture (they need root; they skip, with the reason, where namespaces are refused)."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from conftest import last_line, one_error_line

from microbench.core.errors import UsageError
from microbench.core.units import format_link_rate, parse_link_rate
from microbench.lab import namespaces as labmod
from microbench.lab import parsers as labparse
from microbench.lab.placement import _without, profiles_table
from microbench.lab.shaping import parse_shaping, shape_commands, tbf_buckets

# ---------------------------------------------------------------------- pure logic


@pytest.mark.parametrize("text,bps", [("1gbit", 10**9), ("100mbit", 10**8), ("10Gbit", 10**10),
                                      ("2.5gbit", 25 * 10**8), ("unlimited", None)])
def test_parse_rate(text, bps):
    assert parse_link_rate(text) == bps


@pytest.mark.parametrize("text", ["1gbt", "fast", "1 gb", "-1gbit", "1gbps", ""])
def test_parse_rate_rejects(text):
    with pytest.raises(UsageError, match="expected a rate"):
        parse_link_rate(text)


@pytest.mark.parametrize("text", ["0", "1", "-3", "two", "65"])
def test_parse_hosts_rejects(text):
    with pytest.raises(UsageError, match="--hosts"):
        labparse.parse_hosts(text)


@pytest.mark.parametrize("name", ["a-b", "UPPER", "toolongname", ""])
def test_check_name_rejects(name):
    with pytest.raises(UsageError, match="--name"):
        labmod.check_name(name)


def test_format_rate_round_trips():
    for text in ("1gbit", "100mbit", "10gbit", "unlimited"):
        assert format_link_rate(parse_link_rate(text)) == text


def test_shape_commands_tbf_burst_covers_a_timer_tick():
    cmds = shape_commands("mb-x-h0", 10**9, 0.0)
    tbf = cmds[-1]
    assert "tbf" in tbf and tbf[tbf.index("rate") + 1] == "1000000000bit"
    # At least 4 ms of the rate, or the shaper cannot keep the line busy between ticks.
    assert int(tbf[tbf.index("burst") + 1]) >= 10**9 / 8 * 0.004


def _tbf(cmd: list[str]) -> dict[str, str]:
    tbf = cmd[cmd.index("tbf") + 1:]
    return dict(zip(tbf[::2], tbf[1::2]))


def _idle_credit_s(rate_bps: float, burst: int, peak_bps: float | None = None, peak_bucket: int = 0) -> float:
    """How much sooner than its rate allows a link idle long enough delivers its next `burst`
    bytes: without a peak rate the whole bucket leaves at once; with one, the peak bucket leaves
    at once and the rest at the peak rate."""
    at_rate = burst * 8 / rate_bps
    if peak_bps is None:
        return at_rate
    return at_rate - max(0, burst - peak_bucket) * 8 / peak_bps


@pytest.mark.parametrize("rate", [10**8, 10**9, 10**10])
def test_shape_commands_peak_rate_caps_what_an_idle_link_hands_out(rate):
    """A training step idles its links during compute and a probe times collectives back to
    back: the shaped link must not give the first carries credit that the second never gets."""
    args = _tbf(shape_commands("mb-x-h0", rate, 0.0)[-1])
    burst, peak, bucket = int(args["burst"]), int(args["peakrate"].removesuffix("bit")), int(args["mtu"])
    assert (burst, peak, bucket) == tbf_buckets(rate)
    assert peak > rate                         # the kernel refuses a peak rate at or below the rate
    assert bucket >= 64 * 1024                 # a whole GSO packet passes unsplit
    assert bucket * 8 / peak >= 0.001          # what one late wakeup may send: a millisecond at the peak
    credit = _idle_credit_s(rate, burst, peak, bucket)
    # tbf alone hands out its whole burst (10 ms of the rate at 1gbit and above); the peak rate
    # leaves at most its own bucket plus a tenth of the burst, about a third of that at 100mbit.
    assert credit <= bucket * 8 / peak + 0.1 * burst * 8 / rate
    assert credit <= 0.35 * _idle_credit_s(rate, burst)


def test_shape_commands_delay_puts_tbf_under_netem():
    cmds = shape_commands("mb-x-h0", 10**9, 2.0)
    assert "netem" in cmds[1] and "2ms" in cmds[1]
    assert cmds[2][cmds[2].index("parent") + 1] == "1:" and "tbf" in cmds[2]
    assert "peakrate" in _tbf(cmds[2])


def test_shape_commands_unlimited_only_clears():
    assert [c for c in shape_commands("mb-x-h0", None, 0.0) if "add" in c] == []


def test_parse_shaping_reads_tc_output():
    text = "qdisc netem 1: root refcnt 2 limit 1000 delay 2ms qdisc tbf 2: parent 1: rate 1Gbit burst 1250000b lat 20ms"
    assert parse_shaping(text) == (10**9, 2.0)


def test_parse_shaping_reads_the_rate_not_the_peak_rate():
    text = "qdisc tbf 1: root refcnt 3 rate 1Gbit burst 1250000b peakrate 1100Mbit minburst 137437b lat 28.1ms"
    assert parse_shaping(text) == (10**9, 0.0)


def test_without_strips_option_and_value():
    assert _without(["nccl", "--link-profiles", "1gbit,unlimited", "--json=x", "--lab", "a"],
                    "--link-profiles", "--json") == ["nccl", "--lab", "a"]


def test_profiles_table_ratio():
    def rec(bw):
        return {"rows": [{"op": "all_gather", "size_bytes": 1 << 24, "placement": "out", "busbw_gbps": bw}]}

    text = profiles_table([("1gbit", rec(0.1)), ("unlimited", rec(1.0))])
    assert "ratio = unlimited / 1gbit" in text and "10.00x" in text


@pytest.mark.parametrize("args,needle", [
    (["--hosts", "1"], "--hosts '1'"),
    (["--hosts", "0"], "--hosts '0'"),
    (["--hosts", "2", "--link", "1gbt"], "'1gbt'"),
    (["--hosts", "2", "--name", "Bad-Name"], "--name"),
])
def test_lab_up_bad_input_exit_2_one_line(cli, args, needle):
    proc = cli("lab", "up", *args)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in last_line(proc.stderr)


# ---------------------------------------------------------------------- real namespaces


def system_objects(name: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [w for w in (netns + links).replace(":", " ").replace("@", " ").split() if w.startswith(f"mb-{name}-")]


@pytest.mark.slow
@pytest.mark.root
def test_lab_up_status_down_cli(run_cli, lab_name):
    proc = run_cli("lab", "up", "--hosts", "3", "--link", "100mbit", "--name", lab_name)
    assert proc.returncode == 0, proc.stderr
    assert f"mb-{lab_name}-h2" in proc.stdout and "10.213.0.3" in proc.stdout
    status = run_cli("lab", "status", "--name", lab_name, "--json")
    info = json.loads(status.stdout)[0]
    assert info["rate"] == "100mbit" and info["delay_ms"] == 0 and len(info["hosts"]) == 3
    assert all(h["state"] == "up" for h in info["hosts"])
    again = run_cli("lab", "up", "--hosts", "3", "--link", "100mbit", "--name", lab_name)
    assert again.returncode == 0 and "already up" in again.stdout and "nothing changed" in again.stdout
    other = run_cli("lab", "up", "--hosts", "2", "--link", "1gbit", "--name", lab_name)
    assert other.returncode == 2 and "already exists" in last_line(other.stderr)
    down = run_cli("lab", "down", "--name", lab_name)
    assert down.returncode == 0 and f"mb-{lab_name}-br" in down.stdout
    assert system_objects(lab_name) == []


@pytest.mark.slow
@pytest.mark.root
def test_lab_delay_is_applied_or_refused_cleanly(run_cli, lab_name):
    proc = run_cli("lab", "up", "--hosts", "2", "--link", "1gbit", "--delay", "1", "--name", lab_name)
    if proc.returncode != 0:
        # Kernels without sch_netem: one line naming the module, and nothing left behind.
        assert "sch_netem" in last_line(proc.stderr) and len(proc.stderr.strip().splitlines()) == 1
        assert system_objects(lab_name) == []
    else:
        info = json.loads(run_cli("lab", "status", "--name", lab_name, "--json").stdout)[0]
        assert info["delay_ms"] == 1.0 and info["rate"] == "1gbit"


@pytest.mark.slow
@pytest.mark.root
def test_lab_down_cleans_crash_leftovers_and_nothing_else(run_cli, lab_name):
    bystander = "t" + uuid.uuid4().hex[:7]
    # A half-made lab (as a crash during `up` would leave it) and a neighbour lab's namespace.
    subprocess.run(["ip", "netns", "add", f"mb-{lab_name}-h0"], check=True)
    subprocess.run(["ip", "link", "add", f"mb-{lab_name}-br", "type", "bridge"], check=True)
    subprocess.run(["ip", "netns", "add", f"mb-{bystander}-h0"], check=True)
    try:
        status = run_cli("lab", "status", "--name", lab_name)
        assert "incomplete" in status.stdout
        proc = run_cli("lab", "down", "--name", lab_name)
        assert proc.returncode == 0, proc.stderr
        assert system_objects(lab_name) == []
        assert system_objects(bystander) == [f"mb-{bystander}-h0"]
    finally:
        subprocess.run(["ip", "netns", "del", f"mb-{bystander}-h0"])


@pytest.mark.slow
@pytest.mark.root
def test_lab_reshape_and_read_back(lab):
    assert all("tbf" in h.shaping and "1Gbit" in h.shaping for h in lab.hosts)
    labmod.shape(lab.name, None)
    assert labmod.find(lab.name).rate == "unlimited"
    labmod.shape(lab.name, parse_link_rate("10gbit"))
    assert labmod.find(lab.name).rate == "10gbit"


@pytest.mark.slow
@pytest.mark.root
def test_nccl_on_lab_unknown_lab_is_usage_error(cli, lab_name):
    proc = cli("nccl", "--lab", lab_name, "--sizes", "1M")
    assert proc.returncode == 2 and f"no lab named '{lab_name}'" in last_line(proc.stderr)


@pytest.mark.slow
@pytest.mark.root
def test_nccl_on_lab_places_one_rank_per_host(run_cli, lab, tmp_path):
    proc = run_cli("nccl", "--lab", lab.name, "--sizes", "1M-2M", "--ops", "all_gather", "--warmup", "1",
                   "--iters", "3", "--json", "out.json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["status"] == "complete" and record["config"]["world"]["size"] == 2
    assert record["implementation"]["socket_ifname"] == labmod.IFNAME


def _netns() -> str:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


@pytest.mark.parametrize("delay", ["nan", "inf", "-1"])
def test_lab_up_refuses_a_bad_delay_before_creating_anything(cli, delay):
    # No root needed: the delay is checked before any namespace exists.
    name = "b" + uuid.uuid4().hex[:6]
    done = cli("lab", "up", "--hosts", "2", "--delay", delay, "--name", name, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"invalid --delay '{delay}'" in one_error_line(done.stderr)
    assert name not in _netns()
