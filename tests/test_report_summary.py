"""`microbench report` leads with the answer: a summary of every step's headline value, its expected
value and share, the verdict and a small picture, above the details; checked in headless
Chromium as a reader's browser lays it out."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import cli_env
from microbench.accept import report_summary
from microbench.results import RecordWriter, new_record

ENV = {"hostname": "node001", "cpu_model": "Test CPU", "cpu_count": 2}


def _write(path: Path, kind: str, rows: list[dict], summary: dict | None = None, status: str = "complete",
           reason: str | None = None) -> Path:
    writer = RecordWriter(new_record(kind, {"world": {"size": 2}}, ENV, {"engine": "e"}, argv=["m"]), path)
    writer.add_rows(rows)
    writer.record["summary"] = summary or {}
    return writer.finish(status, reason)


def write_suite(directory: Path) -> Path:
    directory.mkdir(parents=True)
    _write(directory / "nccl.json", "nccl",
           [{"probe": "nccl", "op": "all_reduce", "size_bytes": 1 << s, "placement": "in", "time_us": {"p50": 10.0},
             "algbw_gbps": s / 2.0, "busbw_gbps": float(s), "nwrong": 0} for s in range(20, 25)],
           {"expected": {"all_reduce": {"gbps": 48.0, "unknown_why": None, "limit": "nic", "formula": "f",
                                        "inputs": {}}}})
    _write(directory / "memory.json", "memory",
           [{"probe": "memory", "op": "memcpy_all", "size_bytes": 1 << 28, "copy_gbps": 5.0}])
    _write(directory / "storage-posix.json", "storage_posix",
           [{"probe": "storage_posix", "op": "write", "size_bytes": 16 << 20, "tool": "posix", "write_gbps": 1.5}],
           {"expected": {"gbps": None, "unknown_why": "a local block device reports no bandwidth", "formula": None,
                         "inputs": {}, "limit": None}})
    _write(directory / "storage-s3.json", "storage_s3", [], status="skipped", reason="botocore is not installed")
    return directory


def test_verdicts_in_order_of_what_matters():
    complete = {"status": "complete", "rows": [{"op": "x", "nwrong": 3}, {"op": "y", "nwrong": 0}]}
    assert report_summary.verdict({"status": "skipped", "status_reason": "no GPU"}, None, None) == \
        ("SKIPPED: no GPU", "note")
    assert report_summary.verdict({"status": "partial", "status_reason": "rank 1 died"}, "x", None)[1] == "fail"
    assert report_summary.verdict(complete, "x", None) == ("WRONG: 3 element(s) did not read back as written", "fail")
    assert report_summary.verdict(complete, "y", None) == ("no check", "note")
    swept = {"status": "complete", "rows": [], "summary": {"skipped": {
        "reason": "does not fit in memory: 20.3 GiB of host memory may be taken",
        "cases": [{"op": "all_gather", "size_bytes": 4 << 30, "placement": "out", "need_bytes": 22 << 30}]}}}
    assert report_summary.verdict(swept, "all_gather", None) == (
        "no check; skipped out-of-place 4G (does not fit in memory: 20.3 GiB of host memory may be taken)", "note")


def test_a_small_picture_starts_at_zero():
    svg = report_summary.spark([(1 << 20, 9.4), (4 << 20, 10.0)], None, "x")
    ys = [float(p.split(",")[1]) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]
    # Both points in the top tenth of the picture: a 6 % difference is not drawn as a cliff.
    assert max(ys) < 0.25 * report_summary.SPARK_H, ys
    bar = report_summary.spark([(1 << 28, 5.0)], 10.0, "x")
    width = float(re.search(r'<rect x="0" y="[\d.]+" width="([\d.]+)"', bar).group(1))
    dashed = float(re.search(r'<line x1="([\d.]+)"', bar).group(1))
    assert dashed == pytest.approx(2 * width, rel=0.02)   # the bar reaches half of the expected mark


@pytest.mark.slow
def test_the_report_opens_with_the_summary_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    suite = write_suite(tmp_path / "suite-20261101-000000")
    thresholds = tmp_path / "t.toml"
    thresholds.write_text('[[check]]\nstep = "nccl"\nop = "all_reduce"\nmetric = "busbw_gbps"\nmin = 30\n')
    out = tmp_path / "r.html"
    done = subprocess.run(["python3", "-m", "microbench", "report", str(suite), "--out", str(out), "--accept",
                           str(thresholds)], env=cli_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    probe_js = ("<script>window.addEventListener('load',()=>{const t=document.querySelector('table.summary');"
                "const h=[...document.querySelectorAll('h2')];"
                "const r={h2:h.map(x=>x.textContent),summaryTop:t.getBoundingClientRect().top,"
                "runsTop:h.find(x=>x.textContent==='Runs').getBoundingClientRect().top,"
                "rows:[...t.querySelectorAll('tbody tr')].map(tr=>[...tr.cells].map(c=>c.innerText.trim())),"
                "sparks:[...t.querySelectorAll('svg.spark')].map(s=>{const b=s.getBoundingClientRect();"
                "return [b.width,b.height,s.querySelectorAll('polyline,rect').length]}),"
                "imgs:[...document.images].map(i=>[i.alt,i.complete,i.naturalWidth])};"
                "const p=document.createElement('pre');p.id='probe';p.textContent=JSON.stringify(r);"
                "document.body.appendChild(p);});</script>")
    text = out.read_text().replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", probe_js + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert match, dom.stdout[-2000:]
    seen = json.loads(html.unescape(match.group(1)))
    assert seen["h2"][0] == "Summary" and seen["summaryTop"] < seen["runsTop"]
    rows = {(r[0], r[1]): r for r in seen["rows"]}
    # step, op, headline, expected, % of expected, verdict, picture; in the suite's order
    assert [r[0] for r in seen["rows"]] == ["memory", "nccl", "storage posix", "storage s3"]
    assert rows[("nccl", "all_reduce")][2:6] == ["busbw 24.00 GB/s at 16M", "48 GB/s", "50%",
                                                 "FAIL: 24 (needs >= 30)"]
    assert rows[("memory", "memcpy_all")][2:6] == ["5.00 GB/s at 256M", "-", "-", "no check"]
    assert rows[("storage posix", "write")][3].startswith("unknown") and "block device" in rows[("storage posix", "write")][3]
    assert rows[("storage s3", "-")][5] == "SKIPPED: botocore is not installed"
    # a picture per measured op: a curve for nccl, bars for the single sizes, none for the skip
    assert len(seen["sparks"]) == 3 and all(w > 100 and h > 20 and n == 1 for w, h, n in seen["sparks"])
    # the details keep their pictures: nccl's curve, bars for each single-size step
    alts = [alt for alt, complete, width in seen["imgs"] if complete and width > 300]
    assert alts == ["memory: one size per op", "nccl: all_reduce busbw vs size", "storage-posix: one size per op"]
