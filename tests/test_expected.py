"""Expected ceilings from recorded hardware facts, checked against hand-computed values."""

from __future__ import annotations

import pytest

from microbench.expect import formulas as ex
from microbench.expect import facts as hwfacts


def _ib_node() -> dict:
    """Facts as hwfacts.collect records them on an 8-GPU H100 node with 8x 400G NDR InfiniBand
    (NVLink 4, 18 links per GPU; each GPU shares a PCIe switch with one NIC)."""
    nics = [{"name": f"ib{i}", "link": "infiniband", "rdma": True, "rdma_device": f"mlx5_{i}", "state": "up",
             "rate_gbit": 400.0, "rate_source": f"/sys/class/infiniband/mlx5_{i}/ports/1/rate: '400 Gb/sec (4X NDR)'",
             "unknown_why": None, "pci_path": None} for i in range(8)]
    nics.append({"name": "eno1", "link": "ethernet", "rdma": False, "rdma_device": None, "state": "up",
                 "rate_gbit": 25.0, "rate_source": "/sys/class/net/eno1/speed: '25000'", "unknown_why": None,
                 "pci_path": None})
    gpus = [{"index": i, "nvlink_gen": 4, "nvlink_links": 18, "nvlink_why": None, "pci_bus_id": f"0000:{i:02x}:00.0",
             "near_nics": [f"ib{i}"]} for i in range(8)]
    return {"nics": nics, "default_route_nic": "eno1", "socket_ifname": None, "gpus": gpus, "gpu_source": "nvml",
            "lab": None}


def _eth_node() -> dict:
    """An 8-GPU A100 node (NVLink 3, 12 links) with a single 100G Ethernet NIC, no RDMA."""
    nics = [{"name": "ens1", "link": "ethernet", "rdma": False, "rdma_device": None, "state": "up",
             "rate_gbit": 100.0, "rate_source": "/sys/class/net/ens1/speed: '100000'", "unknown_why": None,
             "pci_path": None}]
    gpus = [{"index": i, "nvlink_gen": 3, "nvlink_links": 12, "nvlink_why": None, "pci_bus_id": "x",
             "near_nics": None} for i in range(8)]
    return {"nics": nics, "default_route_nic": "ens1", "socket_ifname": None, "gpus": gpus, "gpu_source": "nvml",
            "lab": None}


def test_ib_node_inside_one_node_is_nvlink():
    e = ex.expected_busbw(_ib_node(), "all_reduce", nodes=1, ranks_per_node=8, device="cuda")
    assert e["gbps"] == pytest.approx(18 * 25 * 0.80)  # 360 GB/s
    assert e["limit"] == "nvlink" and e["inputs"]["nvlink_links"] == 18


def test_ib_node_across_nodes_sums_the_nics_and_nvlink_limits():
    e = ex.expected_busbw(_ib_node(), "reduce_scatter", nodes=2, ranks_per_node=8, device="cuda")
    # 8 NICs x 400 Gbit/s / 8 x 0.96 = 384 GB/s through the NICs, above NVLink's 360.
    assert e["also"]["gbps"] == pytest.approx(8 * 400 / 8 * 0.96)
    assert e["also"]["inputs"]["nics"] == [f"ib{i}" for i in range(8)]
    assert e["gbps"] == pytest.approx(360.0) and e["limit"] == "nvlink"


def test_one_gpu_per_node_uses_its_near_nic_only():
    e = ex.expected_busbw(_ib_node(), "all_gather", nodes=4, ranks_per_node=1, device="cuda")
    assert e["gbps"] == pytest.approx(48.0)  # 400 Gbit/s / 8 x 0.96
    assert e["inputs"]["nics"] == ["ib0"]


def test_all_to_all_across_nodes_shares_the_nics():
    e = ex.expected_busbw(_ib_node(), "all_to_all", nodes=2, ranks_per_node=8, device="cuda")
    # 384 x (n-1) / (g (n-g)) = 384 x 15 / 64 = 90 GB/s, below NVLink.
    assert e["gbps"] == pytest.approx(384 * 15 / 64)


def test_rule_of_thumb_per_200g_nic():
    facts = _ib_node()
    for nic in facts["nics"]:
        nic["rate_gbit"] = 200.0 if nic["rdma"] else nic["rate_gbit"]
    e = ex.expected_busbw(facts, "all_reduce", nodes=2, ranks_per_node=1, device="cuda")
    assert e["gbps"] == pytest.approx(24.0)


def test_single_100g_ethernet_node():
    e = ex.expected_busbw(_eth_node(), "all_reduce", nodes=2, ranks_per_node=8, device="cuda")
    assert e["gbps"] == pytest.approx(12.0) and e["limit"] == "nics"   # 100 / 8 x 0.96
    assert e["also"]["gbps"] == pytest.approx(12 * 25 * 0.80)           # NVLink 240 is not the limit
    cpu = ex.expected_busbw(_eth_node(), "all_gather", nodes=2, ranks_per_node=1, device="cpu")
    assert cpu["gbps"] == pytest.approx(12.0) and cpu["inputs"]["nics"] == ["ens1"]
    link = ex.expected_link(_eth_node(), same_host=False)
    assert link["gbps"] == pytest.approx(12.0)


def test_vm_nic_without_speed_is_unknown_with_why():
    facts = {"nics": [{"name": "eth0", "link": "ethernet", "rdma": False, "rdma_device": None, "state": "up",
                       "rate_gbit": None, "rate_source": "/sys/class/net/eth0/speed: '-1'",
                       "unknown_why": "/sys/class/net/eth0/speed reads '-1'", "pci_path": None}],
             "default_route_nic": "eth0", "socket_ifname": None, "gpus": [], "gpu_source": "not asked", "lab": None}
    e = ex.expected_busbw(facts, "all_reduce", nodes=2, ranks_per_node=1, device="cpu")
    assert e["gbps"] is None and "eth0 reports no speed" in e["unknown_why"] and "'-1'" in e["unknown_why"]
    one = ex.expected_busbw(facts, "all_reduce", nodes=1, ranks_per_node=2, device="cpu")
    assert one["gbps"] is None and "loopback" in one["unknown_why"]
    assert ex.describe(one).startswith("(expected: unknown, ")


def test_gpu_without_nvlink_is_unknown():
    facts = _eth_node()
    facts["gpus"][3].update(nvlink_links=0, nvlink_gen=None, nvlink_why="no NVLink link is enabled")
    e = ex.expected_busbw(facts, "all_reduce", nodes=1, ranks_per_node=8, device="cuda")
    assert e["gbps"] is None and "GPU 3" in e["unknown_why"]


def test_lab_rate_is_the_expectation():
    facts = {"nics": [], "lab": {"name": "x", "rate_bps": 10**9}}
    e = ex.expected_busbw(facts, "reduce_scatter", nodes=2, ranks_per_node=1, device="cpu")
    assert e["gbps"] == pytest.approx(0.125) and e["inputs"]["lab_rate_bps"] == 10**9
    assert ex.percent(0.1, e) == pytest.approx(80.0)
    assert ex.expected_link({"lab": {"name": "x", "rate_bps": None}}, same_host=True)["gbps"] is None


def test_sysfs_reader_on_a_recorded_tree(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "infiniband"
    for name, speed, kind in (("eth0", "-1", "1"), ("ens1", "100000", "1"), ("ib0", "", "32")):
        (net / name).mkdir(parents=True)
        (net / name / "speed").write_text(speed + "\n")
        (net / name / "type").write_text(kind + "\n")
        (net / name / "operstate").write_text("up\n")
    port = ib / "mlx5_0" / "ports" / "1"
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs" / "0").write_text("ib0\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "state").write_text("4: ACTIVE\n")
    found = {n["name"]: n for n in hwfacts.nics(str(net), str(ib))}
    assert found["eth0"]["rate_gbit"] is None and "'-1'" in found["eth0"]["unknown_why"]
    assert found["ens1"]["rate_gbit"] == 100.0 and not found["ens1"]["rdma"]
    assert found["ib0"]["rate_gbit"] == 400.0 and found["ib0"]["rdma"] and found["ib0"]["link"] == "infiniband"


def test_pcie_nearness():
    gpu = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"
    nic = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0"
    other = "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0"
    assert hwfacts.near(gpu, nic) and not hwfacts.near(gpu, other) and not hwfacts.near(None, nic)


def test_storage_expectations():
    eth = _eth_node()
    nfs = ex.expected_storage(eth, filesystem="nfs4", device="filer:/vol")
    assert nfs["gbps"] == pytest.approx(12.0) and nfs["inputs"]["nic"] == "ens1"
    disk = ex.expected_storage(eth, filesystem="ext4", device="/dev/nvme0n1")
    assert disk["gbps"] is None and "block device" in disk["unknown_why"]
    assert "memcpy" in ex.expected_storage(eth, filesystem="tmpfs", device="tmpfs")["unknown_why"]
    # A FUSE mount (rclone's) is not a local block device, whatever disk its cache is on.
    fuse = ex.expected_storage(eth, filesystem="fuse.rclone", device="microbench-m:microbench")["unknown_why"]
    assert "is a FUSE mount: rclone decides where its bytes go" in fuse and "block device" not in fuse
    other = ex.expected_storage(eth, filesystem="overlay", device="overlay")["unknown_why"]
    assert other.startswith("overlay (overlay) is not a block device")
    assert ex.expected_s3(eth, endpoint_host="10.0.0.5", embedded=False)["gbps"] == pytest.approx(12.0)
    assert "loopback" in ex.expected_s3(eth, endpoint_host="127.0.0.1", embedded=False)["unknown_why"]



def test_lab_placement_hands_the_slowest_chosen_hosts_rate():
    from microbench.lab import namespaces as labmod
    from microbench.lab.placement import lab_ranks

    hosts = [labmod.LabHost(i, f"mb-x-h{i}", f"10.213.0.{i + 1}", rate_bps=rate)
             for i, rate in enumerate((10**9, 10**8, 10**9))]
    lab = labmod.Lab("x", hosts=hosts, rate_bps=10**9)
    rate = {tuple(pair): lab_ranks(lab, pair)[2](0).env["MICROBENCH_LAB_RATE_BPS"]
            for pair in ([0, 2], [0, 1])}
    assert rate == {(0, 2): str(10**9), (0, 1): str(10**8)}
