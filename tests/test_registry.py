"""The probe registry wired through: a probe that exists only in this test (a module in tmp_path,
named in MICROBENCH_PROBES) gets a command, a suite step, a record and a plot; the generic
command's options come from its Config; lookups refuse duplicates and bad modules."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import PKG_PARENT, cli_env, last_line
from microbench.core import registry
from microbench.core.errors import UsageError

NAME = "bytefill"
MODULE = "mb_test_bytefill_probe"

PROBE_SOURCE = textwrap.dedent(f'''
    """A test-only probe: how fast a bytearray fills with one byte value."""
    from dataclasses import dataclass

    from microbench.core.options import option, positive_int, sweep
    from microbench.core.probe import Case, Probe
    from microbench.core.registry import ProbeSpec, SuiteStep


    @dataclass
    class Config:
        sizes: list[int] = option([4096, 1 << 20], parse=sweep, help="buffer sizes")
        value: int = option(7, help="byte value to fill with")
        repeat: int = option(1, parse=positive_int, help="fills per timed iteration")


    class FillProbe(Probe):
        name = "{NAME}"

        def __init__(self, config):
            self.config = config
            self.buf = self.pattern = None

        def cases(self):
            return [Case("fill", size) for size in self.config.sizes]

        def prepare(self, case):
            self.buf = bytearray(case.size_bytes)
            self.pattern = bytes([self.config.value]) * case.size_bytes

        def run_once(self, case):
            for _ in range(self.config.repeat):
                self.buf[:] = self.pattern

        def check(self, case):
            return len(self.buf) - self.buf.count(self.config.value)

        def metrics(self, case, time_s):
            return {{"fill_gbps": case.size_bytes * self.config.repeat / time_s / 1e9}}

        def release(self, case):
            self.buf = self.pattern = None


    SPEC = ProbeSpec(name="{NAME}", command=("{NAME}",), help="bytearray fill bandwidth (a test-only probe)",
                     metrics=("fill_gbps",), config=Config, build=lambda config, context: FillProbe(config),
                     suite=(SuiteStep("{NAME}", ("--sizes", "4K,64K", "--iters", "3", "--warmup", "1")),), order=900)
''')


@pytest.fixture
def plugin(tmp_path):
    """The probe module in a directory of its own, and a runner of `python -P -m microbench`
    that imports this checkout's package and the probe (and nothing from the working directory)."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(PROBE_SOURCE)
    work = tmp_path / "work"
    work.mkdir()
    env = cli_env({"PYTHONPATH": os.pathsep.join((PKG_PARENT, str(mods))), "MICROBENCH_PROBES": MODULE})

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "microbench", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return run, work


def _git_status() -> str | None:
    done = subprocess.run(["git", "-C", PKG_PARENT, "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


@pytest.mark.slow
def test_a_probe_registered_only_in_the_test_runs_through_cli_suite_record_and_plot(plugin):
    run, work = plugin
    before = _git_status()

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert NAME in helped.stdout and "bytearray fill bandwidth" in helped.stdout
    own = run(NAME, "--help")
    assert own.returncode == 0, own.stderr
    assert "--sizes" in own.stdout and "buffer sizes" in own.stdout and "--value" in own.stdout
    # A flag is one Config field: --help shows it with its default, the run takes it.
    assert "--repeat" in own.stdout and "fills per timed iteration (default 1)" in " ".join(own.stdout.split())
    assert "--json" in own.stdout and "--csv" in own.stdout and "--results-dir" in own.stdout

    done = run(NAME, "--sizes", "4K,256K", "--value", "9", "--repeat", "2", "--iters", "3", "--warmup", "1",
               "--json", "fill.json", "--csv", "fill.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fill_gbps" in done.stdout and "# results: fill.json" in done.stdout
    record = json.loads((work / "fill.json").read_text())
    assert record["status"] == "complete" and record["kind"] == NAME
    assert record["config"]["probe"] == {"sizes": [4096, 256 << 10], "value": 9, "repeat": 2}
    assert [r["size_bytes"] for r in record["rows"]] == [4096, 256 << 10]
    assert all(r["fill_gbps"] > 0 and r["nwrong"] == 0 and r["op"] == "fill" for r in record["rows"])
    assert (work / "fill.csv").read_text().count("\n") == 3   # header + one row per case

    suite = run("suite", "--only", NAME, "--results-dir", "r")
    assert suite.returncode == 0, suite.stdout + suite.stderr
    (step_record,) = (work / "r").glob(f"suite-*/{NAME}.json")
    from_suite = json.loads(step_record.read_text())
    assert from_suite["status"] == "complete" and from_suite["kind"] == NAME
    assert [r["size_bytes"] for r in from_suite["rows"]] == [4096, 64 << 10]
    assert all(r["fill_gbps"] > 0 for r in from_suite["rows"])
    assert "fill" in suite.stdout and "pass" in suite.stdout

    plotted = run("plot", "fill.json", "--out", "fill.png")
    assert plotted.returncode == 0, plotted.stderr
    assert (work / "fill.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Adding the probe took no file outside the test: the checkout is as it was.
    assert _git_status() == before


@pytest.mark.slow
def test_the_generic_command_refuses_bad_values_with_one_line(plugin):
    run, work = plugin
    for args, needle in ((("--sizes", "1Q"), "invalid --sizes '1Q'"), (("--value", "x"), "invalid --value 'x'")):
        done = run(NAME, *args)
        assert done.returncode == 2, done.stderr
        assert last_line(done.stderr).startswith(f"microbench: {needle}") and len(done.stderr.strip().splitlines()) == 1
    assert not list(work.glob("**/*.json"))


@pytest.mark.slow
def test_a_bad_probe_module_is_one_line_and_exit_2(tmp_path):
    env = cli_env({"MICROBENCH_PROBES": "mb_no_such_probe_module"})
    done = subprocess.run([sys.executable, "-P", "-m", "microbench", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("microbench: cannot import probe module 'mb_no_such_probe_module' named in "
                                  "MICROBENCH_PROBES") and len(done.stderr.strip().splitlines()) == 1


NEEDS_SOURCE = textwrap.dedent('''
    """Test-only probes that need a target directory, a world, a GPU."""
    from dataclasses import dataclass

    from microbench.core.probe import Case, Probe
    from microbench.core.registry import Needs, ProbeSpec


    @dataclass
    class Config:
        size_bytes: int = 1 << 16


    class FileProbe(Probe):
        name = "mbt_filewrite"

        def __init__(self, config, context):
            self.config, self.dir = config, context.workdir

        def cases(self):
            return [Case("write", self.config.size_bytes)]

        def run_once(self, case):
            path = self.dir.files[0] if self.dir.files else self.dir.new_file("data.bin")
            with open(path, "wb") as handle:
                handle.write(b"x" * case.size_bytes)

        def metrics(self, case, time_s):
            return {"write_gbps": case.size_bytes / time_s / 1e9}


    class BarrierProbe(Probe):
        name = "mbt_barrier"

        def __init__(self, context):
            self.world = context.world

        def cases(self):
            return [Case("barrier", 0)]

        def run_once(self, case):
            self.world.barrier()

        def metrics(self, case, time_s):
            return {"rate_per_s": 1 / time_s}


    SPEC = [
        ProbeSpec(name="mbt_filewrite", command=("mbt-filewrite",), help="file write", metrics=("write_gbps",),
                  config=Config, build=lambda config, context: FileProbe(config, context), needs=Needs(target=True)),
        ProbeSpec(name="mbt_barrier", command=("mbt-barrier",), help="barrier", metrics=("rate_per_s",),
                  build=lambda config, context: BarrierProbe(context), needs=Needs(world=True)),
        ProbeSpec(name="mbt_gpu", command=("mbt-gpu",), help="gpu", metrics=("x_gbps",),
                  build=lambda config, context: None, needs=Needs(gpu=True)),
    ]
''')


@pytest.mark.slow
def test_the_runner_side_sets_up_what_a_generic_probe_needs(tmp_path):
    mods, work, base = tmp_path / "mods", tmp_path / "work", tmp_path / "base"
    for d in (mods, work, base):
        d.mkdir()
    (mods / "mb_test_needs_probes.py").write_text(NEEDS_SOURCE)
    env = cli_env({"PYTHONPATH": os.pathsep.join((PKG_PARENT, str(mods))), "MICROBENCH_PROBES": "mb_test_needs_probes"})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "microbench", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=300)

    wrote = run("mbt-filewrite", "--path", str(base), "--iters", "3", "--warmup", "1", "--json", "f.json")
    assert wrote.returncode == 0, wrote.stderr
    impl = json.loads((work / "f.json").read_text())["implementation"]
    assert Path(impl["workdir"]).parent == base and impl["kept"] is False
    assert list(base.iterdir()) == []   # the run's own directory, removed
    missing = run("mbt-filewrite", "--path", str(base / "nope"))
    assert missing.returncode == 2 and "does not exist" in last_line(missing.stderr)

    ranks = run("mbt-barrier", "--nproc", "2", "--iters", "3", "--warmup", "1", "--json", "b.json")
    assert ranks.returncode == 0, ranks.stderr
    record = json.loads((work / "b.json").read_text())
    assert record["config"]["world"]["size"] == 2 and record["rows"][0]["rate_per_s"] > 0

    # The GPU is hidden on any host (conftest: MICROBENCH_TEST_GPU=absent reaches this child
    # through cli_env), so the skip is asserted everywhere, a GPU machine included.
    assert env["MICROBENCH_TEST_GPU"] == "absent"
    gpu = run("mbt-gpu", "--json", "g.json")
    assert gpu.returncode == 0 and last_line(gpu.stderr).startswith("microbench: skipped: mbt_gpu: needs a CUDA GPU")
    # Skipped before the sweep (needs' GPU check), still one skipped record with the reason.
    skipped = json.loads((work / "g.json").read_text())
    assert skipped["status"] == "skipped" and skipped["status_reason"].startswith("mbt_gpu: needs a CUDA GPU")
    assert skipped["kind"] == "mbt_gpu" and skipped["rows"] == []


# --------------------------------------------------------------------------- lookups


@pytest.fixture
def probes_env(tmp_path, monkeypatch):
    """Point MICROBENCH_PROBES at modules written here; the registry forgets them afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def use(**modules: str) -> None:
        for name, source in modules.items():
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.setenv(registry.PLUGINS_ENV, ",".join(modules))
        registry.reset()

    yield use
    monkeypatch.delenv(registry.PLUGINS_ENV, raising=False)
    registry.reset()


def test_two_probes_with_one_name_are_refused(probes_env):
    spec = 'from microbench.core.registry import ProbeSpec\nSPEC = ProbeSpec(name="{n}", command=("{c}",), help="h", metrics=("x_gbps",))\n'
    probes_env(mb_dup_a=spec.format(n="twin", c="twin-a"), mb_dup_b=spec.format(n="twin", c="twin-b"))
    with pytest.raises(UsageError, match="two probes are named 'twin'"):
        registry.specs()


def test_a_probe_may_not_take_a_built_in_probes_former_name(probes_env):
    probes_env(mb_dup_c='from microbench.core.registry import ProbeSpec\n'
                        'SPEC = ProbeSpec(name="collectives", command=("c",), help="h", metrics=("x_gbps",))\n')
    with pytest.raises(UsageError, match="two probes are named 'collectives'"):
        registry.specs()


def test_a_spec_that_is_not_a_probe_spec_is_refused(probes_env):
    probes_env(mb_not_spec="SPEC = {'name': 'x'}\n")
    with pytest.raises(UsageError, match="SPEC is a dict, expected a microbench.core.registry.ProbeSpec"):
        registry.specs()


def test_lookups_by_name_alias_and_record():
    registry.reset()
    nccl = registry.get("nccl")
    assert registry.find("collectives") is nccl and registry.for_record({"kind": "nccl"}) is nccl
    assert registry.for_record({"kind": "compose"}) is None
    with pytest.raises(UsageError, match="unknown probe 'nope': expected one of"):
        registry.get("nope")
    assert nccl.primary_metric in registry.metric_columns()


def test_suite_steps_and_their_files_follow_the_registry_with_former_names():
    from microbench.accept.suite import select_steps
    from microbench.accept.suite import default_steps, record_file_for, step_for_file

    steps = default_steps()
    assert [s.name for s in steps] == [step.name for _, step in registry.suite_steps()]
    nccl = next(s for s in steps if s.name == "nccl")
    assert nccl.argv[0] == "nccl" and "collectives" in nccl.aliases
    assert select_steps("collectives,memory") == [s for s in steps if s.name in ("memory", "nccl")]
    assert step_for_file("collectives.json") == "nccl" and step_for_file("nccl.json") == "nccl"
    assert step_for_file("suite-1/storage-posix.json") == "storage posix" and step_for_file("notes.json") is None
    assert record_file_for("checkpoint s3") == "checkpoint-s3.json"
    with pytest.raises(UsageError, match="invalid --only 'gpu': expected some of"):
        select_steps("gpu")


def test_every_built_in_probe_has_a_command_and_the_tools_list_names_none():
    from microbench import cli

    parser = cli.build_parser()
    required = {"checkpoint": ["--target", "/tmp"], "storage_gds": ["--path", "/tmp"]}
    for spec in registry.specs():
        args = parser.parse_args([*spec.command, *required.get(spec.name, [])])
        assert callable(args.handler), spec.name
    assert not {s.command[0] for s in registry.specs()} & set(cli.COMMAND_MODULES)
    assert {"nccl", "storage", "suite", "verify"} <= cli.measuring_commands()


# --------------------------------------------------------------------------- generic options


@dataclass
class _Config:
    sizes: list[int] = field(default_factory=lambda: [1 << 20], metadata={"help": "message sizes"})
    chunk_bytes: int = 4096
    total_bytes: int | None = None
    ops: list[str] = field(default_factory=lambda: ["read"])
    counts: list[int] = field(default_factory=lambda: [1, 2])
    verify: bool = True
    rate: float = 0.5
    label: str = "x"
    depth: int = field(default=0, metadata={"help": "queue depth"})
    scale: int = field(default=1, init=False)


def _generic_parser(config: type) -> argparse.ArgumentParser:
    from microbench.commands import generic

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    spec = registry.ProbeSpec(name="g", command=("g",), help="generic", metrics=("x_gbps",), config=config)
    generic.add_probe_parser(sub, "g", spec)
    return parser


def test_options_are_generated_from_the_config_fields():
    from microbench.commands.generic import config_options

    kinds = {o.field: o.kind for o in config_options(_Config)}
    assert kinds == {"sizes": "sizes", "chunk_bytes": "size", "total_bytes": "size", "ops": "str_list",
                     "counts": "int_list", "verify": "bool", "rate": "float", "label": "str", "depth": "int"}
    helps = {o.field: o.help for o in config_options(_Config)}
    assert helps["sizes"] == "message sizes" and helps["depth"] == "queue depth"
    text = _generic_parser(_Config)._subparsers._group_actions[0].choices["g"].format_help()
    assert "--chunk-bytes" in text and "default 4K" in text and "message sizes (default 1M)" in text
    assert "--no-verify" in text and "--scale" not in text


def test_generic_values_parse_like_the_built_in_flags():
    from microbench.commands.generic import build_config

    parser = _generic_parser(_Config)
    spec = registry.ProbeSpec(name="g", command=("g",), help="generic", metrics=("x_gbps",), config=_Config)
    args = parser.parse_args(["g", "--sizes", "1M-4M", "--chunk-bytes", "64K", "--ops", "read,write",
                              "--counts", "3,4", "--no-verify", "--rate", "2.5", "--depth", "8"])
    config = build_config(spec, args)
    assert config.sizes == [1 << 20, 2 << 20, 4 << 20] and config.chunk_bytes == 64 << 10
    assert config.ops == ["read", "write"] and config.counts == [3, 4] and config.verify is False
    assert config.rate == 2.5 and config.depth == 8 and config.label == "x" and config.total_bytes is None
    defaults = build_config(spec, parser.parse_args(["g"]))
    assert defaults == _Config()
    for argv, needle in ((["--rate", "nan"], "invalid --rate 'nan'"), (["--depth", "1.5"], "invalid --depth '1.5'"),
                         (["--chunk-bytes", "4Q"], "invalid --chunk-bytes '4Q'"), (["--ops", ","], "invalid --ops ','")):
        with pytest.raises(UsageError, match=needle):
            build_config(spec, parser.parse_args(["g", *argv]))


def test_a_config_field_that_clashes_with_a_shared_option_is_named():
    @dataclass
    class Clash:
        iters: int = 3

    with pytest.raises(UsageError, match="probe 'g': a Config field clashes with a shared option"):
        _generic_parser(Clash)
