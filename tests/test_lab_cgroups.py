"""The lab's throttled hosts: cgroup detection, limits and read-back (pure), and on a real lab
(root) `lab up --host-cpu/--host-disk`, `lab exec` inside a host, `lab down` removing every
cgroup it made."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from microbench.core.errors import UsageError
from microbench.lab import cgroups

from conftest import one_error_line

V1_MOUNTS = """cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/blkio cgroup rw,nosuid,nodev,noexec,relatime,blkio 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_v1_controllers_are_found_in_their_hierarchies():
    found = cgroups.parse_mounts(V1_MOUNTS)
    assert found["cpu"] == cgroups.Controller("cpu", 1, Path("/sys/fs/cgroup/cpu,cpuacct"))
    assert found["io"] == cgroups.Controller("io", 1, Path("/sys/fs/cgroup/blkio"))
    assert cgroups.v2_root(V1_MOUNTS) == Path("/sys/fs/cgroup/unified")


def test_a_pure_v2_machine_has_no_v1_controllers():
    assert cgroups.parse_mounts(V2_MOUNTS) == {}
    assert cgroups.v2_root(V2_MOUNTS) == Path("/sys/fs/cgroup")


def test_cpu_limits_keep_a_short_period_and_the_kernel_minimum():
    assert cgroups.cpu_limits(0.3) == (3000, 10_000)
    assert cgroups.cpu_limits(1.5) == (15_000, 10_000)
    # 0.05 CPU over 10 ms would be a 0.5 ms quota, under the kernel's 1 ms: the period grows
    assert cgroups.cpu_limits(0.05) == (1000, 20_000)


def test_files_per_version():
    assert cgroups.cpu_files(1, 0.3) == [("cpu.shares", "65536"), ("cpu.cfs_period_us", "10000"),
                                         ("cpu.cfs_quota_us", "3000")]
    assert cgroups.cpu_files(2, 0.3) == [("cpu.weight", "6400"), ("cpu.max", "3000 10000")]
    assert cgroups.cpu_files(2, None) == [("cpu.weight", "6400")]
    assert cgroups.io_files(1, ["254:0"], 50_000_000) == [("blkio.throttle.read_bps_device", "254:0 50000000"),
                                                          ("blkio.throttle.write_bps_device", "254:0 50000000")]
    assert cgroups.io_files(2, ["8:0", "259:0"], 10) == [("io.max", "8:0 rbps=10 wbps=10"),
                                                         ("io.max", "259:0 rbps=10 wbps=10")]


def test_limits_read_back():
    assert cgroups.read_cpu(1, {"cpu.cfs_quota_us": "3000\n", "cpu.cfs_period_us": "10000\n"}) == 0.3
    assert cgroups.read_cpu(1, {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"}) is None
    assert cgroups.read_cpu(2, {"cpu.max": "3000 10000\n"}) == 0.3
    assert cgroups.read_cpu(2, {"cpu.max": "max 100000\n"}) is None
    assert cgroups.read_disk(1, {"blkio.throttle.write_bps_device": "254:0 50000000\n8:0 60000000\n"}) == 50_000_000
    assert cgroups.read_disk(2, {"io.max": "254:0 rbps=50000000 wbps=50000000 riops=max wiops=max\n"}) == 50_000_000
    assert cgroups.read_disk(2, {"io.max": ""}) is None


def test_parsing_host_limits():
    assert cgroups.parse_host_cpu(["h4=0.3"], 6) == {4: 0.3}
    assert cgroups.parse_host_disk(["h5=50MB/s", "h1=400Mbit"], 6) == {5: 50_000_000, 1: 50_000_000}
    for bad, needle in ((["h9=0.3"], "h0 to h5"), (["h4=0"], "expected CPUs"), (["h4=nan"], "expected CPUs"),
                        (["h4=-1"], "expected CPUs"), (["4=0.3"], "hINDEX=VALUE"), ([f"h4={os.cpu_count() + 1}"], "CPUs")):
        with pytest.raises(UsageError, match=re.escape(needle)):
            cgroups.parse_host_cpu(bad, 6)
    for bad in (["h5=50"], ["h5=fast"], ["h5=1B/s"]):
        with pytest.raises(UsageError, match="--host-disk"):
            cgroups.parse_host_disk(bad, 6)


@pytest.mark.parametrize("args,needle", [
    (["--host-cpu", "h7=0.3"], "--host-cpu 'h7=0.3'"),
    (["--host-cpu", "h1=nan"], "--host-cpu 'h1=nan'"),
    (["--host-disk", "h1=50"], "--host-disk 'h1=50'"),
])
def test_lab_up_bad_limits_exit_2_one_line(cli, args, needle):
    proc = cli("lab", "up", "--hosts", "3", "--name", "nolab", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in one_error_line(proc.stderr)


def _cgroup_dirs(name: str) -> list[str]:
    return [str(p) for c in cgroups.controllers().values() for p in c.root.glob(f"mb-{name}-h*")]


@pytest.mark.slow
@pytest.mark.root
def test_throttled_hosts_exec_and_down(run_cli, lab_name, tmp_path):
    if not {"cpu", "io"} <= set(cgroups.controllers()):
        pytest.skip(f"this machine mounts no cgroup cpu and io controllers ({cgroups.controllers()})")
    up = run_cli("lab", "up", "--name", lab_name, "--hosts", "3", "--host-cpu", "h1=0.3", "--host-disk", "h2=20MB/s")
    assert up.returncode == 0, up.stderr
    assert "h1 cpu 0.3 CPU" in up.stdout and "h2 disk 20 MB/s" in up.stdout
    info = json.loads(run_cli("lab", "status", "--name", lab_name, "--json").stdout)[0]
    assert [(h["cpu_fraction"], h["disk_bps"]) for h in info["hosts"]] == [(None, None), (0.3, None), (None, 20_000_000)]
    # Inside a host: its own host name, its namespace's NIC, its cgroups.
    seen = run_cli("lab", "exec", "--name", lab_name, "--host", "h1", "--",
                   "sh", "-c", "hostname; ls /sys/class/net; cat /proc/self/cgroup")
    assert seen.returncode == 0, seen.stderr
    lines = seen.stdout.split()
    assert lines[0] == "h1" and "lab0" in lines and f"mb-{lab_name}-h1" in seen.stdout
    # The disk cap holds for O_DIRECT writes: 20 MB at 20 MB/s take about a second, not 10 ms.
    target = tmp_path / "dd.bin"
    dd = run_cli("lab", "exec", "--name", lab_name, "--host", "h2", "--", "dd", "if=/dev/zero", f"of={target}",
                 "bs=1M", "count=20", "oflag=direct")
    assert dd.returncode == 0, dd.stderr
    rate = re.search(r"([\d.]+) ([kMG]?B)/s", dd.stderr)
    assert rate and float(rate.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1}[rate.group(2)] < 40e6, dd.stderr
    assert run_cli("lab", "exec", "--name", lab_name, "--host", "h0", "--", "false").returncode == 1
    bad = run_cli("lab", "exec", "--name", lab_name, "--host", "h9", "--", "true")
    assert bad.returncode == 2 and "--host 'h9'" in one_error_line(bad.stderr)
    empty = run_cli("lab", "exec", "--name", lab_name, "--host", "h0")
    assert empty.returncode == 2 and "needs a command" in one_error_line(empty.stderr)
    assert len(_cgroup_dirs(lab_name)) == 4    # three weighted cpu cgroups and one blkio
    down = run_cli("lab", "down", "--name", lab_name)
    assert down.returncode == 0 and "cgroup" in down.stdout
    assert _cgroup_dirs(lab_name) == []
