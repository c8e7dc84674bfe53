"""microbench report: one self-contained HTML file, checked statically and in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import last_line
from microbench.accept import report
from microbench.results import RecordWriter, new_record

ENV = {"hostname": "node001", "cpu_model": "Test CPU", "cpu_count": 2, "os": "Debian", "kernel": "6.1",
       "memory": {"total_bytes": 2**34}, "gpus": [], "nics": [{"name": "eth0", "link": "ethernet", "speed_mbps": 1000}]}


def write_suite(directory: Path, scale: float) -> Path:
    directory.mkdir(parents=True)
    config = {"probe": {"dtype": "float32"}, "world": {"size": 2, "backend": "gloo"}}
    impl = {"backend": "gloo", "device": "cpu", "engine": "torch.distributed/gloo"}
    nccl = RecordWriter(new_record("nccl", config, ENV, impl, argv=["microbench", "nccl"]), directory / "collectives.json")
    nccl.add_rows([{"probe": "nccl", "op": op, "size_bytes": 1 << s, "placement": "out", "time_us": {"p50": 100.0 * s},
                    "algbw_gbps": 2 * scale * s / 24, "busbw_gbps": scale * s / 24}
                   for op in ("all_gather", "reduce_scatter") for s in range(20, 25)])
    nccl.finish("complete")
    mem = RecordWriter(new_record("memory", {"probe": {}}, ENV, {"engine": "memcpy (native)"}, argv=["m"]),
                       directory / "memory.json")
    mem.add_rows([{"probe": "memory", "op": "memcpy_1t", "size_bytes": 1 << 28, "copy_gbps": 5.0 * scale}])
    mem.finish("complete")
    return directory


@pytest.fixture
def suites(tmp_path):
    return [write_suite(tmp_path / "suite-20261101-000000", 1.0), write_suite(tmp_path / "suite-20261108-000000", 0.8)]


@pytest.fixture
def compose_record(cli, suites, tmp_path):
    path = tmp_path / "compose.json"
    done = cli("compose", "--nccl", f"lab={suites[0] / 'collectives.json'}", "--net", "ib=40GB/s",
                   "--model", "llama-3.1-8b", "--ranks", "2", "--tflops", "400", "--allow-partial",
                   "--tier", "nvme=6:12", "--json", str(path))
    assert done.returncode == 0, done.stderr
    return path


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.h2: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_h2 = tag == "h2" or self._in_h2 and tag == "span"
        if tag == "h2":
            self.h2.append("")

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_h2:
            self.h2[-1] += data


def test_report_is_self_contained_with_every_section(cli, suites, compose_record, tmp_path):
    thresholds = tmp_path / "t.toml"
    thresholds.write_text('[[check]]\nstep = "memory"\nop = "memcpy_1t"\nmetric = "copy_gbps"\nmin = 4.5\n')
    out = tmp_path / "r.html"
    done = cli("report", *map(str, suites), str(compose_record), "--out", str(out), "--accept", str(thresholds),
                   "--fail-on", "busbw:-5%")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    parsed = _Collect()
    parsed.feed(text)
    headings = [h.split("(")[0].strip() for h in parsed.h2]
    assert headings[:4] == ["Summary", "Runs", "Environment", "Acceptance"]   # the answer first
    assert {"collectives", "memory", "Compare", "Composer what-if: compose"} <= set(headings)
    # No fetch of any kind: every src/href is a data: URI, no scripts, no stylesheets by link.
    for tag, attrs in parsed.tags:
        assert tag not in ("script", "link", "iframe"), tag
        for key in ("src", "href"):
            assert key not in attrs or attrs[key].startswith("data:"), (tag, attrs[key][:60])
    images = [attrs["src"] for tag, attrs in parsed.tags if tag == "img"]
    # One plot per collective op, both runs overlaid; memory has one size: bars.
    assert len(images) == 3
    assert [a['alt'] for t, a in parsed.tags if t == 'img'] == ['memory: one size per op',
                                                               'collectives: all_gather busbw vs size',
                                                               'collectives: reduce_scatter busbw vs size']
    assert "1 of 1 checks pass" in text and "0 of 1 checks pass" in text   # 5.0 passes 4.5, 4.0 does not
    assert "0.800" in text and "FAIL busbw:-5%" in text
    assert "AllGather forward" in text and "step (overlapped)" in text and "nvme" in text


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_report_renders_in_headless_chromium(cli, suites, compose_record, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    out = tmp_path / "r.html"
    done = cli("report", *map(str, suites), str(compose_record), "--out", str(out))
    assert done.returncode == 0, done.stderr
    # A copy with a probe script that writes what the browser decoded into the DOM; the report's
    # policy stays as it is except that this one inline script may run.
    probe_js = ("<script>window.addEventListener('load',()=>{const r={imgs:[...document.images].map(i=>"
                "[i.complete,i.naturalWidth,i.naturalHeight]),h2:[...document.querySelectorAll('h2')].map(h=>h.textContent),"
                "tables:document.querySelectorAll('table').length,rows:document.querySelectorAll('tr').length};"
                "const p=document.createElement('pre');p.id='probe';p.textContent=JSON.stringify(r);"
                "document.body.appendChild(p);});</script>")
    text = out.read_text().replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", probe_js + "</body>"))
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
              f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert match, dom.stdout[-2000:]
    seen = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(seen["imgs"]) == 3
    assert all(complete and w > 300 and h > 200 for complete, w, h in seen["imgs"]), seen["imgs"]
    assert seen["h2"][:3] == ["Summary", "Runs", "Environment"] and "Compare" in seen["h2"]
    assert seen["tables"] >= 8 and seen["rows"] > 30
    # The unmodified report, as a person would see it.
    shot = tmp_path / "report.png"
    done = subprocess.run([*common, "--window-size=1280,2400", f"--screenshot={shot}", out.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert _png_size(shot.read_bytes()) == (1280, 2400)
    assert shot.stat().st_size > 50_000   # a blank page compresses to a few KiB


def test_without_out_the_report_is_a_new_file_under_results(cli, suites, tmp_path):
    first = cli("report", *map(str, suites))
    second = cli("report", *map(str, suites))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    made = sorted((tmp_path / "results").glob("report-*.html"))
    assert len(made) == 2   # a second report in the same second gets its own name; none is overwritten
    assert all(p.read_text().startswith("<!DOCTYPE html>") for p in made)
    assert f"# report: results/{made[0].name}" in first.stdout + second.stdout


def test_bad_inputs_exit_2_with_one_line(cli, suites, tmp_path):
    existing = tmp_path / "exists.html"
    existing.write_text("x")
    (tmp_path / "empty").mkdir()
    cases = [
        (("report", "--out", str(tmp_path / "a.html")), "no records given"),
        (("report", str(suites[0]), "--out", str(tmp_path / "no" / "dir" / "r.html")), "does not exist"),
        (("report", str(suites[0]), "--out", str(existing)), "never overwritten"),
        (("report", str(tmp_path / "empty"), "--out", str(tmp_path / "b.html")), "holds no records"),
        (("report", str(suites[0]), "--out", str(tmp_path / "c.html"), "--fail-on", "busbw"), "invalid --fail-on"),
    ]
    for args, fragment in cases:
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and fragment in last_line(done.stderr), done.stderr
    assert not (tmp_path / "a.html").exists() and not (tmp_path / "b.html").exists()


def test_load_runs_labels_duplicates_apart(suites):
    runs = report.load_runs([str(suites[0]), str(suites[0])])
    assert [r.label for r in runs] == ["suite-20261101-000000", "suite-20261101-000000 (2)"]


def test_a_hunt_record_shows_its_verdict_matrix_and_heatmap(tmp_path):
    from microbench.lab import hunt

    names = ["h0", "h1", "h2"]
    matrix = {(i, j): (0.012 if i == 2 else 0.12) for i in range(3) for j in range(3) if i != j}
    verdict = hunt.analyze(matrix, names, 0.7)
    writer = RecordWriter(new_record("hunt", {"hosts": names}, ENV, {"engine": "tcp"}, argv=["m"]), tmp_path / "h.json")
    writer.add_rows([{"probe": "hunt", "op": "uni", "src": names[i], "dst": names[j], "size_bytes": 8 << 20,
                      "bw_gbps": g, "slow": (i, j) in verdict.slow} for (i, j), g in matrix.items()])
    writer.record["summary"] = {"verdict": verdict.lines}
    writer.finish("complete")
    text = report.build(report.load_runs([str(tmp_path / "h.json")]))
    parsed = _Collect()
    parsed.feed(text)
    assert any(h.startswith("Hunt: h") for h in parsed.h2)
    assert "SLOW HOST h2" in text and "0.012 *" in text
    assert [a["alt"] for t, a in parsed.tags if t == "img"] == ["hunt heatmap"]


@pytest.mark.slow
@pytest.mark.root
def test_report_out_on_a_read_only_filesystem_exit_2_one_line(run_cli, read_only_dir, tmp_path):
    made = run_cli("memory", "--sizes", "1M", "--threads", "1", "--warmup", "0", "--iters", "3",
                   "--json", str(tmp_path / "mem.json"))
    assert made.returncode == 0, made.stderr
    done = run_cli("report", str(tmp_path / "mem.json"), "--out", str(read_only_dir / "r.html"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last_line(done.stderr) == (f"microbench: invalid --out {str(read_only_dir / 'r.html')!r}: directory "
                                      f"{str(read_only_dir)!r} is on a read-only filesystem; e.g. --out results/report.html")
    assert done.stdout == ""
