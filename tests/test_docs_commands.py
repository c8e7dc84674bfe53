"""The README and docs/ run as written. Every `microbench ...` command in their shell blocks
(```bash, ```sh, ```console: there only the `$ ` lines) goes through the CLI's own parser, which
runs nothing; a curated few of the README's commands that finish within a minute here are really
run, in a temp directory, through bash, exactly as printed.

A command outside a shell block would escape both checks, so a line that starts with
`microbench ` in an untagged block is refused too; docs/BENCHMARKS.md is the exception, its
untagged blocks being recorded output ("microbench memory (native)  median ..."), not commands.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env
from microbench.cli import build_parser
from microbench.commands.generic import build_config
from microbench.core import registry
from microbench.core.units import parse_sizes

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
# Recorded output, not commands: its untagged blocks may hold lines that start with "microbench ".
OUTPUT_PAGES = {"BENCHMARKS.md"}
# A fenced block, indented or not (inside a list item), up to its closing fence at that indent.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<tag>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "|&", ";;"}
REDIRECTS = re.compile(r"^\d*(>>?|<)&?\d*$")
SHELL_WORDS = {"do", "then", "else", "time", "exec", "sudo", "nohup"}


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(tag, body, line number of the opening fence) of each fenced block, its indent removed."""
    text = page.read_text()
    out = []
    for match in FENCE.finditer(text):
        indent = match.group("indent")
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in match.group("body").splitlines())
        out.append((match.group("tag").lower(), body, text.count("\n", 0, match.start()) + 1))
    return out


def shell_lines(tag: str, body: str) -> list[str]:
    """The command lines of a shell block: continuations joined; in a console block only the
    lines after a `$ ` prompt (the rest is output)."""
    return [line for _, line in numbered_shell_lines(tag, body)]


def numbered_shell_lines(tag: str, body: str) -> list[tuple[int, str]]:
    """shell_lines with each line's offset in the block (its first line, for a continued one)."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    for offset, raw in enumerate(body.splitlines()):
        start = offset - len(pending)
        if raw.endswith("\\"):
            pending.append(raw[:-1].strip() if pending else raw[:-1].rstrip())
            continue
        line = " ".join([*pending, raw.strip()]) if pending else raw
        pending = []
        if tag == "console":
            if line.strip().startswith("$ "):
                out.append((start, line.strip()[2:]))
        elif line.strip() and not line.lstrip().startswith("#"):
            out.append((start, line))
    return out


def microbench_argvs(line: str) -> list[list[str]]:
    """Each `microbench ...` invocation on a shell line, as the argv after `microbench`: as a
    command of its own, after a launcher (`torchrun ... -m microbench`, `srun ... microbench`,
    `mpirun ...`), after `--` of `lab exec`, in any simple command of a list or pipeline.
    `$(...)` substitutions stand for one word."""
    line = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    found: list[list[str]] = []
    command: list[str] = []
    for word in [*words, ";"]:
        if word not in SEPARATORS:
            command.append(word)
            continue
        found += _in_command(command)
        command = []
    return found


def _in_command(words: list[str]) -> list[list[str]]:
    while words and (words[0] in SHELL_WORDS or re.fullmatch(r"\w+=\S*", words[0])):
        words = words[1:]      # `do microbench ...`, `VAR=x microbench ...`
    for i, word in enumerate(words):
        if word == "microbench" or word.endswith("/microbench"):
            argv: list[str] = []
            for arg in words[i + 1:]:
                if REDIRECTS.match(arg):
                    break
                argv.append(arg)
            inner = []
            if "--" in argv and "microbench" in argv[argv.index("--"):]:
                inner = _in_command(argv[argv.index("--") + 1:])
            return [argv, *inner]
    return []


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every microbench command in a shell block of README.md and docs/*.md."""
    out = []
    for page in PAGES:
        for tag, body, line in blocks(page):
            if tag not in SHELL_TAGS:
                continue
            for offset, command in numbered_shell_lines(tag, body):
                for argv in microbench_argvs(command):
                    out.append((f"{page.relative_to(ROOT)}:{line + 1 + offset}: microbench {shlex.join(argv)}", argv))
    return out


COMMANDS = documented_commands()
PROBES = {tuple(spec.command): spec for spec in registry.specs()}


def test_the_pages_hold_commands_and_the_extractor_reads_shell_as_a_shell_would():
    assert len(COMMANDS) >= 40, len(COMMANDS)
    assert any(where.startswith("README.md") for where, _ in COMMANDS)
    assert microbench_argvs("microbench lab status ; microbench lab down --name t1   # both") == \
        [["lab", "status"], ["lab", "down", "--name", "t1"]]
    assert microbench_argvs("torchrun --nproc-per-node 8 -m microbench nccl --sizes 1M > out.txt") == \
        [["nccl", "--sizes", "1M"]]
    assert microbench_argvs("for i in 0 1; do microbench lab exec --name fl --host h$i -- microbench suite; done") \
        == [["lab", "exec", "--name", "fl", "--host", "h$i", "--", "microbench", "suite"], ["suite"]]
    assert microbench_argvs("microbench compare $(ls -d results/suite-* | head -1) b.json") == \
        [["compare", "SUBSTITUTED", "b.json"]]
    assert microbench_argvs("pip install . && pytest tests") == []


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_documented_command_parses_with_the_cli_parser(where, argv):
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:      # --help and --version exit 0 after printing: a valid command
        assert exc.code == 0, where
        return
    if isinstance(getattr(args, "sizes", None), str):
        assert parse_sizes(args.sizes), where
    spec = PROBES.get(tuple(argv[:2])) or PROBES.get(tuple(argv[:1]))
    if spec is not None:          # a probe's values through its own option parsers (still nothing run)
        build_config(spec, args)


def test_no_command_hides_outside_a_shell_block():
    """A `microbench` line in an untagged block would be neither parsed nor run: tag it."""
    hidden = []
    for page in PAGES:
        if page.name in OUTPUT_PAGES:
            continue
        for tag, body, line in blocks(page):
            if tag in SHELL_TAGS:
                continue
            hidden += [f"{page.relative_to(ROOT)}:{line}: {text.strip()}" for text in body.splitlines()
                       if re.match(r"\s*(\$ )?microbench \w", text)]
    assert hidden == []


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_lands_on_a_file_and_a_heading():
    broken, checked = [], 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target):
                continue
            path, _, fragment = target.partition("#")
            checked += 1
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md":
                headings = {anchor(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), re.M)}
                if fragment not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [] and checked >= 10, (broken, checked)
    assert anchor("The lab: a cluster on one machine (root + iproute2)") == \
        "the-lab-a-cluster-on-one-machine-root--iproute2"


def test_no_placeholder_in_a_command():
    """Real paths only: nothing a reader has to replace before a command runs."""
    placeholders = re.compile(r"path/to|suite-X|-X\.json|<[a-z ]+>|\.\.\.|\[--")
    found = []
    for page in PAGES:
        for tag, body, line in blocks(page):
            if tag in SHELL_TAGS:
                found += [f"{page.relative_to(ROOT)}:{line}: {text}" for text in shell_lines(tag, body)
                          if placeholders.search(re.split(r"\s#\s", text)[0])]   # comments may say "..."

    assert found == []


# --------------------------------------------------------------------------- the README, run


def readme_command(prefix: str, page: Path = README) -> str:
    """The page's one shell line (continuations joined) that starts with `prefix`."""
    found = [line for tag, body, _ in blocks(page) if tag in SHELL_TAGS
             for line in shell_lines(tag, body) if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def run_as_written(line: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`line` through bash in `cwd`, `microbench` being this session's package (the interpreter
    running the tests), the checkout's example inputs linked in read-only."""
    bin_dir = cwd / ".bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "microbench").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m microbench "$@"\n')
        (bin_dir / "microbench").chmod(0o755)
        (cwd / "examples").symlink_to(ROOT / "examples")
        (cwd / "tests").mkdir()
        (cwd / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    env = cli_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_readme_install_line_is_the_quickstarts_first():
    """.ci/check_install.py resolves this very line in a fresh virtualenv (beside the tests)."""
    line = readme_command("pip install torch")
    assert line.startswith("pip install torch==2.13.0+cpu '.[s3]' --extra-index-url https://download.pytorch.org/whl/cpu")
    assert line.endswith("&& microbench suite")
    # The second: the test command .ci/run runs, after the test extra.
    tests = readme_command("pip install '.[test]'")
    assert tests.startswith("pip install '.[test]' && pytest -n 3 --dist loadgroup tests")
    assert "pytest -n 3 --dist loadgroup tests || status=$?" in (README.parent / ".ci" / "run").read_text()
    assert 'pytest -m "not slow"' in README.read_text()


def compose_lines() -> list[tuple[str, str]]:
    """(where, line) of every `microbench compose` line of the pages that needs nothing but the
    checkout (no suite's records, no shell variables): pure arithmetic, a second each."""
    return [(f"{page.relative_to(ROOT)}:{number + 1 + offset}", line) for page in PAGES
            for tag, body, number in blocks(page) if tag in SHELL_TAGS
            for offset, line in numbered_shell_lines(tag, body)
            if line.startswith("microbench compose ") and "$" not in line]


def test_the_what_to_buy_examples_are_found():
    where = [w for w, _ in compose_lines()]
    assert any(w.startswith("README.md") for w in where) and len(where) >= 3, where


@pytest.mark.slow
def test_the_readme_what_to_buy_command_runs_and_its_job_fits(tmp_path):
    done = run_as_written(readme_command("microbench compose "), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "# fits:" in done.stdout and "DOES NOT FIT" not in done.stdout
    assert "## recommendation" in done.stdout and re.search(r"# best: .* checkpoints to \w+: ", done.stdout)
    assert len(list((tmp_path / "results").glob("compose-*.json"))) == 1


@pytest.mark.slow
@pytest.mark.parametrize("where,line", compose_lines(), ids=[w for w, _ in compose_lines()])
def test_every_described_compose_example_runs_and_fits(tmp_path, where, line):
    """An example whose configuration does not fit prints every figure "for reference": none may."""
    done = run_as_written(line, tmp_path)
    assert done.returncode == 0, f"{where}: {done.stderr}"
    assert "# fits:" in done.stdout and "DOES NOT FIT" not in done.stdout, where


@pytest.mark.slow
def test_the_readme_report_command_runs_on_a_suite_and_leads_with_the_summary(tmp_path):
    """The report line as printed, over a suite run here (memory only: the whole suite takes
    minutes on a loaded 2-core machine)."""
    suite = run_as_written("microbench suite --only memory --step-args 'memory=--sizes 16M'", tmp_path)
    assert suite.returncode == 0, suite.stderr
    done = run_as_written(readme_command("microbench report "), tmp_path)
    assert done.returncode == 0, done.stderr
    reports = list(tmp_path.glob("results/*.html"))
    assert len(reports) == 1
    html = reports[0].read_text()
    headings = re.findall(r"<h2>(.*?)</h2>", html)
    assert headings[0] == "Summary" and "memcpy_all" in html, headings
