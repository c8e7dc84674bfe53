"""JUnit XML for `suite --junit`: what Jenkins, GitLab and GitHub render natively as tests.

One <testsuite> for the suite's steps (a failed step is a failure, a skipped probe is
<skipped> with its reason) and one for the acceptance checks, one <testcase> per check, so a
CI page lists "nccl / all_reduce busbw_gbps @ 256M: 142 (needs >= 150)" as a red test.
Pure: `build` returns the XML text; the command writes it.
"""

from __future__ import annotations

import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Sequence

from ..core.errors import UsageError
from ..results.outputs import check_new_file

# A file larger than this is no report of ours (one testcase per step and check: kilobytes).
_MAX_OWN_REPORT_BYTES = 16 << 20


def written_by_microbench(path: str | os.PathLike) -> bool:
    """True if `path` is a JUnit XML document this module wrote (<testsuites name="microbench">):
    the only existing file `--junit` may replace."""
    try:
        if os.path.getsize(path) > _MAX_OWN_REPORT_BYTES:
            return False
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError, ValueError):
        return False
    return root.tag == "testsuites" and root.get("name") == "microbench"


def check_writable(path: str | os.PathLike) -> Path:
    """Fail before a long run, not after it, when the report could not be written."""
    target = Path(path)
    # A CI job rewrites its JUnit file on every run: the one output that may be overwritten, and
    # only when it is such a report already (never a record or anything else under that name).
    if target.exists() and not target.is_dir() and not written_by_microbench(target):
        raise UsageError(f"invalid --junit {str(path)!r}: it exists and is not a JUnit report written by "
                         f"microbench, so it is not overwritten: pick a new name, "
                         f"e.g. --junit {target.with_suffix('')}-junit.xml")
    checked = check_new_file(path, "--junit", example="results/acceptance.xml", overwrite=True)
    _try_create_beside(checked)
    return checked


def _try_create_beside(target: Path) -> None:
    """Make and remove a file in the report's directory: the permission bits and mount flags
    say yes for places that refuse every new file (/proc, a FUSE mount, an immutable dir)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".check", dir=target.parent)
    except OSError as exc:
        raise UsageError(f"invalid --junit {str(target)!r}: cannot create a file in {str(target.parent)!r} "
                         f"({exc.strerror or exc}); e.g. --junit results/acceptance.xml") from None
    os.close(fd)
    os.unlink(tmp)


def _case_name(check: Any) -> str:
    size = f" @ {check.size_bytes} B" if check.size_bytes is not None else ""
    return f"{check.op} {check.metric}{size}"


def build(step_results: Sequence[Any], verdicts: Sequence[Any] | None, *, hostname: str = "") -> str:
    """step_results: suite.StepResult; verdicts: accept.CheckResult (None without --accept)."""
    root = ET.Element("testsuites", name="microbench")

    steps = ET.SubElement(root, "testsuite", name="microbench.suite", hostname=hostname)
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    total_s = 0.0
    for result in step_results:
        case = ET.SubElement(steps, "testcase", classname="microbench.suite", name=result.step.name,
                             time=f"{result.seconds:.3f}")
        counts["tests"] += 1
        total_s += result.seconds
        if result.status == "fail":
            counts["failures"] += 1
            ET.SubElement(case, "failure", message=result.message or "step failed", type="StepFailed")
        elif result.status == "skip":
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=result.message)
        if result.headline or result.record:
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(x for x in (result.headline, f"record: {result.record}" if result.record else "") if x)
    steps.set("tests", str(counts["tests"]))
    steps.set("failures", str(counts["failures"]))
    steps.set("skipped", str(counts["skipped"]))
    steps.set("errors", "0")
    steps.set("time", f"{total_s:.3f}")

    if verdicts is not None:
        acc = ET.SubElement(root, "testsuite", name="microbench.accept", hostname=hostname)
        failures = 0
        for verdict in verdicts:
            check = verdict.check
            case = ET.SubElement(acc, "testcase", classname=f"microbench.accept.{check.step}",
                                 name=_case_name(check), time="0")
            if verdict.status != "pass":
                failures += 1
                kind = "ThresholdNotMet" if verdict.status == "fail" else "MissingResult"
                ET.SubElement(case, "failure", message=verdict.detail, type=kind)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = verdict.detail
        acc.set("tests", str(len(verdicts)))
        acc.set("failures", str(failures))
        acc.set("skipped", "0")
        acc.set("errors", "0")
        acc.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
