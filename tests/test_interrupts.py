"""One SIGINT/SIGTERM path: interrupts.py installs and restores every handler, and a signal at
any moment of the CLI, its very end included, is one line and exit 1, never a death by signal."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    cli_env,
    one_error_line,
    ranks_of,
    records,
    start_nccl_sweep,
    wait_for,
)

from microbench.world import interrupts

PACKAGE = Path(interrupts.__file__).resolve().parent


@pytest.fixture
def own_handlers():
    """Whatever a test installs is put back: pytest's process keeps its own handlers."""
    saved = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    hits = interrupts.hits
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    interrupts.hits = hits


def test_only_interrupts_installs_signal_handlers():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "interrupts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("signal", "pthread_sigmask", "siginterrupt")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "signal"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_handled_installs_for_the_block_and_puts_back_what_was_there(own_handlers):
    got = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with interrupts.handled(lambda signum, frame: got.append(signum)):
        assert all(signal.getsignal(sig) is not interrupts.handler for sig in interrupts.SIGNALS)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    assert got == [signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.handled():
        assert signal.getsignal(signal.SIGTERM) is interrupts.handler


def test_the_cli_keeps_its_handler_until_main_returns(own_handlers, tmp_path, capsys):
    """main() installs the counting handler and leaves it in place when it returns: a signal in
    the caller's last moments must meet it, not the default action (a death by SIGINT, -2)."""
    from microbench.cli import main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert all(signal.getsignal(sig) is interrupts.handler for sig in interrupts.SIGNALS)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _entry(body: str) -> subprocess.CompletedProcess:
    """Run microbench's console entry with cli.main replaced by `body` (a function `main`)."""
    code = (f"import os, signal, sys, time\nimport microbench.cli\n{body}\n"
            "microbench.cli.main = main\nfrom microbench.__main__ import entry\nentry()\n")
    return subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_as_main_returns_is_exit_1_with_one_line(signame):
    # The signal's handler runs at the first bytecode boundary after the kill: in main's return
    # or in entry just after it, after the command's own handling; both must end the same way.
    done = _entry(f"def main():\n    os.kill(os.getpid(), signal.{signame})\n    return 0\n")
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == ["microbench: interrupted"]


@pytest.mark.slow
def test_a_signal_after_the_exit_code_is_decided_changes_nothing():
    # After closing(): the flush and the interpreter's exit keep main's code.
    done = _entry("def main():\n    return 3\n"
                  "import microbench.world.interrupts as i\n_closing = i.closing\n"
                  "def closing():\n    _closing()\n    os.kill(os.getpid(), signal.SIGINT)\n"
                  "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(0.05)\n"
                  "i.closing = closing\n")
    assert done.returncode == 3, done
    assert done.stderr == ""


def test_a_signal_inside_the_import_locks_callback_is_kept_for_check(own_handlers):
    """Raised there, Python would print 'Exception ignored in ...' and lose it: counted instead,
    and `check()` (right after the CLI's import) raises it."""
    from types import SimpleNamespace

    interrupts.hits = 0
    frame = SimpleNamespace(f_code=SimpleNamespace(co_name="cb", co_filename="<frozen importlib._bootstrap>"))
    interrupts.handler(signal.SIGINT, frame)
    assert interrupts.pending()
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
    interrupts.hits = 0
    with pytest.raises(KeyboardInterrupt):
        interrupts.handler(signal.SIGTERM, sys._getframe())


def test_take_and_restore_pair_like_handled(own_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    previous = interrupts.take()
    assert signal.getsignal(signal.SIGTERM) is interrupts.handler
    interrupts.restore(previous)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_handler_that_runs_after_closing_counts_and_never_raises(monkeypatch):
    # A signal that arrived just before closing() blocked it runs its Python handler just after:
    # a KeyboardInterrupt there would escape entry() and Python would exit 130.
    from microbench.world import interrupts

    monkeypatch.setattr(interrupts, "hits", 0)
    monkeypatch.setattr(interrupts, "closed", True)
    interrupts.handler(2, None)   # would raise KeyboardInterrupt were the run not closing
    assert interrupts.hits == 1


def test_a_signal_inside_deferred_is_counted_then_raised_when_the_block_ends(monkeypatch):
    # torch's first import runs C++ initialisers that call back into Python; a KeyboardInterrupt
    # raised there aborted a rank (std::terminate). Inside deferred() the handler only counts.
    from microbench.world import interrupts

    monkeypatch.setattr(interrupts, "hits", 0)
    monkeypatch.setattr(interrupts, "deferring", 0)
    reached_end = False
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with interrupts.deferred():       # nested: only the outermost block raises
                interrupts.handler(2, None)
            interrupts.handler(15, None)
            reached_end = True
    assert reached_end and interrupts.hits == 2 and interrupts.deferring == 0
    monkeypatch.setattr(interrupts, "hits", 0)
    with interrupts.deferred():               # no signal: nothing raised
        pass


@pytest.mark.slow
@pytest.mark.parametrize("signals", [("SIGINT", "SIGTERM"), ("SIGTERM", "SIGINT"), ("SIGINT", "SIGINT")])
def test_two_signals_close_together_keep_the_partial_record(tmp_path, signals):
    proc = start_nccl_sweep(tmp_path)
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted") and "(partial)" in line
    (record,) = records(tmp_path)
    assert record["status"] == "partial" and len(record["rows"]) >= 2


def _start(tmp_path):
    return subprocess.Popen([sys.executable, "-m", "microbench", "nccl", "--sizes", "1M-64M", "--ops", "all_reduce",
                             "--nproc", "2", "--timeout", "30"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.xdist_group("timed")
@pytest.mark.slow
@pytest.mark.parametrize("moment", ["importing", "ranks starting", "ranks joining"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up(tmp_path, moment, signame):
    proc = _start(tmp_path)
    if moment == "importing":
        # Once the native core is mapped the launcher runs our code, importing. (Before the
        # interpreter has read its site-packages, no Python program can catch a signal.)
        def importing():
            try:
                with open(f"/proc/{proc.pid}/maps") as handle:
                    return "_native" in handle.read()
            except OSError:
                return False

        wait_for(importing, proc, "microbench being imported", 60)
    else:
        wait_for(lambda: len(ranks_of(proc.pid)) == 2, proc, "two ranks", 60)
        if moment == "ranks joining":
            time.sleep(1.5)
    sent = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10  # not the 30 s --timeout: nothing to save yet
    assert proc.returncode == 1, err
    line = one_error_line(err)
    assert line.startswith("microbench: interrupted")
    for record in records(tmp_path):
        assert record["status"] == "partial"


def test_an_error_after_a_signal_is_the_interrupt_not_an_internal_error(monkeypatch, capsys):
    """A signal that cuts an import short leaves the module half made; the next import of it
    raises ImportError ("cannot load module more than once per process", seen under load in
    `test_a_signal_during_start_up`). That is the interrupt's doing: exit 1, "interrupted"."""
    import argparse

    from microbench import cli
    from microbench.world import interrupts

    def handler(args):
        interrupts.hits += 1
        raise ImportError("cannot load module more than once per process")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command="env", handler=handler)

    monkeypatch.setattr(interrupts, "hits", 0)
    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli._run(["env"]) == 1
    assert capsys.readouterr().err == "microbench: interrupted\n"

    # Without a signal the same error is a bug, and says so.
    def broken(args):
        raise ImportError("cannot load module more than once per process")

    monkeypatch.setattr(interrupts, "hits", 0)
    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {"parse_args": lambda self, a: argparse.Namespace(
        command="env", handler=broken)})())
    assert cli._run(["env"]) == 1
    assert capsys.readouterr().err.startswith("microbench: internal error: ImportError: cannot load module")
