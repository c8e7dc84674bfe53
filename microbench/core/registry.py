"""The probe registry: fio's engine ops table for microbench.

Every probe module in `microbench/probes/` exports one `SPEC` (a `ProbeSpec`): its one name
(command, record kind, suite step and module agree), its `Config` dataclass, how to build the
probe, its CLI, its metric columns with the primary one first, what it needs (a world, a
target, S3, a GPU) and the suite steps it contributes. The CLI, the suite, plot, accept,
compare, report and compose read these specs; none keeps its own list of probes or metrics.

Adding a probe is one module with a `SPEC` (and its tests). Probes that live outside the package
(a site's own, or a test's) are named in `MICROBENCH_PROBES` as importable modules, comma
separated; child processes (ranks, suite steps) inherit the variable and so see the same set.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .errors import UsageError

PLUGINS_ENV = "MICROBENCH_PROBES"
BUILTIN_PROBES = "microbench.probes"   # the package of built-in probes, walked for SPECs


@dataclass(frozen=True)
class Needs:
    """What the runner sets up (and tears down) before the probe runs."""

    world: bool = False    # runs on every rank of a world: local ranks or a launcher's
    target: bool = False   # writes under a directory or an S3 prefix (`--target`/`--path`)
    s3: bool = False       # an S3 endpoint; the embedded server when none is named
    gpu: bool = False      # CUDA only; elsewhere a skip with its reason


@dataclass(frozen=True)
class SuiteStep:
    """One `microbench suite` step: the probe's command with these arguments; `{path}` is the
    suite's scratch directory. The step's name names its record file."""

    name: str
    argv: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()   # former step names, read in older suite directories
    # The op names this step's rows carry, where its Config has no `ops` option that says so
    # (`suite --accept` refuses a check on another before any step runs); empty: not declared.
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class SweepDefaults:
    """The shared sweep flags' defaults for one probe (--warmup, --iters, --budget), and whether
    its cases are checked (`check_flag`: a --check/--no-check flag turns it off)."""

    warmup: int = 5
    iters: int = 20
    budget_s: float = 2.0
    check: bool = True
    check_flag: bool = False


@dataclass(frozen=True)
class ProbeSpec:
    name: str                          # the record kind; also the module's and suite step's name
    command: tuple[str, ...]           # words after `microbench`: ("nccl",), ("storage", "posix")
    help: str                          # one line for `microbench --help`
    metrics: tuple[str, ...]           # metric columns a row may carry, the primary first
    config: type | None = None         # the Config dataclass: the probe's option table (core/options.py)
    build: Callable[..., Any] | None = None  # build(config, context) -> Probe
    description: str | None = None     # the command's --help text; default: help
    sweep: SweepDefaults = field(default_factory=SweepDefaults)
    # validate(config) -> config: every check and resolution that needs no work done yet (misuse
    # is refused here, before anything is set up); returns the config the run uses.
    validate: Callable[[Any], Any] | None = None
    # run(spec, config, invocation) -> outcome: how the probe runs when the generic runner
    # (run/invocation.py) does not fit, e.g. a storage target it opens itself or a world it shapes.
    run: Callable[..., Any] | None = None
    # print(outcome, config) -> None, or a line naming what failed (wrong elements read back), which
    # the command raises as a RunError once the outputs are written. None: the generic table.
    printer: Callable[..., Any] | None = None
    needs: Needs = field(default_factory=Needs)
    suite: tuple[SuiteStep, ...] = ()
    aliases: tuple[str, ...] = ()      # former names (v1 record kinds, suite steps) read as this
    row_schema: type | None = None     # the row's fields and units (results/schema.py checks it)
    order: int = 100                   # place in --help and in the suite
    # Row fields besides op and size_bytes that tell two cases apart: compare pairs rows on them,
    # plot and report name a curve or a case by those that vary ("all_reduce in", "write fio").
    case_keys: tuple[str, ...] = ()
    # A case key's value in rows written before the key existed (nccl's group: "world"), so an
    # old record pairs and plots with a new one.
    case_defaults: tuple[tuple[str, Any], ...] = ()
    # case_words(key, row) -> str | None: a case key's value in words for a legend where the
    # common reading (accept/plots.case_words: "out-of-place", "4 threads") says less than the
    # probe knows (a storage row's I/O streams are its threads times its queue depth).
    case_words: Callable[[str, dict[str, Any]], str | None] | None = None
    # `implementation` fields two records must share to be compared like with like, besides
    # what every record is held to (probe, world size, dtype, device, engine).
    identity_keys: tuple[str, ...] = ()
    # What its records can stand for in `microbench compose`: "network" (collective curves),
    # "tier" (a storage tier's write/read bandwidth), "compute" (a matmul rate).
    feeds: tuple[str, ...] = ()

    @property
    def primary_metric(self) -> str:
        return self.metrics[0]

    def row_metric(self, row: dict[str, Any]) -> str | None:
        """The primary metric this row carries: storage rows carry write_gbps or read_gbps by op,
        so it is the first of `metrics` present as a number."""
        for key in self.metrics:
            if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool):
                return key
        return None


_cache: list[ProbeSpec] | None = None


def _module_specs(module_name: str, origin: str) -> list[ProbeSpec]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import probe module {module_name!r} named in {origin}: {exc} "
                         f"(expected an importable module exporting SPEC, e.g. {PLUGINS_ENV}=mysite.probe)") from None
    spec = getattr(module, "SPEC", None)
    if spec is None:
        return []
    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    for one in specs:
        if not isinstance(one, ProbeSpec):
            raise UsageError(
                f"{module_name}.SPEC is a {type(one).__name__}, expected a microbench.core.registry.ProbeSpec"
            )
    return specs


def _probe_modules(path: Iterable[str], prefix: str) -> list[str]:
    """Every module under microbench/probes that may hold a SPEC: a probe is a module or a
    package (probes/nccl/), and a package without a SPEC of its own groups probes
    (probes/storage/). Helper modules inside a probe's package (nccl/ring.py) are not probes."""
    out = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        name = f"{prefix}.{info.name}"
        out.append(name)
        if info.ispkg and getattr(importlib.import_module(name), "SPEC", None) is None:
            out += _probe_modules(importlib.import_module(name).__path__, name)
    return out


def specs() -> list[ProbeSpec]:
    """Every registered probe, built-in and from MICROBENCH_PROBES, in `order`."""
    global _cache
    if _cache is None:
        # Found by name, as plugins are: the registry sits below every probe and imports none.
        probes = importlib.import_module(BUILTIN_PROBES)
        found: list[ProbeSpec] = []
        for name in _probe_modules(probes.__path__, probes.__name__):
            found += _module_specs(name, "microbench/probes")
        for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
            found += _module_specs(name, PLUGINS_ENV)
        seen: dict[str, ProbeSpec] = {}
        for spec in found:
            for key in (spec.name, *spec.aliases):
                if key in seen and seen[key] is not spec:
                    raise UsageError(f"two probes are named {key!r} ({seen[key].command} and {spec.command}); "
                                     f"expected one name per probe")
                seen[key] = spec
        _cache = sorted(found, key=lambda s: (s.order, s.name))
    return list(_cache)


def reset() -> None:
    """Forget the discovered specs (tests that change MICROBENCH_PROBES)."""
    global _cache
    _cache = None


def find(name: str) -> ProbeSpec | None:
    """The spec whose name, alias or record kind is `name` (`None` when no probe has it)."""
    for spec in specs():
        if name == spec.name or name in spec.aliases:
            return spec
    return None


def get(name: str) -> ProbeSpec:
    spec = find(name)
    if spec is None:
        known = ", ".join(s.name for s in specs())
        raise UsageError(f"unknown probe {name!r}: expected one of {known}")
    return spec


def for_record(record: dict[str, Any]) -> ProbeSpec | None:
    """The spec that wrote a record (by its kind), or None for tool records (compose, verify)."""
    return find(str(record.get("kind", "")))


def metric_columns() -> tuple[str, ...]:
    """Every metric column any probe declares, for readers that meet rows of unknown kind."""
    out: list[str] = []
    for spec in specs():
        out += [m for m in spec.metrics if m not in out]
    return tuple(out)


def case_keys(record: dict[str, Any]) -> tuple[str, ...]:
    """The row fields that tell a record's cases apart: its probe's, or for a record no probe
    claims (a former kind, a tool's), every probe's."""
    spec = for_record(record)
    if spec is not None:
        return spec.case_keys
    out: list[str] = []
    for one in specs():
        out += [k for k in one.case_keys if k not in out]
    return tuple(out)


def case_defaults(record: dict[str, Any]) -> dict[str, Any]:
    """The values a record's rows have for case keys they do not carry (see ProbeSpec.case_defaults)."""
    spec = for_record(record)
    return dict(spec.case_defaults) if spec is not None else {}


def feeding(use: str) -> list[ProbeSpec]:
    """The probes whose records can stand for `use` in `microbench compose` ("network", "tier",
    "compute")."""
    return [spec for spec in specs() if use in spec.feeds]


def suite_steps() -> list[tuple[ProbeSpec, SuiteStep]]:
    return [(spec, step) for spec in specs() for step in spec.suite]


def _step_word(name: str) -> str:
    # A step's record file is its name with dashes for spaces (storage-posix.json).
    return name.strip().replace("-", " ")


def suite_step(name: str) -> tuple[ProbeSpec, SuiteStep] | None:
    """The suite step that a step name, a former name or a record file's stem names: `nccl`,
    `collectives` (its name in older suite directories) and `storage-posix` all resolve."""
    wanted = _step_word(name)
    for spec, step in suite_steps():
        if wanted in (_step_word(n) for n in (step.name, *step.aliases)):
            return spec, step
    return None


def step_key(name: str) -> str:
    """One key per suite step, whichever of its names (or file stems) `name` is; a name no step
    has is its own key, so records of tools (compose, hunt) still pair by file name."""
    found = suite_step(name)
    return found[1].name if found else name


def row_spec(row: dict[str, Any], record: dict[str, Any] | None = None) -> ProbeSpec | None:
    """The spec of the probe that wrote a row: its record's kind, else the row's own `probe`."""
    return (for_record(record) if record is not None else None) or find(str(row.get("probe", "")))


def row_metric(row: dict[str, Any], record: dict[str, Any] | None = None) -> str | None:
    """The primary metric a row carries, by the spec of its record (or of the row's `probe`);
    for a row no probe claims, the first metric column any probe declares that it carries."""
    spec = row_spec(row, record)
    if spec is not None:
        return spec.row_metric(row)
    for key in metric_columns():
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key
    return None
