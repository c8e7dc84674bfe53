"""What a probe needs, set up before it runs and torn down after, in one place for every probe:
the availability check (`unavailable_reason`), a unique work directory under a local target,
the embedded S3 server when no endpoint is named (and its hand-off to spawned ranks), a GPU.

Commands with their own CLI call these pieces; probes with the generic CLI get them all from
`prepare(spec, args)`. A world (ranks) is still set up by session.in_world, which every world
command already goes through.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterator

from ..core.errors import ProbeUnavailable, RunError, UsageError
from ..core.registry import ProbeSpec
from ..core.units import format_bytes_human
from ..world.dist import World

# How a launching process hands its embedded server to the ranks it spawns. The key pair is
# generated per run and only ever travels in the ranks' environment.
ENV_ENDPOINT, ENV_KEY, ENV_SECRET, ENV_ROOT = ("MICROBENCH_S3_ENDPOINT", "MICROBENCH_S3_KEY_ID",
                                               "MICROBENCH_S3_SECRET", "MICROBENCH_S3_ROOT")
# What prepare reads --path, --keep, --endpoint and --bucket from: the parsed flags, or a view
# of a probe's Config holding them (run/invocation.py).
Flags = argparse.Namespace | SimpleNamespace

# Headroom for the embedded server: a multipart upload briefly keeps a temporary copy of an object.
S3_MARGIN_BYTES = 64 << 20


def check_gpu(what: str) -> None:
    try:
        import torch  # noqa: F401 - only whether it imports; cuda_usable asks it about devices
    except ImportError:
        raise ProbeUnavailable(f"{what}: needs a CUDA GPU and torch is not installed") from None
    from ..world.backends import cuda_usable

    if not cuda_usable():
        raise ProbeUnavailable(f"{what}: needs a CUDA GPU and none is visible to torch")


# --------------------------------------------------------------------------- S3


def check_s3_client() -> None:
    """Before any server starts or request goes out: the S3 client library is there."""
    from ..targets.s3client import s3_client_unavailable_reason

    reason = s3_client_unavailable_reason()
    if reason:
        raise ProbeUnavailable(reason)


def check_embedded_space(need_bytes: int, smaller: str = "a smaller size") -> None:
    """The embedded server keeps its objects under the temp dir: refuse a run that cannot fit."""
    tmp = tempfile.gettempdir()
    need = need_bytes + S3_MARGIN_BYTES
    free = shutil.disk_usage(tmp).free
    if free < need:
        raise UsageError(f"not enough free space in {tmp!r} for the embedded S3 server: need "
                         f"{format_bytes_human(need)}, have {format_bytes_human(free)}; use {smaller} "
                         f"or set TMPDIR to a larger filesystem")


def embedded_s3(stack: contextlib.ExitStack, bucket: str, need_bytes: int, smaller: str = "a smaller size") -> Any:
    """Start the embedded S3 server (rclone serve s3) for this run, once its objects fit under
    the temp dir; stopped when `stack` closes. Under `microbench suite` the suite's shared server
    is used instead (s3server.embedded), and left running for the next step."""
    from ..targets.s3server import embedded

    check_embedded_space(need_bytes, smaller)
    return stack.enter_context(embedded(bucket))


def embedded_s3_env(server: Any) -> dict[str, str]:
    """The variables that let spawned ranks reach the launcher's embedded server."""
    return {ENV_ENDPOINT: server.endpoint_url, ENV_KEY: server.credentials.access_key_id,
            ENV_SECRET: server.credentials.secret_access_key, ENV_ROOT: str(server.root)}


def embedded_s3_from_env() -> dict[str, str | None] | None:
    """In a spawned rank: the launcher's embedded server (endpoint, key, secret, root), or None."""
    endpoint = os.environ.get(ENV_ENDPOINT)
    if not endpoint:
        return None
    return {"endpoint": endpoint, "key": os.environ.get(ENV_KEY), "secret": os.environ.get(ENV_SECRET),
            "root": os.environ.get(ENV_ROOT)}


def embedded_s3_for_ranks(stack: contextlib.ExitStack, target: Any, endpoint: str | None, need_bytes: int,
                          smaller: str) -> tuple[Any, dict[str, str]]:
    """For an s3:// target: the client library checked, and, when no --endpoint is named and this
    process spawns its ranks itself (no launcher), the embedded server started (stopped with
    `stack`) with the variables that hand it to the ranks. (None, {}) otherwise."""
    from ..world.launch import detect_world

    if target.kind != "s3":
        return None, {}
    check_s3_client()
    if endpoint is not None or detect_world() is not None:
        return None, {}
    server = embedded_s3(stack, target.bucket, need_bytes, smaller)
    return server, embedded_s3_env(server)


def ranks_or_here(inv: Any, nproc: int, timeout_s: float, backend: str, env: dict[str, str], body: Any) -> None:
    """Run `body(world)` on every rank (a launcher's, or `nproc` spawned with `env` added), or,
    for one rank and no launcher, `body(None)` here: no second interpreter, no process group."""
    import dataclasses

    from ..world import backends
    from ..world.launch import detect_world
    from ..world.policy import in_world

    if detect_world() is None and nproc == 1:
        body(None)
        return
    choice = backends.choose(backend)
    choice = dataclasses.replace(choice, env={**choice.env, **env})
    inv.exit_code = in_world(nproc=nproc, timeout_s=timeout_s, choice=choice, body=body, argv=inv.argv)


def s3_target(endpoint: str | None, server: Any) -> tuple[Any, str | None]:
    """The S3 target a rank talks to (--endpoint, the server this process started, or the
    launcher's embedded server handed down), and the embedded server's data directory (None for
    a remote server, whose cache is out of reach)."""
    from ..targets.s3client import Target
    from ..targets.s3server import REGION, Credentials

    if endpoint:
        return Target(endpoint), None
    if server is not None:
        return Target.for_embedded(server), str(server.root)
    handed = embedded_s3_from_env()
    if handed is None:
        raise UsageError("an s3:// target under torchrun/srun/mpirun needs --endpoint URL (the embedded server is "
                         "only started for ranks microbench spawns itself)")
    key, secret = handed["key"], handed["secret"]
    assert key is not None and secret is not None   # the launcher hands both with the endpoint
    return Target(handed["endpoint"], REGION, "path", Credentials(key, secret)), handed["root"]


# --------------------------------------------------------------------------- a world's run directory


def on_rank0(world: World, action: Any) -> None:
    """Run `action` on rank 0 only (or here, without a world); a UsageError or RunError it raises
    ends every rank (rank 0 with the message, the others pointing at rank 0) instead of leaving
    them waiting."""
    if world is None:
        action()
        return
    error = None
    if world.rank == 0:
        try:
            action()
        except (UsageError, RunError) as exc:
            error = (type(exc).__name__, str(exc))
    error = world.broadcast_object(error)
    if error:
        if world.rank != 0:
            raise RunError("rank 0 could not prepare the target")
        raise (UsageError if error[0] == "UsageError" else RunError)(error[1])


def shared_run_dir(world: World, target: Any, access: Any, need_bytes: int, what: str) -> Any:
    """The run's own directory under a local or s3:// target (checkpoint_target.RunDir), one name
    for every rank, created by rank 0 once the free space is there; the caller removes it."""
    from ..targets import checkpoint_target as ct

    name = world.broadcast_object(ct.unique_name() if world.rank == 0 else None)
    run_dir = ct.RunDir(target, name, access)

    def create() -> None:
        if target.kind == "local":
            ct.check_free_space(ct.existing_ancestor(target.path), need_bytes, what)
        run_dir.create()

    on_rank0(world, create)
    return run_dir


# --------------------------------------------------------------------------- generic probes


@dataclass
class Context:
    """What was set up for one run of a probe; `spec.build(config, context)` receives it."""

    args: Flags | None = None
    workdir: Any = None        # workdir.WorkDir under --path (needs.target)
    s3: Any = None             # s3client.Target (needs.s3): the embedded server or --endpoint
    bucket: str | None = None
    world: World | None = None   # dist.World on every rank (needs.world)
    run_dir: Any = None        # a run directory a probe's own run made (checkpoint)
    transport: Any = None      # () -> what the record says about the transport (nccl)
    cred_source: str = "unknown"   # where S3 credentials came from, for the record
    facts: dict[str, Any] = field(default_factory=dict)   # for the record's implementation


@contextlib.contextmanager
def prepare(spec: ProbeSpec, args: Flags, *, s3_bytes: int = 0) -> Iterator[Context]:
    """Set up what `spec` needs (outside any world) and tear it down afterwards."""
    if spec.needs.gpu:
        check_gpu(spec.name)
    context = Context(args=args)
    with contextlib.ExitStack() as stack:
        if spec.needs.target:
            from ..targets.workdir import WorkDir

            context.workdir = stack.enter_context(WorkDir(args.path, keep=args.keep, prefix=f"microbench-{spec.name}-"))
            context.facts.update(context.workdir.facts())
        if spec.needs.s3:
            context.s3, context.bucket = _s3_target(stack, args, s3_bytes)
        yield context


def _s3_target(stack: contextlib.ExitStack, args: Flags, need_bytes: int) -> tuple[Any, str]:
    from ..targets.s3client import Target, check_endpoint, preflight
    from ..targets.s3server import DEFAULT_BUCKET

    check_s3_client()
    if args.endpoint:
        if not args.bucket:
            raise UsageError("--endpoint needs --bucket: an existing bucket to write test objects into, "
                             "e.g. --bucket my-bucket")
        target = Target(check_endpoint(args.endpoint))
    else:
        target = Target.for_embedded(embedded_s3(stack, args.bucket or DEFAULT_BUCKET, need_bytes))
    bucket = args.bucket or DEFAULT_BUCKET
    preflight(target, bucket, timeout_s=10)
    return target, bucket
