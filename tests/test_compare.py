"""microbench compare: golden records written by the real RecordWriter, compared by the CLI."""

from __future__ import annotations

import json
import math

import pytest
from conftest import last_line, one_error_line

from microbench.accept.compare import compare, parse_rule
from microbench.core.errors import UsageError
from microbench.results import RecordWriter, new_record


def write_nccl(path, busbw_by_size, *, world=2, backend="gloo", dtype="float32", status="complete"):
    config = {"probe": {"dtype": dtype}, "world": {"size": world, "backend": backend}}
    impl = {"backend": backend, "device": "cpu", "engine": f"torch.distributed/{backend}"}
    writer = RecordWriter(new_record("nccl", config, {"hostname": "t"}, impl, argv=["microbench", "nccl"]), path)
    writer.add_rows([{"probe": "nccl", "op": "all_reduce", "size_bytes": size, "placement": "in",
                      "time_us": {"p50": size / bw / 1e3}, "algbw_gbps": bw * 2, "busbw_gbps": bw}
                     for size, bw in busbw_by_size.items()])
    writer.finish(status)
    return path


def write_memory(path, copy_gbps):
    writer = RecordWriter(new_record("memory", {"probe": {}}, {}, {"engine": "memcpy (native)"}, argv=["m"]), path)
    writer.add_rows([{"probe": "memory", "op": "memcpy_1t", "size_bytes": 1 << 28, "copy_gbps": copy_gbps}])
    writer.finish("complete")
    return path


def test_rules_parse_and_judge_by_direction():
    drop = parse_rule("busbw:-5%")
    assert drop.matches("busbw_gbps") and not drop.matches("algbw_gbps")
    assert drop.fails("busbw_gbps", 0.94) and not drop.fails("busbw_gbps", 0.96)
    worse = parse_rule("time:10%")   # no sign: worse, which for a time is higher
    assert worse.fails("time_us", 1.11) and not worse.fails("time_us", 0.5)
    assert parse_rule("read:2.5%").fails("read_gbps", 0.97)
    assert parse_rule("busbw:+20%").fails("busbw_gbps", 1.25)


@pytest.mark.parametrize("text", ["busbw", "busbw:-5", "busbw:-abc%", "busbw:-nan%", "busbw:-inf%",
                                  "busbw:-150%", ":-5%", "busbw:--5%"])
def test_malformed_rules_are_usage_errors(text):
    with pytest.raises(UsageError, match="invalid --fail-on"):
        parse_rule(text)


def test_compare_pairs_cases_and_computes_ratios(tmp_path):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 0.9, 1 << 24: 4.4, 1 << 26: 5.0})
    result = compare(base, new, [parse_rule("busbw:-5%")])
    (pair,) = result.pairs
    lines = {(line.size_bytes, line.metric): line for line in pair.lines}
    assert set(lines) == {(1 << 20, "busbw_gbps"), (1 << 24, "busbw_gbps")}  # algbw: same ratio, not repeated
    assert lines[(1 << 20, "busbw_gbps")].ratio == pytest.approx(0.9)
    assert lines[(1 << 20, "busbw_gbps")].failed == ["busbw:-5%"]
    assert lines[(1 << 24, "busbw_gbps")].ratio == pytest.approx(1.1)
    assert lines[(1 << 24, "busbw_gbps")].failed == []
    assert pair.only_new == ["all_reduce @ 64M"]


def test_cli_prints_ratios_and_honours_fail_on(cli, tmp_path):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 0.9, 1 << 24: 4.4})
    ok = cli("compare", str(base), str(new))
    assert ok.returncode == 0, ok.stderr
    assert "0.900" in ok.stdout and "1.100" in ok.stdout
    lenient = cli("compare", str(base), str(new), "--fail-on", "busbw:-15%")
    assert lenient.returncode == 0, lenient.stderr
    assert "all within busbw:-15%" in lenient.stdout
    strict = cli("compare", str(base), str(new), "--fail-on", "busbw:-5%")
    assert strict.returncode == 1
    assert "FAIL busbw:-5%" in strict.stdout
    assert last_line(strict.stderr) == ("microbench: 1 of 2 compared value(s) broke --fail-on (busbw:-5%); "
                                        "worst: nccl all_reduce 1M busbw x0.900")
    assert len(strict.stderr.strip().splitlines()) == 1


def test_suite_directories_compare_like_with_like_and_say_what_they_skipped(cli, tmp_path):
    a, b = tmp_path / "suite-a", tmp_path / "suite-b"
    a.mkdir(), b.mkdir()
    write_nccl(a / "collectives.json", {1 << 20: 1.0})
    write_nccl(b / "collectives.json", {1 << 20: 1.0}, world=4)
    write_memory(a / "memory.json", 10.0)
    write_memory(b / "memory.json", 8.0)
    write_memory(a / "old-only.json", 1.0)
    done = cli("compare", str(a), str(b), "--fail-on", "copy:-10%")
    assert done.returncode == 1
    assert "# skipped collectives: not like with like (world size 2 vs 4)" in done.stdout
    assert "# skipped old-only: only in BASE" in done.stdout
    assert "memcpy_1t" in done.stdout and "0.800" in done.stdout


def test_different_backend_or_dtype_is_not_compared(tmp_path):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0})
    other = write_nccl(tmp_path / "b.json", {1 << 20: 1.0}, backend="nccl", dtype="bfloat16")
    with pytest.raises(UsageError, match=r"backend gloo vs nccl.*engine torch.distributed/gloo vs"):
        compare(base, other)


def test_bad_inputs_exit_2_with_one_line(cli, tmp_path):
    nccl = write_nccl(tmp_path / "a.json", {1 << 20: 1.0})
    memory = write_memory(tmp_path / "m.json", 1.0)
    (tmp_path / "empty").mkdir()
    cases = {
        "unrelated": (str(nccl), str(memory)),
        "record vs directory": (str(nccl), str(tmp_path)),
        "empty directory": (str(tmp_path / "empty"), str(tmp_path / "empty")),
        "missing file": (str(nccl), str(tmp_path / "nope.json")),
        "malformed rule": (str(nccl), str(nccl), "--fail-on", "busbw-5%"),
        "unknown metric": (str(nccl), str(nccl), "--fail-on", "iops:-5%"),
    }
    expected = {
        "unrelated": "nothing to compare",
        "record vs directory": "cannot compare a record with a directory",
        "empty directory": "holds no records",
        "missing file": "does not exist",
        "malformed rule": "invalid --fail-on 'busbw-5%'",
        "unknown metric": "invalid --fail-on 'iops:-5%': no metric 'iops' in these records; they have",
    }
    for name, args in cases.items():
        done = cli("compare", *args)
        assert done.returncode == 2, (name, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected[name] in lines[0], (name, lines)


@pytest.mark.parametrize("new_value, how", [(None, "missing in NEW")])
def test_compare_fail_on_fails_a_missing_value_and_names_it(cli, tmp_path, new_value, how):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 1.0, 1 << 24: 4.0})
    record = json.loads(new.read_text())
    record["rows"][1]["busbw_gbps"] = new_value   # json writes NaN, as Python's own dumps does
    if new_value is None:
        del record["rows"][1]["busbw_gbps"]
    new.write_text(json.dumps(record))
    done = cli("compare", str(base), str(new), "--fail-on", "busbw:-5%")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "all within" not in done.stdout
    assert one_error_line(done.stderr) == ("microbench: 1 of 2 compared value(s) broke --fail-on (busbw:-5%); "
                                           f"worst: nccl all_reduce 16M busbw {how}")
    assert f"FAIL busbw:-5% ({how})" in done.stdout


def test_compare_refuses_a_nan_value_naming_the_file_and_field(cli, tmp_path):
    # A NaN never reaches the gate: the loader refuses the record (core/jsonfile.py).
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 1.0, 1 << 24: 4.0})
    record = json.loads(new.read_text())
    record["rows"][1]["busbw_gbps"] = math.nan   # json writes NaN, as Python's own dumps does
    new.write_text(json.dumps(record))
    done = cli("compare", str(base), str(new), "--fail-on", "busbw:-5%")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"results file '{new}' holds NaN at rows[1].busbw_gbps" in one_error_line(done.stderr)
