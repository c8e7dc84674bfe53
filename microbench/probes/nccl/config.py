"""The collective probe's option table and the checks made before any rank starts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...core.options import choice, one_of, option, positive_int, sweep, timeout
from ...core.units import DTYPES, parse_sizes
from .groups import GROUPS
from .ops import DEFAULT_OPS, OPS


def _expected(text: Any, flag: str) -> dict[str, Any] | None:
    from ...expect.overrides import override

    return override(text)


@dataclass
class Config:
    sizes: list[int] = option(parse_sizes("1M-256M"), parse=sweep, shown="1M-256M",
                              help="1M-4G (range), 64M, or 1M,8M,64M; binary units")
    ops: list[str] = option(
        list(DEFAULT_OPS),
        parse=one_of(tuple(OPS)),
        shown=f"{','.join(DEFAULT_OPS)}, the ones FSDP uses",
        help=f"some of {','.join(OPS)}",
    )
    dtype: str | None = option(None, parse=choice(DTYPES), shown="bfloat16 on GPU, float32 on CPU",
                               help="float32, bfloat16 or float16")
    nproc: int | None = option(None, parse=positive_int, record=False, shown="number of GPUs, else 2",
                               help="local ranks to spawn when not launched by torchrun/srun/mpirun")
    requested_backend: str = option("auto", flag="--backend", record=False, shown="auto: nccl with CUDA, else gloo",
                                    help="auto, nccl or gloo")
    # "torch": the library's own collectives (what FSDP calls); "ring": microbench's rings over
    # send/recv (probes/nccl/ring.py), the fabric's capability apart from the library's algorithm.
    algo: str = option("torch",   # checked by check_algo, with the ops it covers
                       help="torch: the library's collectives, what FSDP gets; ring: microbench's rings over "
                            "send/recv, the fabric's capability (reduce_scatter, all_gather, all_reduce)")
    transport: str = option("auto", record=False, help="auto, ib or tcp (ib needs NCCL and InfiniBand)")
    check: bool = option(True, record=False, shown="on",
                         help="verify every result element against the known pattern")
    timeout_s: float = option(60.0, parse=timeout, flag="--timeout", record=False, shown="60",
                              help="seconds before a silent peer fails the run")
    lab: str | None = option(None, metavar="NAME", record=False,
                             help="place one rank per host of this lab (see `microbench lab`)")
    link_profiles: str | None = option(None, metavar="RATES", record=False,
                                       help="with --lab: run the sweep under each egress rate, e.g. 1gbit,unlimited, "
                                            "and print the sweeps side by side with their ratio")
    measure_link: bool = option(False, switch=True, record=False,
                                help="measure the rank 0 - rank 1 TCP link first (2 ranks) and state busbw as a "
                                     "share of it")
    link_result: str | None = option(None, metavar="FILE", record=False,
                                     help="a `microbench link` record: report busbw as a percentage of that "
                                          "measured link")
    expected: dict | None = option(None, parse=_expected, metavar="RATE", record=False, shown="",
                                   help="the busbw this hardware should reach, overriding what sysfs/NVML say, with "
                                        "a unit: e.g. 24GB/s or 200Gbit (results then show %% of it)")
    groups: list[str] | None = option(None, parse=one_of(GROUPS), shown="world only",
                                      help="some of world,node,cross: the collective over the whole world, within "
                                           "each node (all nodes at once) and across nodes, one rank per node per "
                                           "group (all such groups at once, sharing each node's NICs, as HSDP runs "
                                           "them); nodes come from the launcher's local world size")
    backend: str = "gloo"
    device: str = "cpu"


def validate(config: Config) -> Config:
    """Every flag checked before any rank starts, so misuse fails fast with exit 2."""
    from ...world import backends
    from ...world.policy import local_ranks
    from .ops import check_algo

    # On a lab the placement decides (one rank per host); elsewhere one rank per GPU, else 2.
    nproc = config.nproc or (None if config.lab else local_ranks())
    chosen = backends.choose(config.requested_backend, config.transport)
    dtype = config.dtype or ("bfloat16" if chosen.device == "cuda" else "float32")
    check_algo(config.algo, config.ops)
    return replace(config, nproc=nproc, dtype=dtype, backend=chosen.backend, device=chosen.device)
