"""`microbench fleet` on real records: one real suite run (memory and posix storage) is the
template of every node, each node's records its own copy with the node's host name, a little
noise on its figures, and whatever fault a test gives it. Then the command, as a user runs it:
verdicts, exit codes, the record, JUnit, the drain and rerun lists, the report's fleet section in
headless Chromium, the same records read from the embedded S3 server, and every bad input."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable
from xml.etree import ElementTree as ET

import pytest

from conftest import browser_dom, cli_env, one_error_line

RATES = ("copy_gbps", "read_gbps", "write_gbps", "iops")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """One real suite directory: memory and posix storage on this machine."""
    out = tmp_path_factory.mktemp("template")
    # A small memory size: the fleets are made from these records by editing their figures. The
    # storage step as the suite runs it: its rows are the node-metrics whose count sets k.
    done = subprocess.run([sys.executable, "-m", "microbench", "suite", "--only", "memory,storage posix",
                           "--step-args", "memory=--sizes 16M",
                           "--results-dir", str(out)], env=cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (suite,) = out.glob("suite-*")
    return suite


def make_fleet(template: Path, root: Path, nodes: list[str], edit: Callable[[str, str, dict], None] | None = None,
               seed: int = 1) -> Path:
    """Every node's copy of the template under root/NODE/suite-1, its host name set, each rate
    moved by up to 1% (the noise of like nodes) and its iterations within 3% of their median
    (on a loaded machine the template's own spread can be 3x, and copies of it around medians
    1% apart would be no fleet); edit(node, step file, record) adds a fault."""
    rng = random.Random(seed)
    for node in nodes:
        target = root / node / "suite-1"
        target.mkdir(parents=True)
        for path in sorted(template.glob("*.json")):
            record = json.loads(path.read_text())
            record["environment"]["hostname"] = node
            for row in record["rows"]:
                times = row.get("time_us")
                if isinstance(times, dict) and times.get("p50"):
                    row["time_us"] = {k: (min(max(v, 0.97 * times["p50"]), 1.03 * times["p50"])
                                          if k in ("min", "max", "p95", "p99", "mean") else v) for k, v in times.items()}
                for key in RATES:
                    if isinstance(row.get(key), (int, float)):
                        row[key] *= 1 + rng.uniform(-0.01, 0.01)
            if edit:
                edit(node, path.name, record)
            (target / path.name).write_text(json.dumps(record))
    return root


def slow_memory(node: str, factor: float) -> Callable[[str, str, dict], None]:
    """`node`'s memory copies at `factor` of the others, every iteration (its times scaled too)."""
    def edit(who: str, name: str, record: dict) -> None:
        if who == node and name == "memory.json":
            for row in record["rows"]:
                row["copy_gbps"] *= factor
                row["time_us"] = {k: (v / factor if k != "n" else v) for k, v in row["time_us"].items()}
    return edit


def fleet(run_cli, *args: str, env: dict[str, str] | None = None):
    return run_cli("fleet", *map(str, args), env=env, timeout=300)


NINE = [f"n{i}" for i in range(9)]


@pytest.mark.slow
def test_the_degraded_node_is_named_with_its_device_and_every_output_written(cli, template, tmp_path):
    root = make_fleet(template, tmp_path / "root", NINE, slow_memory("n3", 0.5))
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the fleet\n" + "\n".join(NINE) + "\n")
    done = fleet(cli, root, "--hosts", hosts, "--json", tmp_path / "fleet.json", "--junit", tmp_path / "fleet.xml")
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr) == ("microbench: fleet: 1 of 9 node(s) not accepted (n3); the tables above "
                                           "say why")
    k = float(re.search(r"k = ([\d.]+)", done.stdout).group(1))
    assert 2.5 < k < 5
    failed = [line for line in done.stdout.splitlines() if " FAIL " in f" {line} "]
    assert failed and all(line.startswith("n3 ") and "memory memcpy" in line and "host memory (" in line
                          for line in failed if "copy_gbps" in line)
    record = json.loads((tmp_path / "fleet.json").read_text())
    assert record["kind"] == "fleet" and record["schema_version"] == 2
    assert record["summary"]["fleet_schema_version"] == 1
    assert record["summary"]["nodes"]["n3"]["verdict"] == "FAIL" and record["summary"]["drain"] == ["n3"]
    bad = [r for r in record["rows"] if r["verdict"] != "PASS"]
    assert {r["node"] for r in bad} == {"n3"}
    row = next(r for r in bad if "memcpy_all" in r["metric"])
    assert row["ratio"] == pytest.approx(0.5, abs=0.03) and row["z"] < -k and row["reason"]
    assert set(row) >= {"node", "metric", "value", "median", "z", "ratio", "verdict", "reason", "device"}
    assert (tmp_path / "fleet.drain.txt").read_text() == "n3\n" and (tmp_path / "fleet.rerun.txt").read_text() == ""
    xml = ET.parse(tmp_path / "fleet.xml").getroot()
    suites = {s.get("name"): s for s in xml.findall("testsuite")}
    assert set(suites) == {f"fleet.{n}" for n in NINE}
    assert suites["fleet.n3"].get("failures") != "0" and suites["fleet.n0"].get("failures") == "0"
    assert len(suites["fleet.n0"].findall("testcase")) == int(suites["fleet.n0"].get("tests")) > 3
    # The report's fleet section: one strip plot per metric, drawn in a real browser.
    out = tmp_path / "fleet.html"
    rep = cli("report", "--fleet", str(tmp_path / "fleet.json"), "--out", str(out))
    assert rep.returncode == 0, rep.stderr
    metrics = {r["metric"] for r in record["rows"] if r["gate"] == "fleet"}
    assert out.read_text().count('alt="strip plot: ') == len(metrics)
    _renders(out, tmp_path, len(metrics))


def _renders(out: Path, tmp_path: Path, plots: int) -> None:
    seen = browser_dom(out, tmp_path, "{imgs:[...document.images].map(i=>[i.complete,i.naturalWidth,i.naturalHeight]),"
                                      "h2:[...document.querySelectorAll('h2')].map(h=>h.textContent)}")
    assert "Fleet" in seen["h2"]
    assert len(seen["imgs"]) == plots and all(ok and w > 300 and h > 100 for ok, w, h in seen["imgs"]), seen["imgs"]


@pytest.mark.slow
def test_a_small_fleet_says_it_uses_leave_one_out(cli, template, tmp_path):
    root = make_fleet(template, tmp_path / "root", ["a", "b", "c", "d", "e"], slow_memory("c", 0.5))
    done = fleet(cli, root, "--json", tmp_path / "f.json")
    assert done.returncode == 1 and "(c)" in one_error_line(done.stderr)
    assert "under 8: the floors and each node against the median of the other 4 (leave one out)" in done.stdout
    assert "no --hosts: the nodes expected are the nodes found" in done.stdout


@pytest.mark.slow
def test_missing_partial_and_drift(cli, template, tmp_path):
    def faults(node: str, name: str, record: dict) -> None:
        if node == "n5" and name == "memory.json":
            record["environment"]["fingerprint"]["kernel"] = "9.9.9-edited"
    root = make_fleet(template, tmp_path / "root", NINE[:8], faults)
    (root / "n6" / "suite-1" / "storage-posix.json").unlink()
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("\n".join(NINE) + "\n")
    done = fleet(cli, root, "--hosts", hosts, "--json", tmp_path / "f.json")
    assert done.returncode == 1
    nodes = json.loads((tmp_path / "f.json").read_text())["summary"]["nodes"]
    assert {n: r["verdict"] for n, r in nodes.items() if r["verdict"] != "PASS"} == {
        "n5": "DRIFT", "n6": "PARTIAL", "n8": "MISSING"}
    assert "kernel differs between n5's own records: " in nodes["n5"]["findings"][0]
    assert "no storage posix record (7 of 8 nodes have one)" in nodes["n6"]["findings"][0]
    assert (tmp_path / "f.drain.txt").read_text() == "n5\n"
    assert (tmp_path / "f.rerun.txt").read_text() == "n6\nn8\n"


@pytest.mark.slow
def test_every_node_below_a_floor_is_one_fleet_wide_finding(cli, template, tmp_path):
    memcpy = max(r["copy_gbps"] for r in json.loads((template / "memory.json").read_text())["rows"])
    floors = tmp_path / "floors.toml"
    floors.write_text(f'[[check]]\nstep = "memory"\nop = "memcpy_all"\nmetric = "copy_gbps"\nmin = {2 * memcpy:.3f}\n')
    root = make_fleet(template, tmp_path / "root", NINE)
    done = fleet(cli, root, "--accept", floors, "--json", tmp_path / "f.json")
    assert done.returncode == 1
    assert one_error_line(done.stderr) == "microbench: fleet: 1 fleet-wide finding(s); the tables above say why"
    assert "FLEET-WIDE floor: 9 of 9 nodes of the group below the floor memory memcpy_all copy_gbps >=" in done.stdout
    summary = json.loads((tmp_path / "f.json").read_text())["summary"]
    assert set(summary["verdicts"]) == {"PASS"} and summary["drain"] == []


@pytest.mark.slow
def test_two_records_of_one_node_are_repeats_and_said_so(cli, template, tmp_path):
    root = make_fleet(template, tmp_path / "root", NINE[:4])
    shutil.copytree(root / "n1" / "suite-1", root / "n1" / "suite-2")
    done = fleet(cli, root, "--json", tmp_path / "f.json")
    assert done.returncode == 0, done.stderr
    assert "# n1: 2 step(s) with more than one record (memory, storage posix): kept as repeats" in done.stdout


@pytest.mark.slow
def test_the_same_fleet_read_from_s3(cli, template, tmp_path, embedded_s3):
    root = make_fleet(template, tmp_path / "root", NINE, slow_memory("n7", 0.5))
    client = embedded_s3.client()
    for path in root.rglob("*.json"):
        client.put_object(Bucket=embedded_s3.bucket, Key=f"fleet-test/{path.relative_to(root)}", Body=path.read_bytes())
    env = embedded_s3.env()
    url = f"s3://{embedded_s3.bucket}/fleet-test"
    done = fleet(cli, url, "--endpoint", embedded_s3.endpoint_url, "--json", tmp_path / "f.json", env=env)
    assert done.returncode == 1 and "(n7)" in one_error_line(done.stderr)
    local = fleet(cli, root, "--json", tmp_path / "g.json")
    verdicts = [{n: r["verdict"] for n, r in json.loads((tmp_path / f).read_text())["summary"]["nodes"].items()}
                for f in ("f.json", "g.json")]
    assert verdicts[0] == verdicts[1] and local.returncode == 1
    empty = fleet(cli, f"s3://{embedded_s3.bucket}/no-such-prefix", "--endpoint", embedded_s3.endpoint_url, env=env)
    assert empty.returncode == 2 and "an empty prefix" in one_error_line(empty.stderr)
    refused = fleet(cli, url, "--endpoint", embedded_s3.endpoint_url,
                    env={**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-1234"})
    assert refused.returncode == 2 and "rejected the credentials" in one_error_line(refused.stderr)
    assert "wrong-secret" not in refused.stderr
    nobucket = fleet(cli, "s3://no-such-bucket/x", "--endpoint", embedded_s3.endpoint_url, env=env)
    assert nobucket.returncode == 2 and "does not exist" in one_error_line(nobucket.stderr)


def test_a_server_failing_mid_read_is_exit_1(cli, tmp_path):
    """A server that lists the prefix and then fails every read (HTTP 500): the run fails (exit
    1, one line), it is no misuse of the command."""
    import http.server
    import threading

    listing = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><Prefix>run/</Prefix>'
               '<KeyCount>1</KeyCount><IsTruncated>false</IsTruncated><Contents><Key>run/n0/memory.json</Key>'
               '<Size>10</Size></Contents></ListBucketResult>').encode()

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's name
            listed = "list-type=2" in self.path
            body = listing if listed else b"<Error><Code>InternalError</Code><Message>disk gone</Message></Error>"
            self.send_response(200 if listed else 500)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = fleet(cli, "s3://b/run", "--endpoint", f"http://127.0.0.1:{server.server_address[1]}",
                     env={"AWS_ACCESS_KEY_ID": "fleettest", "AWS_SECRET_ACCESS_KEY": "fleettest-secret",
                          "AWS_DEFAULT_REGION": "us-east-1"})
    finally:
        server.shutdown()
    assert done.returncode == 1, (done.stdout, done.stderr)
    line = one_error_line(done.stderr)
    assert "while reading s3://b/run/n0/memory.json" in line and "fleettest-secret" not in done.stderr


def _write(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case,needle", [
    ("empty", "an empty directory"),
    ("no_records", "no suite records of any node"),
    ("schema", "schema_version 9 is not supported"),
    ("hosts_nobody", "none has records here"),
    ("hosts_twice", "names 'n0' twice"),
    ("budget_nan", "invalid --budget 'nan'"),
    ("budget_negative", "invalid --budget '-1'"),
    ("budget_huge", "allows half of them"),
    ("fraction_nan", "invalid --min-fraction 'nan'"),
    ("fraction_negative", "invalid --min-fraction '-0.1'"),
    ("fraction_over_one", "invalid --min-fraction '1.5'"),
    ("no_source", "no records given"),
    ("missing_source", "does not exist"),
    ("bad_s3_url", "expected s3://BUCKET/PREFIX"),
])
def test_bad_input_exit_2_one_line(cli, template, tmp_path, case, needle):
    root = tmp_path / "root"
    args: list[Any] = [root]
    if case == "empty":
        root.mkdir()
    elif case == "no_records":
        _write(root / "n0" / "notes.json", {"not": "a record"})
        _write(root / "n0" / "hunt.json", "{broken")
    elif case == "schema":
        make_fleet(template, root, ["n0", "n1"])
        record = json.loads((root / "n0" / "suite-1" / "memory.json").read_text())
        _write(root / "n1" / "suite-1" / "memory.json", {**record, "schema_version": 9})
    else:
        make_fleet(template, root, ["n0", "n1", "n2"])
    extra = {"hosts_nobody": ["--hosts", _write(tmp_path / "nobody.txt", "x1\nx2\n")],
             "hosts_twice": ["--hosts", _write(tmp_path / "twice.txt", "n0\nn1\nn0\n")],
             "budget_nan": ["--budget", "nan"], "budget_negative": ["--budget", "-1"], "budget_huge": ["--budget", "1e6"],
             "fraction_nan": ["--min-fraction", "nan"], "fraction_negative": ["--min-fraction", "-0.1"],
             "fraction_over_one": ["--min-fraction", "1.5"]}.get(case, [])
    if case == "no_source":
        args = []
    elif case == "missing_source":
        args = [tmp_path / "nowhere"]
    elif case == "bad_s3_url":
        args = ["s3://"]
    done = fleet(cli, *args, *extra, "--json", tmp_path / "f.json")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert needle in one_error_line(done.stderr)
    assert not (tmp_path / "f.json").exists()


@pytest.mark.slow
def test_report_refuses_a_record_that_is_no_fleet_record(cli, template, tmp_path):
    done = cli("report", "--fleet", str(template / "memory.json"), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "is a 'memory' record" in one_error_line(done.stderr)
