"""The quickstart job: every probe once, on the embedded defaults (local ranks, local disk,
embedded S3), each as its own `microbench` process so one probe's crash cannot take the others
down. Pure helpers here; commands/suite.py is the printer."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .dist import package_env, self_command


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]   # after `microbench`; {path} and {scratch} are filled in


@dataclass
class StepResult:
    step: Step
    status: str              # pass | fail | skip
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


DEFAULT_STEPS = (
    Step("memory", ("memory", "--sizes", "256M")),
    Step("collectives", ("nccl", "--sizes", "1M-16M", "--nproc", "2")),
    Step("link", ("link", "--sizes", "1M-16M")),
    Step("storage posix", ("storage", "posix", "--path", "{path}", "--size", "256M")),
    Step("storage s3", ("storage", "s3", "--object-size", "64M", "--objects", "4")),
    Step("checkpoint", ("checkpoint", "--size", "256M", "--nproc", "2", "--target", "{path}")),
    Step("checkpoint s3", ("checkpoint", "--size", "256M", "--nproc", "2", "--target", "s3://microbench/ckpt")),
)


def headline(record: dict[str, Any]) -> str:
    """Best bandwidth per op over every *_gbps column a probe reports: a one-glance summary
    that needs no per-probe code."""
    best: dict[tuple[str, str], float] = {}
    for row in record.get("rows", []):
        for key, value in row.items():
            if (key.endswith("_gbps") and isinstance(value, (int, float)) and key != "algbw_gbps"
                    and "ceiling" not in key):
                op = str(row.get("op", "?"))
                best[(op, key)] = max(best.get((op, key), 0.0), float(value))
    def label(op: str, key: str) -> str:
        metric = key.removesuffix("_gbps")
        return op if metric in (op, "throughput", "write", "read", "bw") else f"{op} {metric}"

    parts = [f"{label(op, key)} {value:.2f} GB/s" for (op, key), value in best.items()]
    return "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "")


# A launcher's world variables. The suite is one machine's job, so its steps spawn their own
# local ranks even when the suite itself runs as one task per node under srun or mpirun; a step
# that inherited SLURM_NTASKS=8 would wait for 7 peers that never come.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "PMI_RANK", "PMI_SIZE",
                  "MPI_LOCALRANKID", "TORCHELASTIC_RUN_ID")


def step_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in package_env(env).items()
            if k not in _LAUNCHER_VARS and not k.startswith("OMPI_COMM_WORLD_")}


def run_step(step: Step, out_dir: Path, path: str, env: dict[str, str] | None = None,
             timeout_s: float = 900) -> StepResult:
    record_path = out_dir / f"{step.name.replace(' ', '-')}.json"
    argv = [a.format(path=path) for a in step.argv] + ["--json", str(record_path)]
    start = time.monotonic()
    child_env = step_env(env)
    try:
        done = subprocess.run([*self_command(), *argv], capture_output=True, text=True,
                              timeout=timeout_s, env=child_env, stdin=subprocess.DEVNULL)
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired:
        code, err = 1, f"microbench: step did not finish within {timeout_s:g} s"
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
    return StepResult(step, status, seconds, str(record_path) if record else None,
                      headline(record) if record else "", "" if code == 0 else message)


def uses_embedded_s3(step: Step) -> bool:
    """A step that would start its own embedded S3 server: an S3 command or an s3:// target,
    and no --endpoint of its own."""
    argv = step.argv
    return ("s3" in argv or any(a.startswith("s3://") for a in argv)) and "--endpoint" not in argv


@contextlib.contextmanager
def shared_setup(steps: list[Step]) -> Iterator[dict[str, str]]:
    """Environment for every step, prepared once and concurrently before any step measures:
    the torch facts (a child importing torch, ~2.5 s of CPU) and, when two or more steps would
    each start an embedded S3 server, one server for all of them (stopped on exit). A server
    that cannot start is not shared: each step then starts its own and reports why it cannot."""
    from .env import torch_info_for_children
    from .errors import MicrobenchError
    from .s3server import EmbeddedS3

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as pool:
        torch_env = pool.submit(torch_info_for_children)
        env: dict[str, str] = {}
        if sum(1 for step in steps if uses_embedded_s3(step)) >= 2:
            try:
                env.update(stack.enter_context(EmbeddedS3()).share_env())
            except MicrobenchError:
                pass
        env.update(torch_env.result())
        yield env
