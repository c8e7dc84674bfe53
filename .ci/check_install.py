"""Check that an install line resolves, in a fresh virtualenv, to the CPU torch and the
project's extras, without pip backtracking. Nothing is installed: `pip install --dry-run
--report` resolves and says what it would install.

    python3 .ci/check_install.py                      # the README's quickstart line
    python3 .ci/check_install.py -- pip install ...   # any other line (e.g. the one .ci/run uses)

Exit 0 when it holds, 1 with one line per broken promise otherwise. Run from the checkout.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
# What pip prints when it backtracks: it is trying several versions of one project.
BACKTRACKING = re.compile(r"pip is (still )?looking at multiple versions of (\S+)")
CUDA_ONLY = re.compile(r"^(nvidia-|triton$|cuda-)")


def readme_install_line(readme: Path) -> list[str]:
    """The first `pip install` command in the README's Quickstart code block, without what
    follows `&&` and without a trailing comment."""
    text = readme.read_text()
    start = text.index("## Quickstart")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    if block is None:
        raise SystemExit("check_install: no ```bash block under the README's Quickstart")
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words[:2] == ["pip", "install"]:
            return words[:words.index("&&")] if "&&" in words else words
    raise SystemExit("check_install: no `pip install` line in the README's Quickstart block")


def extras_named(words: list[str]) -> list[str]:
    """Extras asked of this project: '.[s3]' -> ['s3']."""
    out = []
    for word in words:
        match = re.fullmatch(r"\.\[([A-Za-z0-9_,-]+)\]", word)
        if match:
            out += [e.strip() for e in match.group(1).split(",")]
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[(]", spec.strip(), maxsplit=1)[0])


def problems(words: list[str], report: dict, output: str) -> list[str]:
    installs = {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in report.get("install", [])}
    found = []
    torch = installs.get("torch")
    if torch is None:
        found.append("torch is not in what pip would install")
    elif not torch.endswith("+cpu"):
        found.append(f"torch resolves to {torch}, not the CPU build (+cpu)")
    cuda = sorted(n for n in installs if CUDA_ONLY.match(n))
    if cuda:
        found.append(f"CUDA wheels would be installed: {', '.join(cuda[:6])}{' ...' if len(cuda) > 6 else ''}")
    if "microbench" not in installs:
        found.append("the project itself is not in what pip would install")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra in extras_named(words):
        for spec in project.get("optional-dependencies", {}).get(extra, []):
            if requirement_name(spec) not in installs:
                found.append(f"extra {extra!r}: {spec} is not in what pip would install")
    backtracked = sorted({m.group(2) for m in BACKTRACKING.finditer(output)})
    if backtracked:
        found.append(f"pip backtracked over versions of {', '.join(backtracked)}")
    return found


def check(words: list[str]) -> int:
    if words[:2] != ["pip", "install"]:
        raise SystemExit(f"check_install: expected a `pip install ...` line, got {shlex.join(words)!r}")
    with tempfile.TemporaryDirectory(prefix="mb-check-install-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        report_path = Path(tmp) / "report.json"
        # --retries 2: an index this machine cannot reach (no network, a mirror) costs seconds,
        # not pip's default five retries per project page.
        cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--report", str(report_path),
               "--progress-bar", "off", "--retries", "2", *words[2:]]
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - start
        output = done.stdout + done.stderr
        if done.returncode != 0:
            tail = [line for line in output.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
            print(f"check_install: {shlex.join(words)} does not resolve (pip exit {done.returncode}): "
                  f"{' | '.join(tail[-3:])}")
            return 1
        report = json.loads(report_path.read_text())
    found = problems(words, report, output)
    installs = {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in report.get("install", [])}
    for problem in found:
        print(f"check_install: {shlex.join(words)}: {problem}")
    if not found:
        shown = ", ".join(f"{n} {installs[n]}" for n in ("torch", "s3fs", "botocore", "pytest") if n in installs)
        print(f"check_install: ok in {seconds:.0f} s, {len(installs)} packages, no backtracking: "
              f"{shlex.join(words)} -> {shown}")
    return 1 if found else 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    return check(argv if argv else readme_install_line(ROOT / "README.md"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
