"""Writes through a bucket mount, as a training job writes a checkpoint file: the time the
application is blocked (write, fsync, close return) and the time until the store holds every
byte (polled over the S3 API, never through the mount).

Each case mounts the embedded S3 server (or --endpoint/--bucket) with `microbench mount up`'s
library in one mode, writes a new --size file sequentially in --bs blocks per iteration, and
unmounts (removing the cache) afterwards. direct: close returns after the upload, so blocked is
durable. cached: the write lands in rclone's VFS cache on local disk and is uploaded
--write-back after close; durable = blocked + the delay + the upload.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from ...core.errors import RunError
from ...core.options import nbytes, one_of, option, positive, timeout
from ...core.probe import Case, Probe, Timed
from ...core.registry import Needs, ProbeSpec, SuiteStep, SweepDefaults
from ...core.units import format_number, format_size
from ...results.schema import ProbeRow
from ...targets import mount as mountmod
from ...targets.mount import facts as mount_facts, system as mount_sys


@dataclass
class Config:
    modes: list[str] = option(["direct", "cached"], parse=one_of(mountmod.MODES), flag="--mode",
                              help="direct (writes stream to the bucket) and/or cached (rclone's VFS cache)")
    size: int = option(256 << 20, parse=nbytes, shown="256M", help="bytes written per save (one file)")
    bs: int = option(16 << 20, parse=nbytes, shown="16M", help="write() size")
    write_back_s: float = option(1.0, parse=positive, flag="--write-back", shown="1",
                                 help="cached: seconds after close before rclone uploads")
    cache_dir: str | None = option(None, help="cached: local directory for the cache", shown="the state directory")
    endpoint: str | None = option(None, record=False, shown="", help="S3 endpoint URL (standard AWS credentials); "
                                  "default: the embedded server")
    bucket: str | None = option(None, shown="microbench", help="bucket to mount")
    timeout_s: float = option(300.0, parse=timeout, flag="--timeout", record=False, shown="300",
                              help="seconds to wait for the store to hold a save")


class MountRow(ProbeRow):
    mode: str
    bs_bytes: int
    write_gbps: float               # bytes / blocked time (what the application sees)
    blocked_time_us: float
    durable_time_us: float
    durable_gbps: float             # bytes / durable time
    blocked_is_durable: bool


class MountProbe(Probe):
    name = "storage_mount"

    def __init__(self, config: Config):
        self.config = config
        self.name_ = f"p{os.getpid()}"
        self.state: Any = None
        self.step = 0
        self.facts: dict[str, dict[str, Any]] = {}

    def unavailable_reason(self) -> str | None:
        return mount_sys.fuse_unavailable_reason()

    def implementation(self) -> dict[str, Any]:
        return {"engine": "python write()+fsync+close through rclone mount", "mounts": self.facts}

    def cases(self) -> list[Case]:
        return [Case("write", self.config.size, (("mode", m),)) for m in self.config.modes]

    def row_fields(self, case: Case) -> dict[str, Any]:
        return {"mode": case.param("mode"), "bs_bytes": self.config.bs}

    def prepare(self, case: Case) -> None:
        c = self.config
        mode = case.param("mode")
        req = mountmod.MountRequest(name=self.name_, mode=mode, cache_dir=c.cache_dir if mode == "cached" else None,
                                    write_back_s=c.write_back_s, endpoint=c.endpoint, bucket=c.bucket)
        self.state, _ = mountmod.up(req)
        facts = mount_facts.facts_for_path(self.state.path) or {}
        self.facts[mode] = facts
        mount_facts.store_client(self.state.path)   # made before the timed drains

    def run_once(self, case: Case) -> Timed:
        assert self.state is not None
        self.step += 1
        directory = os.path.join(self.state.path, f"save-{self.step}")
        os.mkdir(directory)
        block = os.urandom(self.config.bs)
        start = time.perf_counter()
        try:
            fd = os.open(os.path.join(directory, "data.bin"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                left = self.config.size
                while left > 0:
                    left -= os.write(fd, block[:min(left, len(block))])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise RunError(f"writing {format_size(self.config.size)} through the {case.param('mode')} mount at "
                           f"{self.state.path} failed: {exc.strerror or exc}") from None
        blocked = time.perf_counter() - start
        durable = mount_facts.wait_durable(directory, started_at=start, timeout_s=self.config.timeout_s)
        _remove(directory)
        return Timed(blocked, {"blocked_time_us": blocked * 1e6, "durable_time_us": durable.seconds * 1e6,
                               "durable_gbps": self.config.size / durable.seconds / 1e9,
                               "blocked_is_durable": case.param("mode") == "direct"})

    def release(self, case: Case) -> None:
        if self.state is not None:
            mountmod.down(self.name_)
            self.state = None

    def metrics(self, case: Case, time_s: float) -> dict[str, Any]:
        return {"write_gbps": self.config.size / time_s / 1e9}


def _remove(directory: str) -> None:
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)


def validate(config: Config) -> Config:
    for mode in config.modes:
        mountmod.check_mode(mode)
    if config.cache_dir is not None and "cached" in config.modes:
        mountmod.check_cache_dir(config.cache_dir)
    if config.bs > config.size:
        config.bs = config.size
    return config


def _print(outcome: Any, config: Config) -> None:
    from ...core.tables import text_table

    rows = outcome.rows
    first: dict[str, Any] = next(iter(outcome.record["implementation"].get("mounts", {}).values()), {})
    print(f"# microbench storage mount: {format_size(config.size)} per save, write() of {format_size(config.bs)}, "
          f"on {first.get('backing_store', '?')}; rclone {first.get('rclone_version', '?')}")
    print(text_table([(r["mode"], f"{r['blocked_time_us'] / 1e3:.1f}", f"{r['durable_time_us'] / 1e3:.1f}",
                     f"{r['write_gbps']:.3f}", f"{r['durable_gbps']:.3f}", r["iters"]) for r in rows],
                   headers=["mode", "blocked (ms)", "durable (ms)", "blocked GB/s", "durable GB/s", "iters"],
                   tablefmt="simple"))
    print(
        f"# blocked = write+fsync+close returned; durable = the store held every byte (polled over S3); cached "
        f"uploads start {format_number(config.write_back_s, 6)} s after close; direct: close returns after the upload"
    )
    print(f"# results: {outcome.path}")


SPEC = ProbeSpec(
    name="storage_mount", command=("storage", "mount"), order=45,
    help="writes through an rclone bucket mount (direct, cached): blocked time and time until durable",
    description="Mount a bucket with rclone (the embedded S3 server by default), write one file per save through "
                "it and time until close returns (blocked) and until the store holds every byte (durable).",
    metrics=("write_gbps", "durable_gbps"), config=Config, build=lambda config, context=None: MountProbe(config),
    row_schema=MountRow, validate=validate, printer=_print,
    sweep=SweepDefaults(warmup=0, iters=2, budget_s=2.0, check=False), needs=Needs(), aliases=(),
    case_keys=("mode",), feeds=("tier",),
    suite=(SuiteStep("storage mount", ("--size", "64M"), ops=("write",)),),
)
