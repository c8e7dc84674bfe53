"""Issue 18: the GPU paths, proved without a GPU where the libraries' real behaviour allows.

Item 1 calls torch's own init_process_group argument check (torch/distributed/distributed_c10d.py)
with torch's accelerator query standing in for a CUDA build; items 5-11 test the selection logic
on the CPU. Tests marked `gpu` run the real thing and skip here (benchmarks/gpu_smoke.sh runs them).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from conftest import one_error_line
from microbench.world import backends, policy as session
from microbench.expect import formulas as ex, facts as hwfacts
from microbench.run import runner
from microbench.world.dist import World
from microbench.world.launch import WorldSpec, free_port
from microbench.core.errors import RunError, UsageError
from microbench.core.probe import Case, Probe


def _cuda_built_torch(monkeypatch, count: int) -> None:
    """torch as a CUDA build with `count` devices sees itself, as far as init_process_group's
    device_id check asks: torch.accelerator.current_accelerator() and device_count()."""
    import torch

    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: count)


class _PastTheDeviceCheck(Exception):
    pass


def _stop_after_device_check(monkeypatch) -> list:
    """init_process_group's checks run for real; the group it would build next (NCCL, absent from
    this CPU torch) is replaced by a stop that records the device it was given."""
    import torch.distributed.distributed_c10d as c10d

    seen = []

    def stop(*args, **kwargs):
        seen.append(kwargs.get("device_id"))
        raise _PastTheDeviceCheck(f"device checks passed for {kwargs.get('device_id')}")

    monkeypatch.setattr(c10d, "_new_process_group_helper", stop)
    return seen


# --------------------------------------------------------------------------- item 1


@pytest.mark.slow
def test_torch_itself_refuses_a_cuda_device_without_index(monkeypatch):
    import torch
    import torch.distributed as dist

    _cuda_built_torch(monkeypatch, 2)
    seen = _stop_after_device_check(monkeypatch)
    store = dist.HashStore()
    with pytest.raises(ValueError, match="Please use a device_id with index"):
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda"))
    with pytest.raises(_PastTheDeviceCheck):
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:1"))
    assert seen == [torch.device("cuda:1")]


@pytest.mark.slow
def test_a_nccl_rank_joins_with_its_own_indexed_gpu(monkeypatch):
    """session.in_world, in a rank (LOCAL_RANK 1 of 2): sets cuda:1 and hands torch's real
    init_process_group device_id=cuda:1, which passes torch's own check."""
    import torch

    _cuda_built_torch(monkeypatch, 2)
    seen = _stop_after_device_check(monkeypatch)
    set_to = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: set_to.append(index))
    port = free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    choice = backends.BackendChoice("nccl", "cuda", "auto", {}, "test")
    with pytest.raises(RunError, match="device checks passed for cuda:1"):
        session.in_world(nproc=2, timeout_s=5, choice=choice, body=lambda world: 0)
    assert set_to == [1] and seen == [torch.device("cuda:1")]


def test_the_world_refuses_an_index_less_gpu_before_torch_does():
    spec = WorldSpec(0, 1, 0, "127.0.0.1", free_port(), "local")
    with pytest.raises(RunError, match="has no index"):
        World(spec, "nccl", 5, device="cuda")


# --------------------------------------------------------------------------- item 3


def test_transport_ib_is_enforced_and_a_failure_says_so(monkeypatch):
    choice = backends.select_backend("nccl", "ib", cuda_available=True, nccl_available=True, ib_devices=["mlx5_0"])
    assert choice.env["NCCL_NET"] == "IB"
    # A real (gloo, one rank) world whose body fails: the message carries why NCCL did not fall back.
    port = free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    as_gloo = backends.BackendChoice("gloo", "cpu", "ib", choice.env, "test")
    hint = backends.transport_failure_hint(backends.BackendChoice("nccl", "cuda", "ib", choice.env, "test"))
    assert "NCCL_NET=IB" in hint

    def body(world):
        raise RunError("collective failed during all_reduce 1M: NCCL error: invalid usage")

    monkeypatch.setattr(backends, "transport_failure_hint", lambda c: hint)
    with pytest.raises(RunError) as info:
        session.in_world(nproc=1, timeout_s=10, choice=as_gloo, body=body)
    assert "invalid usage" in str(info.value) and "NCCL_NET=IB" in str(info.value)
    monkeypatch.delenv("NCCL_NET")  # in_world exported the choice's variables
    monkeypatch.delenv("NCCL_IB_DISABLE")


# --------------------------------------------------------------------------- item 4


def test_the_ring_exchanges_as_one_grouped_batch_receive_first():
    from microbench.probes.nccl.ring import Ring

    calls = []

    class Work:
        def wait(self):
            calls.append("wait")

    fake = types.SimpleNamespace(
        irecv="irecv", isend="isend",
        P2POp=lambda op, tensor, peer: (op, tensor, peer),
        batch_isend_irecv=lambda ops: (calls.append(("batch", list(ops))), [Work(), Work()])[1])
    ring = Ring(fake, rank=0, size=2)
    ring._exchange("send-buf", "recv-buf")
    assert calls == [("batch", [("irecv", "recv-buf", 1), ("isend", "send-buf", 1)]), "wait", "wait"]


# --------------------------------------------------------------------------- item 5


def test_more_local_ranks_than_gpus_is_refused_in_one_line():
    with pytest.raises(UsageError) as info:
        session.check_gpu_ranks(2, 1)
    text = str(info.value)
    assert "'2'" not in text and "--nproc 2" in text and "1 GPU(s)" in text and "--nproc 1" in text
    session.check_gpu_ranks(8, 8)
    assert session.local_gpu(3, 8, 8) == 3
    with pytest.raises(UsageError):
        session.local_gpu(1, 2, 1)  # a launcher (torchrun) that started 2 ranks on a 1-GPU host


def test_the_launcher_refuses_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(session, "gpu_count", lambda: 1)
    started = []
    monkeypatch.setattr(session, "launch_local", lambda *a, **k: started.append(a) or 0)
    choice = backends.BackendChoice("nccl", "cuda", "auto", {}, "test")
    with pytest.raises(UsageError, match="each local rank needs its own"):
        session.in_world(nproc=2, timeout_s=5, choice=choice, body=lambda w: 0)
    assert started == []
    assert session.in_world(nproc=1, timeout_s=5, choice=choice, body=lambda w: 0) == 0 and len(started) == 1


def test_suite_steps_leave_the_rank_count_to_the_default():
    from microbench.core import registry

    for _, step in registry.suite_steps():
        if step.name in ("nccl", "checkpoint", "checkpoint s3"):
            assert "--nproc" not in step.argv, step.name


# --------------------------------------------------------------------------- item 6


def test_the_launcher_checks_each_gpu_for_one_rank_without_cuda(monkeypatch):
    """--sizes 1M-8G on 8 GPUs with 71 GiB free each: one rank needs ~17 GiB of its own GPU."""
    import torch
    from microbench.probes.nccl import run as cmd
    from microbench.probes import nccl as coll

    def no_context(*a, **k):
        raise AssertionError("the launcher must not create a CUDA context")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_context)
    config = coll.Config(sizes=[1 << 20, 8 << 30], ops=list(coll.DEFAULT_OPS), dtype="bfloat16", backend="nccl",
                         device="cuda")
    asked = []
    cmd.launcher_memory_check(config, "cuda", 8, gpu_free=lambda n: asked.append(n) or [71 << 30] * n)
    assert asked == [8]
    # A GPU where only the large sizes do not fit: no refusal, the ranks plan which cases to skip.
    cmd.launcher_memory_check(config, "cuda", 8, gpu_free=lambda n: [71 << 30] * 3 + [10 << 30] * 5)
    with pytest.raises(UsageError, match="no size of --sizes fits in GPU memory on GPU 3"):
        cmd.launcher_memory_check(config, "cuda", 8, gpu_free=lambda n: [71 << 30] * 3 + [200 << 20] * 5)
    cmd.launcher_memory_check(config, "cuda", 8, gpu_free=lambda n: None)  # no NVML: the ranks check


def test_gpu_free_memory_is_read_through_nvml_handles(monkeypatch):
    calls = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")
    fake.nvmlShutdown = lambda: calls.append("shutdown")
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    fake.nvmlDeviceGetHandleByUUID = lambda u: ("u", u)
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=(h[1] if h[0] == "h" else 99) << 30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert session.gpu_free_bytes_without_context(2) == [0, 1 << 30]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc")
    assert session.gpu_free_bytes_without_context(2) == [3 << 30, 99 << 30]
    assert calls == ["init", "shutdown", "init", "shutdown"]


# --------------------------------------------------------------------------- item 7


@pytest.mark.parametrize("raw, arch, gen, per_gpu_gbps", [
    (4, 7, 3, 12 * 25.0),      # A100: NVML_NVLINK_VERSION_3_0, 12 links
    (6, 9, 4, 18 * 25.0),      # H100: NVML_NVLINK_VERSION_4_0, 18 links
    (7, 9, 4, 18 * 25.0),      # H100 on drivers that say NVML_NVLINK_VERSION_5_0
    (7, 10, 5, 18 * 50.0),     # B200: NVML_NVLINK_VERSION_5_0
])
def test_nvlink_generation_from_the_nvml_enum(monkeypatch, raw, arch, gen, per_gpu_gbps):
    # Values of nvidia-ml-py's pynvml.py: _nvmlNvlinkVersion_t and _nvmlDeviceArchitecture_t.
    links = 12 if arch == 7 else 18
    fake = types.ModuleType("pynvml")
    fake.NVML_FEATURE_ENABLED, fake.NVML_NVLINK_MAX_LINKS = 1, 18
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < links else 0
    fake.nvmlDeviceGetNvLinkVersion = lambda h, link: raw
    fake.nvmlDeviceGetArchitecture = lambda h: arch
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:07:00.0")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, source = hwfacts.gpus([])
    assert source == "nvml" and gpus[0]["nvlink_gen"] == gen and gpus[0]["nvlink_version_nvml"] == raw
    assert f"nvmlDeviceGetNvLinkVersion = {raw}" in gpus[0]["nvlink_version_note"]
    facts = {"gpus": gpus * 8, "nics": [], "lab": None}
    e = ex.expected_busbw(facts, "all_reduce", nodes=1, ranks_per_node=8, device="cuda")
    assert e["gbps"] == pytest.approx(per_gpu_gbps * ex.NVLINK_EFFICIENCY)
    assert e["inputs"]["nvlink_version_nvml"] == raw


# --------------------------------------------------------------------------- item 8


def _nic(name, rate, rdma=False, state="up"):
    return {"name": name, "link": "ethernet", "rdma": rdma, "rdma_device": "mlx5_x" if rdma else None,
            "state": state, "rate_gbit": rate, "rate_source": "test", "unknown_why": None, "pci_path": None}


def test_tcp_expectations_use_the_socket_nics_not_the_rdma_ones():
    """8x 400G RoCE NICs and a 25G eno1: --transport tcp with NCCL_SOCKET_IFNAME=eno1 is 25G."""
    facts = {"nics": [_nic(f"ens{i}np0", 400.0, rdma=True) for i in range(8)] + [_nic("eno1", 25.0)],
             "default_route_nic": "eno1", "socket_ifname": "eno1", "nccl_socket_ifname": "eno1", "gpus": [],
             "lab": None}
    rdma = ex.expected_busbw(facts, "all_reduce", nodes=2, ranks_per_node=1, device="cuda", transport="auto")
    tcp = ex.expected_busbw(facts, "all_reduce", nodes=2, ranks_per_node=1, device="cuda", transport="tcp")
    assert rdma["gbps"] == pytest.approx(8 * 400 / 8 * ex.NIC_EFFICIENCY)
    assert tcp["gbps"] == pytest.approx(25 / 8 * ex.NIC_EFFICIENCY) and tcp["inputs"]["nics"] == ["eno1"]
    assert tcp["layout"]["transport"] == "tcp"


def test_nccl_sockets_prefer_ipoib_interfaces_as_nccl_does():
    """NCCL's ncclFindInterfaces (src/misc/socket.cc): no NCCL_SOCKET_IFNAME -> 'ib' prefix first,
    then anything but docker, lo, virbr; IB ports without an IPoIB netdev carry no sockets."""
    ib_port = {**_nic("mlx5_0/1", 400.0, rdma=True), "link": "infiniband"}
    facts = {"nics": [_nic("eno1", 25.0), _nic("ib0", 200.0), _nic("docker0", 10.0), ib_port],
             "default_route_nic": "eno1", "socket_ifname": None, "nccl_socket_ifname": None, "gpus": [], "lab": None}
    tcp = ex.expected_busbw(facts, "all_gather", nodes=2, ranks_per_node=1, device="cuda", transport="tcp")
    assert tcp["inputs"]["nics"] == ["ib0"]
    no_ipoib = {**facts, "nics": [_nic("eno1", 25.0), _nic("docker0", 10.0), _nic("virbr0", 10.0), ib_port]}
    tcp = ex.expected_busbw(no_ipoib, "all_gather", nodes=2, ranks_per_node=1, device="cuda", transport="tcp")
    assert tcp["inputs"]["nics"] == ["eno1"]
    excluded = {**facts, "nccl_socket_ifname": "^ib,docker"}
    tcp = ex.expected_busbw(excluded, "all_gather", nodes=2, ranks_per_node=1, device="cuda", transport="tcp")
    assert tcp["inputs"]["nics"] == ["eno1"]


# --------------------------------------------------------------------------- item 9


def _kvikio_26_10(monkeypatch, *, requested: str, preferred: bool, gds: bool | None):
    """kvikio 26.10's Python API (python/kvikio/kvikio/defaults.py, cufile_driver.py): defaults.get
    ("compat_mode") -> CompatMode, defaults.is_compat_mode_preferred(), cufile_driver.properties."""
    kv = types.ModuleType("kvikio")
    defaults = types.ModuleType("kvikio.defaults")
    driver = types.ModuleType("kvikio.cufile_driver")
    defaults.get = lambda name: {"compat_mode": types.SimpleNamespace(name=requested)}[name]
    defaults.is_compat_mode_preferred = lambda: preferred
    driver.properties = types.SimpleNamespace(is_gds_available=gds)
    kv.defaults, kv.cufile_driver = defaults, driver
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", defaults)
    monkeypatch.setitem(sys.modules, "kvikio.cufile_driver", driver)
    return kv


def test_gds_auto_mode_without_cufile_is_recorded_as_posix(monkeypatch):
    from microbench.probes.storage import gds

    # AUTO (kvikio's default) on a host where cuFile cannot load: kvikio infers ON (defaults.cpp,
    # infer_compat_mode_if_auto) and does POSIX I/O; the record must not say cuFile.
    kv = _kvikio_26_10(monkeypatch, requested="AUTO", preferred=True, gds=False)
    info = gds.io_path(kv)
    assert info["served_by"].startswith("kvikio compat mode") and info["real_gds"] is False
    assert info["kvikio_compat_mode"] == "AUTO" and info["kvikio_compat_mode_preferred"] is True
    assert info["compat_answer_from"] == "kvikio.defaults.is_compat_mode_preferred()"
    kv = _kvikio_26_10(monkeypatch, requested="AUTO", preferred=False, gds=True)
    assert gds.io_path(kv)["real_gds"] is True


def test_gds_pattern_needs_memory_of_a_chunk_not_of_the_transfer(monkeypatch, tmp_path):
    import torch
    from microbench.probes.storage import gds

    size = 3 * gds.PATTERN_PERIOD * 1000 + 17
    reference = (torch.arange(size, dtype=torch.int64) % 251).to(torch.uint8)
    real_arange = torch.arange

    def small_arange(*args, **kwargs):
        n = args[0] if args else kwargs.get("end")
        assert n <= gds.PATTERN_PERIOD, f"an index of {n} elements: memory O(size)"
        return real_arange(*args, **kwargs)

    monkeypatch.setattr(gds, "CHECK_CHUNK_BYTES", gds.PATTERN_PERIOD * 64)
    monkeypatch.setattr(torch, "arange", small_arange)
    buf = gds.fill_pattern(torch.empty(size, dtype=torch.uint8))
    assert torch.equal(buf, reference)
    assert gds.count_pattern_mismatches(buf) == 0
    buf[5000] ^= 1
    buf[-1] ^= 1
    assert gds.count_pattern_mismatches(buf) == 2
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(buf.numpy()))
    assert gds.file_pattern_mismatches(str(path), size) == 2
    assert gds.file_pattern_mismatches(str(path), size + 10) == 12   # bytes the file lacks are wrong


# --------------------------------------------------------------------------- item 10


def test_verify_activation_estimate_scales_by_element_size():
    from microbench.verify import model as fm
    from microbench.verify.fsdp.plan import memory_need_bytes
    from microbench.compose.fsdp import TrainSpec, memory_check

    shape = fm.PRESETS["small"]
    tokens, ranks = 256, 2
    for device, scale in (("cuda", 1.0), ("cpu", 2.0)):
        precision = fm.precision_for(device)
        train = TrainSpec(ranks=ranks, micro_batch=1, seq_len=tokens, flops_per_rank=1.0,
                          param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
        check = memory_check(shape, train, None)
        act = check.activation_bytes * scale
        want = (check.sharded_state_bytes + check.gathered_bytes + act
                + shape.total_params * precision.bytes * 2 + act)
        assert memory_need_bytes(shape, tokens, ranks, precision) == pytest.approx(want), device


# --------------------------------------------------------------------------- item 11


def test_gpu_timing_selection():
    assert runner.timing_method(None, True) == runner.TIMING_HOST
    assert runner.timing_method("cuda", False) == runner.TIMING_HOST
    assert runner.timing_method("cuda:1", True) == runner.TIMING_EVENTS
    assert runner.timing_method("cpu", True) == runner.TIMING_HOST


class _GpuLikeProbe(Probe):
    name = "gpu_like"

    def __init__(self):
        self.syncs = 0
        self.runs = 0

    def cases(self):
        return [Case("op", 1024)]

    def run_once(self, case):
        self.runs += 1

    def sync(self):
        self.syncs += 1

    def timed_on(self, case):
        return "cuda:0"


def test_gpu_cases_are_timed_with_events_and_one_synchronize_per_batch(monkeypatch):
    clock = iter(range(1000))

    class Event:
        def record(self):
            self.t_ms = next(clock) * 0.5

        def elapsed_time(self, end):
            return end.t_ms - self.t_ms

    monkeypatch.setattr(runner, "_cuda_available", lambda: True)
    monkeypatch.setattr(runner, "_new_cuda_event", Event)
    probe = _GpuLikeProbe()
    settings = runner.SweepSettings(warmup=2, iters=10, budget_s_per_case=None, check=False)
    row = runner.measure_case(probe, probe.cases()[0], settings, None)
    assert row["timing"] == "cuda_events" and row["iters"] == 10
    assert probe.runs == 12 and probe.syncs == 2 + 1   # one per warm-up iteration, one for the batch
    assert row["time_us"]["p50"] == pytest.approx(500.0)  # 0.5 ms between each pair's events


def test_cpu_cases_say_host_clock(monkeypatch):
    probe = _GpuLikeProbe()
    monkeypatch.setattr(runner, "_cuda_available", lambda: False)
    row = runner.measure_case(probe, probe.cases()[0], runner.SweepSettings(warmup=1, iters=3, budget_s_per_case=None,
                                                                          check=False), None)
    assert row["timing"] == "host_clock" and probe.syncs == 4


# --------------------------------------------------------------------------- the test override and the CLI


def test_the_override_hides_or_forces_the_gpu(monkeypatch):
    monkeypatch.setenv(backends.TEST_GPU_ENV, "absent")
    assert backends.gpu_possible(("/",)) is False and backends.cuda_facts() == (False, False)
    monkeypatch.setenv(backends.TEST_GPU_ENV, "present")
    assert backends.gpu_possible(()) is True
    monkeypatch.setenv(backends.TEST_GPU_ENV, "maybe")
    with pytest.raises(UsageError, match="'maybe'"):
        backends.gpu_possible()


@pytest.mark.slow
def test_the_cli_on_its_gpu_present_branch(run_cli, tmp_path):
    """MICROBENCH_TEST_GPU=present: the launcher takes the GPU-possible branch (imports torch, asks
    CUDA, forks nothing). Here torch finds no CUDA, so the run must still be gloo on CPU with the
    reason, through that branch; on a GPU host the same command is the NCCL smoke (gpu_smoke.sh)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a real GPU is here: benchmarks/gpu_smoke.sh runs the NCCL path")
    res = run_cli("nccl", "--sizes", "64K", "--ops", "all_reduce", "--iters", "3", "--warmup", "1", "--json", "r.json",
                  env={"MICROBENCH_TEST_GPU": "present"})
    assert res.returncode == 0, res.stderr
    rec = json.loads((tmp_path / "r.json").read_text())
    impl = rec["implementation"]
    assert (impl["backend"], impl["device"], impl["backend_reason"]) == ("gloo", "cpu", "no CUDA device, so gloo on CPU")
    assert rec["config"]["world"]["size"] == 2                        # no GPU counted: the CPU default
    assert all(r["timing"] == "host_clock" for r in rec["rows"])
    bad = run_cli("nccl", "--sizes", "64K", env={"MICROBENCH_TEST_GPU": "yes"})
    assert bad.returncode == 2 and "MICROBENCH_TEST_GPU" in one_error_line(bad.stderr)


def test_pyproject_pins_what_torch_2_13_needs():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert "torch>=2.6" in project["dependencies"]
    # PyPI's torch 2.13.0 Linux wheel requires cuda-toolkit==13.0.3 and nvidia-nccl-cu13 (its metadata).
    gpu = project["optional-dependencies"]["gpu"]
    assert {"nvidia-nccl-cu13", "cupy-cuda13x", "kvikio-cu13", "nvidia-ml-py"} == set(gpu)


# --------------------------------------------------------------------------- on a GPU (skipped here)

needs_cuda = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_gpu_a_one_rank_nccl_world_starts_on_its_own_device(monkeypatch):
    import torch

    port = free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    choice = backends.select_backend("nccl", "auto", cuda_available=True, nccl_available=True, ib_devices=[])
    seen = []

    def body(world):
        t = torch.ones(4, device="cuda")
        world._dist.all_reduce(t)
        seen.append((world.device, torch.cuda.current_device(), t.sum().item()))
        return 0

    assert session.in_world(nproc=1, timeout_s=60, choice=choice, body=body) == 0
    assert seen == [("cuda:0", 0, 4.0)]


@pytest.mark.gpu
@needs_cuda
def test_gpu_memory_copies_are_timed_with_cuda_events():
    from microbench.probes.memory import Config, MemoryProbe

    probe = MemoryProbe(Config(sizes=[1 << 20]))
    case = next(c for c in probe.cases() if c.op == "h2d")
    row = runner.measure_case(probe, case, runner.SweepSettings(warmup=2, iters=10, check=False), None)
    assert row["timing"] == "cuda_events" and row["time_us"]["p50"] > 0


@pytest.mark.gpu
@needs_cuda
def test_gpu_dataload_batches_become_one_pinned_tensor():
    """On a GPU host the loop makes each batch one pinned [batch, size] uint8 tensor (one copy of
    the bytes the worker handed over), ready for a non-blocking copy to the device."""
    import torch

    from microbench.probes.dataload.loader import as_tensor

    batch = [bytes([i]) * 16 for i in range(4)]
    out = as_tensor(batch, True)
    assert out.is_pinned() and out.shape == (4, 16) and out.dtype == torch.uint8
    assert out[:, 0].tolist() == [0, 1, 2, 3]
    mixed = as_tensor([b"a" * 3, b"b" * 5], True)
    assert mixed.is_pinned() and mixed.shape == (8,)
