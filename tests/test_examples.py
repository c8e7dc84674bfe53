"""examples/: the SkyPilot task and the Slurm script are parsed, and every microbench command
line in them goes through the CLI's own argument parser (and the probes' own option parsers)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from microbench.accept import rules as accept
from microbench.cli import build_parser
from microbench.commands.common import settings_from_args
from microbench.core.units import parse_sizes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Values a launcher would give; only their shape matters to the parser.
LAUNCHER_VALUES = {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8",
                   "MASTER_ADDR": "10.0.0.1", "SLURM_JOB_ID": "1234", "SLURM_NNODES": "2", "OUT": "results/slurm-1234",
                   "SLURMD_NODENAME": "gpu001", "SLURM_SUBMIT_DIR": "/home/u/microbench"}
SHELL_OPS = {"&&", "||", ";", "|", ">", ">>", "2>", "&"}


def top_level_yaml(text: str) -> dict[str, object]:
    """The subset of YAML a SkyPilot task uses here: top-level `key: scalar`, `key: |` blocks and
    nested mappings. Used when PyYAML is absent (it is not a dependency of microbench)."""
    out: dict[str, object] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#") or line.startswith(" "):
            continue
        key, _, rest = line.partition(":")
        rest = rest.strip()
        block = []
        while i < len(lines) and (lines[i].startswith(" ") or not lines[i].strip()):
            block.append(lines[i])
            i += 1
        if rest == "|":
            indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
            out[key] = "\n".join(b[indent:] for b in block).strip("\n") + "\n"
        elif rest:
            out[key] = int(rest) if rest.isdigit() else rest
        else:
            out[key] = _mapping([b for b in block if b.strip() and not b.lstrip().startswith("#")])
    return out


def _mapping(block: list[str]) -> dict[str, object]:
    """`key: value` lines of one indentation, a key with nothing after its colon holding the
    more deeply indented lines below it (file_mounts: /fleet: name: ...)."""
    out: dict[str, object] = {}
    indent = min(len(b) - len(b.lstrip()) for b in block)
    i = 0
    while i < len(block):
        key, _, value = block[i].partition(":")
        i += 1
        inner = []
        while i < len(block) and len(block[i]) - len(block[i].lstrip()) > indent:
            inner.append(block[i])
            i += 1
        out[key.strip()] = _mapping(inner) if inner else value.strip()
    return out


def expand(text: str) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: LAUNCHER_VALUES.get(m.group(1) or m.group(2), "X"), text)


def command_lines(script: str) -> list[list[str]]:
    """Each shell command of a script (continuations joined, comments dropped), as tokens."""
    joined = re.sub(r"\\\n\s*", " ", script)
    out = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def microbench_invocations(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """(launcher, argv after `microbench`) for `microbench ...`, `torchrun ... -m microbench ...`,
    `srun ... microbench ...` and the same inside `bash -c '...'`."""
    found = []
    for i, tok in enumerate(tokens):
        if tok == "-c" and i > 0 and tokens[i - 1] == "bash":
            for inner in command_lines(tokens[i + 1]):
                found += [(tokens[0], argv) for _, argv in microbench_invocations(inner)]
            break
        is_module = tok == "microbench" and i > 0 and tokens[i - 1] == "-m"
        if tok == "microbench" or is_module:
            argv = []
            for arg in tokens[i + 1:]:
                if arg in SHELL_OPS:
                    break
                argv.append(expand(arg))
            found.append((tokens[0], argv))
            break
    return found


def check_invocation(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    if getattr(args, "sizes", None):
        assert parse_sizes(args.sizes)
    if hasattr(args, "progress"):     # the sweep flags (hunt has a --warmup of its own)
        settings_from_args(args)
    if args.command == "fleet":
        from microbench.commands.fleet import config_from

        assert config_from(args).sources
    if getattr(args, "accept", None):
        assert accept.load_checks(Path(EXAMPLES.parent, args.accept))


def load_task() -> dict[str, object]:
    text = (EXAMPLES / "skypilot-acceptance.yaml").read_text()
    task = top_level_yaml(text)
    try:
        import yaml
    except ImportError:
        return task
    parsed = yaml.safe_load(text)
    assert parsed == task, "the fallback reader disagrees with PyYAML on this file"
    return parsed


def test_skypilot_task_runs_the_suite_and_nccl_under_torchrun_and_ends_with_the_fleet():
    task = load_task()
    assert isinstance(task["num_nodes"], int) and task["num_nodes"] >= 2
    assert task["resources"]["accelerators"].endswith(":8")
    calls = [call for tokens in command_lines(task["run"]) for call in microbench_invocations(tokens)]
    assert [argv[0] for _, argv in calls] == ["suite", "nccl", "hunt", "fleet"]
    # Every node's suite in one place, the place the fleet reads: the bucket mounted at /fleet.
    suite_dir = calls[0][1][calls[0][1].index("--results-dir") + 1]
    assert suite_dir.startswith("/fleet/") and task["file_mounts"]["/fleet"]
    assert [a for a in calls[3][1] if a.startswith("s3://")] == ["s3://X/X/nodes", "s3://X/X/cluster"]
    (launcher, nccl) = calls[1]
    assert launcher == "torchrun" and nccl[nccl.index("--sizes") + 1] == "1M-4G"
    torchrun = next(t for t in command_lines(task["run"]) if t[0] == "torchrun")
    flags = dict(expand(t).split("=", 1) for t in torchrun if t.startswith("--") and "=" in t)
    assert flags["--nnodes"] == "2" and flags["--nproc_per_node"] == "8" and flags["--node_rank"] == "0"
    for _, argv in calls:
        check_invocation(argv)
    assert "--junit" in calls[0][1]


def test_slurm_script_is_valid_bash_and_runs_microbench_under_srun():
    path = EXAMPLES / "slurm-acceptance.sbatch"
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    text = path.read_text()
    directives = dict(line.removeprefix("#SBATCH ").split("=", 1) for line in text.splitlines()
                      if line.startswith("#SBATCH ") and "=" in line)
    assert int(directives["--nodes"]) >= 2 and int(directives["--ntasks-per-node"]) == 8
    calls = [call for tokens in command_lines(text) for call in microbench_invocations(tokens)]
    assert [(launcher, argv[0]) for launcher, argv in calls] == [("srun", "suite"), ("srun", "nccl"), ("srun", "hunt"),
                                                                 ("microbench", "fleet")]
    assert calls[1][1][calls[1][1].index("--sizes") + 1] == "1M-4G"
    # Every node's suite under one shared directory, which the fleet reads with the job's nodes.
    suite_dir = calls[0][1][calls[0][1].index("--results-dir") + 1]
    fleet = calls[3][1]
    assert suite_dir == "results/slurm-1234/nodes/gpu001" and fleet[1] == "results/slurm-1234/nodes"
    assert fleet[fleet.index("--hosts") + 1] == "results/slurm-1234/hosts.txt"
    for _, argv in calls:
        check_invocation(argv)


def test_the_checker_catches_a_broken_command_line():
    with pytest.raises(Exception):
        check_invocation(["nccl", "--sizes", "1M-4G", "--no-such-flag"])
    with pytest.raises(Exception):
        check_invocation(["nccl", "--sizes", "4G-1M"])


def test_readme_documents_both_examples():
    readme = (EXAMPLES.parent / "README.md").read_text()
    assert "examples/skypilot-acceptance.yaml" in readme and "examples/slurm-acceptance.sbatch" in readme
