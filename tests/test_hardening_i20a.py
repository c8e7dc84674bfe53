"""Issue 20, items 1-8 and 17: each a hostile user's reproduction that broke on main."""

from __future__ import annotations

import json
import math

import pytest

from conftest import last_line, one_error_line
from test_compare import write_nccl


# ---------------------------------------------------------------- item 8: a NaN does not pass a gate

@pytest.mark.parametrize("new_value, how", [(math.nan, "nan in NEW"), (None, "missing in NEW")])
def test_compare_fail_on_fails_a_nan_or_missing_value_and_names_it(run_cli, tmp_path, new_value, how):
    base = write_nccl(tmp_path / "a.json", {1 << 20: 1.0, 1 << 24: 4.0})
    new = write_nccl(tmp_path / "b.json", {1 << 20: 1.0, 1 << 24: 4.0})
    record = json.loads(new.read_text())
    record["rows"][1]["busbw_gbps"] = new_value   # json writes NaN, as Python's own dumps does
    if new_value is None:
        del record["rows"][1]["busbw_gbps"]
    new.write_text(json.dumps(record))
    done = run_cli("compare", str(base), str(new), "--fail-on", "busbw:-5%")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "all within" not in done.stdout
    assert one_error_line(done.stderr) == ("microbench: 1 of 2 compared value(s) broke --fail-on (busbw:-5%); "
                                           f"worst: nccl all_reduce 16M busbw {how}")
    assert f"FAIL busbw:-5% ({how})" in done.stdout
