"""Every consumer reads the probe registry: a probe registered only here, whose metric is
`widgets_gbps`, is plotted, summarised, compared, accepted, reported and composed by that metric
with no change to any consumer, and no consumer module keeps its own list of metric or probe names.

The rows carry decoys a hand-kept preference list would pick (busbw_gbps, write_gbps, read_gbps):
a consumer that guesses instead of asking the registry shows them, and fails here."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from microbench.accept import rules as accept, compare, plots as plot, report, report_records, suite
from microbench.core import progress, registry
from microbench.compose.tiers.records import tier_bandwidths
from microbench.results import RecordWriter, new_record

PLUGIN = "mb_test_widgets_probe"
SPEC_SOURCE = '''
from microbench.core.registry import ProbeSpec, SuiteStep

SPEC = ProbeSpec(
    name="widgets", command=("widgets",), help="widget throughput (registered by a test only)",
    metrics=("widgets_gbps", "spares_gbps"), aliases=("gadgets",), case_keys=("flavour",),
    identity_keys=("factory",), feeds=("tier",),
    suite=(SuiteStep("widgets", ("--sizes", "1M"), aliases=("gadgets",)),),
)
'''


@pytest.fixture
def widgets(tmp_path, monkeypatch):
    (tmp_path / f"{PLUGIN}.py").write_text(SPEC_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PLUGINS_ENV, PLUGIN)
    registry.reset()
    yield registry.get("widgets")
    monkeypatch.delenv(registry.PLUGINS_ENV)
    sys.modules.pop(PLUGIN, None)
    registry.reset()


def widget_record(values, *, factory="A", flavours=("x",)):
    rows = [{"probe": "widgets", "op": "spin", "size_bytes": size, "flavour": flavour, "widgets_gbps": value,
             "busbw_gbps": 90.0, "read_gbps": 80.0, "write_gbps": 70.0, "time_us": {"p50": 5.0}}
            for size, value in values.items() for flavour in flavours]
    return {"schema_version": 1, "kind": "widgets", "status": "complete", "argv": ["microbench", "widgets"],
            "config": {"world": {"size": 1}, "probe": {}}, "env": {},
            "implementation": {"engine": "lathe", "device": "cpu", "factory": factory}, "rows": rows}


def write(path: Path, record) -> Path:
    """Through the real writer, so the file is whatever a record is today."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = RecordWriter(new_record("widgets", record["config"], {"hostname": "t"}, record["implementation"],
                                     argv=record["argv"]), path)
    writer.add_rows(record["rows"])
    writer.finish("complete")
    return path


def test_plot_progress_and_headline_show_the_registered_metric(widgets):
    record = widget_record({1 << 20: 1.5, 4 << 20: 2.0})
    assert widgets.primary_metric == "widgets_gbps"
    assert plot.pick_metric(record, None) == "widgets_gbps"
    assert plot.metric_choices(record) == ["widgets_gbps"]          # decoys are not the probe's metrics
    assert plot.series(record, "widgets_gbps") == {"spin": [(1 << 20, 1.5), (4 << 20, 2.0)]}
    two = widget_record({1 << 20: 1.5}, flavours=("x", "y"))
    assert set(plot.series(two, "widgets_gbps")) == {"spin, x", "spin, y"}   # its case_keys split curves
    row = record["rows"][1]
    assert progress.row_brief(row) == "widgets 2 GB/s"
    assert progress.row_brief(row, {"kind": "widgets"}) == "widgets 2 GB/s"
    assert suite.headline(record) == "spin 2.00 GB/s at 4M"      # the best size, named


def test_compare_uses_the_specs_metric_case_and_identity_keys(widgets, tmp_path):
    base = write(tmp_path / "a.json", widget_record({1 << 20: 2.0}))
    new = write(tmp_path / "b.json", widget_record({1 << 20: 1.0}))
    result = compare.compare(base, new, [compare.parse_rule("widgets:-5%")])
    (pair,) = result.pairs
    assert [(line.metric, line.ratio, line.failed) for line in pair.lines] == [("widgets_gbps", 0.5, ["widgets:-5%"])]
    other = write(tmp_path / "c.json", widget_record({1 << 20: 1.0}, factory="B"))
    with pytest.raises(Exception, match="factory A vs B"):
        compare.compare(base, other)
    # Suite directories pair a step under its former name with its current one.
    old, cur = tmp_path / "suite-old", tmp_path / "suite-new"
    write(old / "gadgets.json", widget_record({1 << 20: 2.0}))
    write(cur / "widgets.json", widget_record({1 << 20: 2.2}))
    (pair,) = compare.compare(old, cur).pairs
    assert pair.name == "gadgets vs widgets" and pair.lines[0].ratio == pytest.approx(1.1)


def test_accept_report_and_compose_read_the_spec(widgets, tmp_path):
    record = widget_record({1 << 20: 1.5, 4 << 20: 2.0})
    (verdict,) = accept.evaluate([accept.Check("gadgets", "spin", "", min=1.8)], {"widgets": record})
    assert (verdict.status, verdict.check.metric, verdict.value) == ("pass", "widgets_gbps", 2.0)
    html = report_records.probe_table(record)
    assert "widgets GB/s" in html and "busbw" not in html and "read GB/s" not in html
    tier = {"kind": "widgets", "rows": [{"op": "write", "write_gbps": 70.0, "widgets_gbps": 2.0},
                                        {"op": "read", "read_gbps": 80.0, "widgets_gbps": 3.0}]}
    assert tier_bandwidths(tier) == (2.0, 3.0)
    assert registry.feeding("tier")[-1] is widgets


# Consumers of records: none may hold its own list of metric columns or probe names.
CONSUMERS = ("accept/plots.py", "core/progress.py", "accept/suite.py", "accept/compare.py", "accept/report.py",
             "accept/rules.py", "accept/junit.py", "expect/formulas.py", "probes/nccl/table.py", "accept/pytest_plugin.py",
             "lab/hunt.py", "lab/hunt_pairs.py", "compose/tiers/records.py", "compose/curves.py", "compose/inputs/build.py", "compose/inputs/parsers.py",
             "compose/whatif.py", "expect/overrides.py")
PACKAGE = Path(registry.__file__).parent.parent   # microbench/


def _builtin_names() -> tuple[set[str], set[str]]:
    registry.reset()
    specs = registry.specs()
    metrics = {m for s in specs for m in s.metrics}
    names = {n for s in specs for n in (s.name, *s.aliases)}
    names |= {n for s in specs for step in s.suite for n in (step.name, *step.aliases)}
    return metrics, names


def hand_kept_lists(source: str, metrics: set[str], names: set[str]) -> list[str]:
    """Tuple, list and set literals naming two or more metric columns or probes (a preference
    order, a probe list), and comparisons of a record's kind with a probe's name. Dict keys are
    not counted: a record being written names its own fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for kind, known in (("metrics", metrics), ("probes", names)):
                hits = [w for w in words if w in known]
                if len(hits) >= 2:
                    found.append(f"line {node.lineno}: {kind} {hits}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            kind_read = any(isinstance(s, ast.Call) and s.args and isinstance(s.args[0], ast.Constant)
                            and s.args[0].value == "kind" for s in sides)
            probe = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in names]
            if kind_read and probe:
                found.append(f"line {node.lineno}: kind compared with probe name {probe[0]!r}")
    return found


def test_the_scan_catches_what_it_forbids():
    metrics, names = _builtin_names()
    caught = hand_kept_lists('for k in ("busbw_gbps", "write_gbps"):\n    pass\n'
                             'STEPS = ["memory", "nccl"]\nok = r.get("kind") != "nccl"\n', metrics, names)
    assert len(caught) == 3, caught
    assert hand_kept_lists('row = {"write_gbps": 1, "read_gbps": 2}\nkey = "busbw_gbps"\n', metrics, names) == []


@pytest.mark.parametrize("module", CONSUMERS)
def test_no_consumer_keeps_its_own_list(module):
    metrics, names = _builtin_names()
    assert hand_kept_lists((PACKAGE / module).read_text(), metrics, names) == []


def test_a_tool_record_no_probe_claims_still_pairs_its_rows(tmp_path):
    # hunt's rows are told apart by src -> dst, which no probe's case_keys name.
    def hunt(path, gbps):
        writer = RecordWriter(new_record("hunt", {"hosts": ["a", "b"]}, {"hostname": "t"}, {"engine": "tcp"},
                                         argv=["microbench", "hunt"]), path)
        writer.add_rows([{"probe": "hunt", "op": "uni", "src": s, "dst": d, "size_bytes": 1 << 20, "bw_gbps": g}
                         for (s, d), g in zip((("a", "b"), ("b", "a")), gbps)])
        writer.finish("complete")
        return path

    (pair,) = compare.compare(hunt(tmp_path / "a.json", (1.0, 2.0)), hunt(tmp_path / "b.json", (1.0, 1.0))).pairs
    assert sorted((line.metric, line.ratio) for line in pair.lines) == [("bw_gbps", 0.5), ("bw_gbps", 1.0)]
