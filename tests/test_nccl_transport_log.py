"""Item 2 of issue 18: the transport the record names is read from NCCL's own log lines.

The logs in tests/data/nccl_logs/ are NCCL's format strings filled in, with NCCL's log prefix
(src/debug.cc); the README there names each line's source. The cases the issue lists: an IB run,
a socket run, a host where NCCL printed "NET/IB : No device found." and ran over sockets, a single
node whose channels are all P2P/SHM although NCCL printed "Using network IB", and AWS EFA through
aws-ofi-nccl ("Using network Libfabric")."""

from __future__ import annotations

from pathlib import Path

import pytest

from microbench.world.backends import nccl_transport_from_log
from microbench.world.policy import transport_note
from microbench.world.backends import BackendChoice

LOGS = Path(__file__).parent / "data" / "nccl_logs"


@pytest.mark.parametrize("name, used, source", [
    # src/transport/net.cc "via NET/%s/%d%s..." with the IB module's name
    ("ib_two_nodes.log", "ib", "src/transport/net_ib/init.cc + src/transport/net.cc"),
    # src/transport/net_socket.cc "NET/Socket : Using%s" + net.cc "via NET/Socket/0"
    ("socket_two_nodes.log", "tcp", "src/transport/net_socket.cc + src/transport/net.cc"),
    # src/transport/net_ib/init.cc "NET/IB : No device found." then sockets: the silent TCP fallback
    ("no_ib_device_socket.log", "tcp", "src/transport/net_ib/init.cc + src/transport/net.cc"),
    # src/init.cc "Using network %s" for every communicator; src/transport/p2p.cc, shm.cc channels
    ("p2p_single_node_with_ib.log", "intra-node (NVLink/P2P)", "src/init.cc + src/transport/p2p.cc"),
    # aws-ofi-nccl src/nccl_ofi_interface_nvidia.cpp .name = "Libfabric"; NCCL net.cc channel lines
    ("efa_libfabric.log", "libfabric", "aws-ofi-nccl src/nccl_ofi_net.cpp + NCCL src/transport/net.cc"),
])
def test_the_transport_comes_from_the_channel_lines(name, used, source):
    assert nccl_transport_from_log((LOGS / name).read_text()) == used, source


def test_no_ib_device_is_never_read_as_ib():
    text = (LOGS / "no_ib_device_socket.log").read_text()
    assert "NET/IB : No device found." in text
    assert nccl_transport_from_log(text) != "ib"


def test_only_shm_channels_are_intra_node_shm_and_a_log_without_channels_is_unknown():
    shm_only = "node1:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct\n"
    assert nccl_transport_from_log(shm_only) == "intra-node (SHM)"
    # One rank: NCCL names its network module but opens no channel; nothing crossed anything.
    one_rank = "node1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n" \
               "node1:1:1 [0] NCCL INFO Using network IB\n"
    assert nccl_transport_from_log(one_rank) is None


def test_a_plugin_name_with_a_space_is_kept_whole():
    # aws-ofi-nccl renames itself "AWS Libfabric" when NCCL_NET says so (nccl_ofi_interface_nvidia.cpp).
    line = "node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA\n"
    assert nccl_transport_from_log(line) == "aws libfabric"


def test_the_record_reads_every_rank_log_in_the_directory(tmp_path):
    (tmp_path / "nccl.node1.100.log").write_text((LOGS / "no_ib_device_socket.log").read_text())
    (tmp_path / "nccl.node1.101.log").write_text("")
    choice = BackendChoice("nccl", "cuda", "auto", {}, "CUDA and NCCL present")
    note = transport_note(choice, str(tmp_path))
    assert note["transport_requested"] == "auto" and note["transport_used"] == "tcp"
