"""Backend and transport selection: pure logic, every combination, on any machine."""

import pytest

from microbench.world.backends import nccl_transport_from_log, select_backend
from microbench.core.errors import ProbeUnavailable, UsageError


def choose(requested, transport, cuda=False, nccl=False, ib=()):
    return select_backend(requested, transport, cuda_available=cuda, nccl_available=nccl, ib_devices=list(ib))


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_auto_without_cuda_is_gloo_on_cpu_over_tcp(transport):
    choice = choose("auto", transport)
    assert (choice.backend, choice.device, choice.transport, choice.env) == ("gloo", "cpu", "tcp", {})
    assert "no CUDA" in choice.reason


def test_auto_with_cuda_but_no_nccl_falls_back_to_gloo():
    assert choose("auto", "auto", cuda=True, nccl=False).backend == "gloo"


def test_auto_with_cuda_and_nccl_is_nccl_and_lets_nccl_pick_the_transport():
    choice = choose("auto", "auto", cuda=True, nccl=True, ib=["mlx5_0"])
    assert (choice.backend, choice.device, choice.transport, choice.env) == ("nccl", "cuda", "auto", {})


@pytest.mark.parametrize("requested", ["auto", "nccl"])
def test_tcp_on_nccl_requires_the_socket_transport(requested):
    choice = choose(requested, "tcp", cuda=True, nccl=True, ib=["mlx5_0"])
    assert choice.transport == "tcp"
    # NCCL_NET=Socket: no net plugin (aws-ofi-nccl) and no IB either (NCCL src/plugin/net.cc).
    assert choice.env == {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"}


def test_ib_on_nccl_needs_an_ib_device():
    choice = choose("nccl", "ib", cuda=True, nccl=True, ib=["mlx5_0"])
    # NCCL_NET=IB: NCCL initializes only the net module named IB and fails without it (issue 18, item 3).
    assert (choice.transport, choice.env) == ("ib", {"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0"})
    with pytest.raises(ProbeUnavailable, match="InfiniBand"):
        choose("nccl", "ib", cuda=True, nccl=True, ib=[])


@pytest.mark.parametrize("requested", ["gloo", "auto"])
def test_ib_with_gloo_is_misuse(requested):
    with pytest.raises(UsageError) as info:
        choose(requested, "ib")
    assert "'ib'" in str(info.value) and "gloo only speaks TCP" in str(info.value)


def test_explicit_gloo_on_a_gpu_machine_stays_on_cpu():
    choice = choose("gloo", "tcp", cuda=True, nccl=True, ib=["mlx5_0"])
    assert (choice.backend, choice.device, choice.reason) == ("gloo", "cpu", "gloo requested")


def test_nccl_without_cuda_is_unavailable_with_a_reason():
    with pytest.raises(ProbeUnavailable, match="needs a CUDA GPU"):
        choose("nccl", "auto")
    with pytest.raises(ProbeUnavailable, match="not built into this torch"):
        choose("nccl", "auto", cuda=True, nccl=False)


@pytest.mark.parametrize("backend, transport, bad", [("mpi", "auto", "'mpi'"), ("gloo", "rdma", "'rdma'")])
def test_unknown_backend_or_transport_quotes_the_value(backend, transport, bad):
    with pytest.raises(UsageError) as info:
        choose(backend, transport)
    assert bad in str(info.value) and "e.g." in str(info.value)


@pytest.mark.parametrize("log, used", [
    # "Using network" alone (no channel) says which module NCCL loaded, not what carried data.
    ("node1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>\n"
     "NCCL INFO Using network IB", None),
    ("NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA", "ib"),
    ("NCCL INFO Channel 00 : 0[0] -> 1[0] [receive] via NET/Socket/0", "tcp"),
    ("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "intra-node (NVLink/P2P)"),
    ("NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct", "intra-node (SHM)"),
    ("NCCL version 2.21.5+cuda12.4", None),
    ("", None),
])
def test_transport_from_nccl_log(log, used):
    assert nccl_transport_from_log(log) == used


def test_a_network_channel_wins_over_intra_node_channels():
    log = "via P2P/IPC\nNCCL INFO Using network Socket\nvia NET/Socket/0"
    assert nccl_transport_from_log(log) == "tcp"
