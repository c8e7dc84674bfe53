"""The quickstart job: every probe once, on the embedded defaults (local ranks, local disk,
embedded S3), each as its own `microbench` process so one probe's crash cannot take the others
down. The step loop and its helpers here; commands/suite.py is the printer."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..core import registry
from ..core.errors import RunError, UsageError
from ..core.registry import SuiteStep
from ..core.units import format_number, format_size
from ..world import fork as prefork
from ..world.launch import package_env, self_command


@dataclass
class StepResult:
    step: SuiteStep
    status: str  # pass | fail | skip
    seconds: float
    record: str | None
    headline: str
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """The table's last column: the headline of a step that passed; for one that failed or
        was skipped, why. A failed step may still have a partial record whose headline would read
        like a result, so its reason comes first and the partial figures are labelled as such."""
        if self.status == "pass":
            return self.headline
        if self.status == "fail" and self.headline:
            return f"{self.message} (partial record: {self.headline})"
        return self.message


def default_steps() -> tuple[SuiteStep, ...]:
    """Every registered probe's suite steps (the registry's order), each as the suite runs it: its
    argv the whole command after `microbench` (the probe's command, then the step's arguments;
    {path} and {scratch} are filled in when it runs). Aliases: former names, which `--only` takes
    and older suite directories use as file names."""
    return tuple(
        SuiteStep(step.name, (*spec.command, *step.argv), step.aliases) for spec, step in registry.suite_steps()
    )


def __getattr__(name: str) -> Any:
    # DEFAULT_STEPS is read when asked for, so it follows MICROBENCH_PROBES like the CLI does.
    if name == "DEFAULT_STEPS":
        return default_steps()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def find_step(name: str, steps: tuple[SuiteStep, ...] | list[SuiteStep] | None = None) -> SuiteStep | None:
    """The step called `name` or formerly so (`collectives` is the nccl step)."""
    for step in default_steps() if steps is None else steps:
        if name == step.name or name in step.aliases:
            return step
    return None


def select_steps(only: str | None) -> list[SuiteStep]:
    """The steps `--only` names (current names or former ones, e.g. collectives), in suite order."""
    steps = list(default_steps())
    if only is None:
        return steps
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    names = sorted(s.name for s in steps)
    example = f"e.g. --only {','.join(s.name for s in steps[:2])}"
    if not wanted:
        # An empty list is not "no filter": it would run every probe, the opposite of asking for none.
        raise UsageError(f"invalid --only {only!r}: empty; expected some of {', '.join(names)} ({example})")
    chosen = set()
    for name in wanted:
        step = find_step(name, steps)
        if step is None:
            raise UsageError(f"invalid --only {name!r}: expected some of {', '.join(names)} ({example})")
        chosen.add(step.name)
    return [s for s in steps if s.name in chosen]


def with_step_args(steps: list[SuiteStep], extra: dict[str, tuple[str, ...]]) -> list[SuiteStep]:
    """The steps with `--step-args` appended to their arguments: the step's own flags first, so a
    flag given again (`--size 32M` after the step's `--size 256M`) is the one the probe takes.
    Braces are escaped, since a step's argv is a template ({path})."""
    return [
        dataclasses.replace(
            step, argv=(*step.argv, *(a.replace("{", "{{").replace("}", "}}") for a in extra.get(step.name, ())))
        )
        for step in steps
    ]


def new_suite_dir(results_dir: Path) -> Path:
    """A fresh results/suite-TIME directory (suite-TIME+1, +2, ... when taken), created. The
    name is claimed by mkdir itself, so two suites started in the same second get one each."""
    base = time.strftime("suite-%Y%m%d-%H%M%S", time.gmtime())
    results_dir.mkdir(parents=True, exist_ok=True)
    for suffix in range(1000):
        out_dir = results_dir / (base if suffix == 0 else f"{base}+{suffix}")
        try:
            out_dir.mkdir()
            return out_dir
        except FileExistsError:
            continue
    raise RunError(f"could not find a free suite directory name in {str(results_dir)!r} ({base}+1 to +999 are taken)")


def run_steps(
    steps: list[SuiteStep], out_dir: Path, path: str | None, before: Callable[[SuiteStep], None] = lambda step: None
) -> list[StepResult]:
    """Every step in turn, each its own process, in a scratch directory under `path` (default: a
    temp dir) removed afterwards, with what the steps share (the embedded S3) set up once."""
    with (
        tempfile.TemporaryDirectory(prefix="microbench-suite-", dir=path) as scratch,
        shared_setup(steps) as shared_env,
    ):
        child_env = {**os.environ, **shared_env}
        results = []
        for step in steps:
            before(step)
            results.append(run_step(step, out_dir, scratch, env=child_env))
    return results


def records_by_step_name(results: list[StepResult]) -> dict[str, dict[str, Any] | None]:
    """Each step's record under every name of the step: thresholds written for a former name
    (collectives) still apply. None for a step that left no record."""
    return {
        name: (json.loads(Path(r.record).read_text()) if r.record else None)
        for r in results
        for name in (r.step.name, *r.step.aliases)
    }


def record_file_for(step_name: str) -> str:
    """The record file a suite step writes in its suite directory: `storage posix` -> storage-posix.json."""
    return f"{step_name.replace(' ', '-')}.json"


def step_for_file(filename: str) -> str | None:
    """The current name of the step whose record a suite directory keeps under `filename`,
    older names included (`collectives.json` -> `nccl`); None for a file no step writes."""
    found = registry.suite_step(Path(filename).stem)
    return found[1].name if found else None


# The suite table's last column: each op's value at its best size (which size it was follows
# the value), or why a step did not pass.
HEADLINE_COLUMN = "best size per op / reason"


@dataclass(frozen=True)
class Best:
    """One op's headline: its primary metric at its best size, and the row that reached it."""

    op: str
    metric: str
    value: float
    size_bytes: Any
    row: dict[str, Any]
    named: bool  # the metric names itself (busbw beside algbw), else the op says it all


def best_per_op(record: dict[str, Any]) -> list[Best]:
    """Best primary metric per op (the first its probe's spec declares among those the row
    carries) and the size it was reached at: a one-glance summary that needs no per-probe code.
    A bandwidth is named only where the row carries another of its probe's bandwidths (busbw
    beside algbw)."""
    best: dict[tuple[str, str], float] = {}
    at: dict[tuple[str, str], dict[str, Any]] = {}
    named: set[tuple[str, str]] = set()
    for row in record.get("rows", []):
        key = registry.row_metric(row, record)
        if key is None:
            continue
        spec = registry.row_spec(row, record)
        if row[key] == 0 and spec is not None:
            # A one-rank collective moves nothing between ranks: its busbw is 0 by nccl-tests'
            # definition, so the next declared metric (algbw) is the one worth a glance.
            later = spec.metrics[spec.metrics.index(key) + 1 :]
            key = spec.row_metric({m: row[m] for m in later if row.get(m)}) or key
        op = str(row.get("op", "?"))
        if float(row[key]) > best.get((op, key), float("-inf")):
            best[(op, key)], at[(op, key)] = float(row[key]), row
        if key.endswith("_gbps") and any(
            m != key and m.endswith("_gbps") and isinstance(row.get(m), (int, float))
            for m in (spec.metrics if spec else registry.metric_columns())
        ):
            named.add((op, key))
    return [
        Best(op, key, value, at[(op, key)].get("size_bytes"), at[(op, key)], (op, key) in named)
        for (op, key), value in best.items()
    ]


def best_label(best: Best, with_size: bool = True) -> str:
    """'all_reduce busbw 1.72 GB/s at 16M', 'shards 8211 samples_per_s at 31.2M'."""
    size = best.size_bytes
    where = f" at {format_size(size)}" if with_size and isinstance(size, int) and not isinstance(size, bool) else ""
    if not best.metric.endswith("_gbps"):
        # Counts and rates in plain digits (35600 samples_per_s), never 3.56e+04.
        return f"{best.op} {format_number(best.value)} {best.metric}{where}"
    name = best.metric.removesuffix("_gbps")
    shown = f" {name}" if best.named and name != best.op else ""  # not "write write"
    return f"{best.op}{shown} {best.value:.2f} GB/s{where}"


def headline(record: dict[str, Any]) -> str:
    """Each op's best primary metric and its size, at most four ops (the suite table's column)."""
    parts = [best_label(best) for best in best_per_op(record)]
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "")


# A launcher's world variables. The suite is one machine's job, so its steps spawn their own
# local ranks even when the suite itself runs as one task per node under srun or mpirun; a step
# that inherited SLURM_NTASKS=8 would wait for 7 peers that never come.
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "TORCHELASTIC_RUN_ID",
)


def step_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {
        k: v for k, v in package_env(env).items() if k not in _LAUNCHER_VARS and not k.startswith("OMPI_COMM_WORLD_")
    }


def run_step(
    step: SuiteStep, out_dir: Path, path: str, env: dict[str, str] | None = None, timeout_s: float = 900
) -> StepResult:
    record_path = out_dir / record_file_for(step.name)
    argv = [a.format(path=path) for a in step.argv] + ["--json", str(record_path)]
    start = time.monotonic()
    child_env = step_env(env)
    code, err = (_forked if prefork.ready() else _spawned)(argv, child_env, timeout_s)
    seconds = time.monotonic() - start
    last = [line for line in err.strip().splitlines() if line.strip()]
    message = last[-1].removeprefix("microbench: ") if last else f"exit code {code}, nothing on stderr"
    record = None
    if record_path.exists():
        try:
            record = json.loads(record_path.read_text())
        except json.JSONDecodeError:
            record = None
    if code == 0 and message.startswith("skipped:"):
        return StepResult(step, "skip", seconds, None, "", message.removeprefix("skipped: "))
    status = "pass" if code == 0 else "fail"
    return StepResult(
        step,
        status,
        seconds,
        str(record_path) if record else None,
        headline(record) if record else "",
        "" if code == 0 else message,
    )


# How long a step has, after the suite forwards it an interrupt, to save its partial record and
# stop its ranks (their own launcher gives them --timeout + 3 s at most) before it is killed.
INTERRUPT_GRACE_S = 60.0


def _spawned(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    with tempfile.TemporaryFile(mode="w+") as err:
        child = subprocess.Popen(
            [*self_command(), *argv], stdout=subprocess.DEVNULL, stderr=err, env=env, stdin=subprocess.DEVNULL
        )
        return _wait_step(child, err, timeout_s)


def _forked(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    # stdout is dropped as subprocess.run's capture dropped it: the step's record is its result.
    with tempfile.TemporaryFile(mode="w+") as err:
        child = prefork.start(argv, env, stdout=subprocess.DEVNULL, stderr=err)
        return _wait_step(child, err, timeout_s)


def _wait_step(child: Any, err: Any, timeout_s: float) -> tuple[int, str]:
    try:
        code = child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return 1, f"microbench: step did not finish within {format_number(timeout_s, 6)} s"
    except KeyboardInterrupt:
        # A signal to the suite's PID alone (a scheduler's SIGTERM, `kill`) never reaches the
        # step: hand it on, so the step ends its ranks and keeps a partial record, and wait for
        # that before the suite goes on to stop what the step still uses (the shared S3 server).
        stop_step(child)
        raise
    err.seek(0)
    return code, err.read()


def stop_step(child: Any, grace_s: float = INTERRUPT_GRACE_S) -> None:
    """SIGINT to a running step, then wait for it (killed after `grace_s`). Further signals to
    the suite meanwhile are only counted (interrupts.py), so this wait is not cut short."""
    import signal

    child.send_signal(signal.SIGINT)
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def uses_embedded_s3(step: SuiteStep) -> bool:
    """A step that would start its own embedded S3 server: an S3 command or an s3:// target,
    and no --endpoint of its own."""
    argv = step.argv
    return ("s3" in argv or any(a.startswith("s3://") for a in argv)) and "--endpoint" not in argv


@contextlib.contextmanager
def shared_setup(steps: list[SuiteStep]) -> Iterator[dict[str, str]]:
    """Environment for every step, prepared once and concurrently before any step measures:
    the torch facts (asked in this process once it is warm for forking, else of a child) and,
    when two or more steps would each start an embedded S3 server, one server for all of them
    (stopped on exit). A server
    that cannot start is not shared: each step then starts its own and reports why it cannot."""
    from ..core.errors import MicrobenchError
    from ..targets.s3server import EmbeddedS3

    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        with ThreadPoolExecutor(1) as pool:  # shut down before any step forks this process
            torch_env = pool.submit(_warm_or_ask_torch)
            if sum(1 for step in steps if uses_embedded_s3(step)) >= 2:
                try:
                    env.update(stack.enter_context(EmbeddedS3()).share_env())
                except MicrobenchError:
                    pass
            env.update(torch_env.result())
        yield env


def _warm_or_ask_torch() -> dict[str, str]:
    """The torch facts every step's record carries: asked here once the suite has imported torch
    to fork its steps from (prefork.py), or of a child where it cannot fork."""
    from ..world.environment import TORCH_INFO_ENV, _torch_info_here, torch_info_for_children

    if prefork.warm():
        return {TORCH_INFO_ENV: json.dumps(_torch_info_here())}
    return torch_info_for_children()
