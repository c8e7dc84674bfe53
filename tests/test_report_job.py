"""The job section of a compose record in `microbench report` (issue 23): the timeline picture
(one bar per configuration, a colour per phase kind) and the what-if table, and that chromium
draws it."""

import json
import re

import pytest

from microbench.accept.report_job import COLOURS

from conftest import browser_dom

JOB = ["compose", "--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100", "--steps", "20",
       "--ckpt-every", "5", "--net", "eth=1.6GB/s", "--net", "ib=40GB/s", "--tier", "nvme=10:10,ephemeral",
       "--tier", "shared=1.6:6.4", "--tier", "cached=0.3:0.3,cached"]


@pytest.fixture
def report(cli, tmp_path):
    done = cli(*JOB, "--json", str(tmp_path / "job.json"))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "r.html"
    done = cli("report", str(tmp_path / "job.json"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, json.loads((tmp_path / "job.json").read_text())


def test_the_report_draws_each_configurations_timeline_and_tables_the_whatif(report):
    out, record = report
    html = out.read_text()
    svg = re.search(r"<svg .*?</svg>", html, re.S).group(0)
    # Every phase kind in a drawn timeline has its colour; a cached mount's queued upload is a drain.
    for kind in ("model_load", "train", "ckpt_blocking", "ckpt_drain", "final_save"):
        assert f'fill="{COLOURS[kind]}"' in svg, kind
    labels = re.findall(r'text-anchor="end" fill="[^"]+">([^<]+)</text>', svg)
    rec = record["summary"]["job"]["recommended"]
    assert any(label.startswith("★ ") and rec["ckpt_to"] in label for label in labels)
    # two networks x 3 checkpoint tiers, allowed and marked apart: between 6 and 12 bars
    assert 6 <= len(labels) <= 12
    assert "what-if: every network x storage assignment, by total" in html
    configs = len(record["summary"]["job"]["configurations"])
    assert configs == 2 * 3 * 3 * 3 and html.count("<td>RECOMMENDED</td>") == 1
    assert "end to end" in html and "to change the answer" in html


@pytest.mark.slow
def test_chromium_draws_the_timelines(report, tmp_path):
    out, _ = report
    seen = browser_dom(out, tmp_path, "(()=>{const s=document.querySelector('svg').getBoundingClientRect();"
                                      "return {w:s.width,h:s.height,rects:[...document.querySelectorAll('svg rect')]"
                                      ".filter(x=>x.getBoundingClientRect().width>0).length};})()")
    assert seen["w"] > 900 and seen["h"] > 150 and seen["rects"] > 50, seen


def test_a_long_job_is_recorded_folded_and_drawn_tiled(cli, tmp_path):
    # 2,000 steps with a checkpoint every 5: 400 identical periods, folded into one "repeat" entry
    # (its first period as a template) in the record and one pattern-filled bar in the picture.
    done = cli("compose", "--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100",
                   "--steps", "2000", "--ckpt-every", "5", "--net", "ib=40GB/s", "--tier", "shared=1.6:6.4",
                   "--json", str(tmp_path / "long.json"))
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "long.json").read_text())
    (tl,) = record["summary"]["job"]["timelines"]
    (rep,) = [p for p in tl["phases"] if p["kind"] == "repeat"]
    assert rep["repeat"] == 398 and [q["kind"] for q in rep["template"]] == ["train", "ckpt_blocking"]
    assert rep["time_s"] == pytest.approx(rep["repeat"] * rep["period_s"])
    assert tl["total_s"] == pytest.approx(sum(p["time_s"] for p in tl["phases"] if not p["overlapped"]))
    done = cli("report", str(tmp_path / "long.json"), "--out", str(tmp_path / "long.html"))
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "long.html").read_text()
    assert html.count("<pattern ") == 1 and 'fill="url(#p' in html
