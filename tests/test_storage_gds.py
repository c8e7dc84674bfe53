"""storage gds: the skip path here and the pure logic that reports which I/O path served."""

from __future__ import annotations

import sys
import types

import pytest

from microbench.probes.storage import gds

from conftest import last_line


def _missing() -> None:
    raise ImportError("No module named 'kvikio'")


def test_unavailable_reasons_in_order():
    assert "kvikio is not installed" in gds.unavailable_reason(_missing, lambda: True, lambda: 1)
    assert "no CUDA driver" in gds.unavailable_reason(lambda: None, lambda: False, lambda: 1)
    assert "no CUDA device" in gds.unavailable_reason(lambda: None, lambda: True, lambda: 0)
    assert gds.unavailable_reason(lambda: None, lambda: True, lambda: 1) is None


def _fake_kvikio(monkeypatch, *, api: int, compat, gds_available=None, driver_error=None):
    kv = types.ModuleType("kvikio")
    defaults = types.ModuleType("kvikio.defaults")
    driver = types.ModuleType("kvikio.cufile_driver")

    class Props:
        @property
        def is_gds_available(self):
            if driver_error:
                raise driver_error
            return gds_available

    if api == 26:
        defaults.get = lambda name: {"compat_mode": compat}[name]
        driver.properties = Props()
    else:
        defaults.compat_mode = lambda: compat
        driver.DriverProperties = Props
    kv.defaults, kv.cufile_driver = defaults, driver
    monkeypatch.setitem(sys.modules, "kvikio", kv)
    monkeypatch.setitem(sys.modules, "kvikio.defaults", defaults)
    monkeypatch.setitem(sys.modules, "kvikio.cufile_driver", driver)
    return kv


class _Mode:  # stands in for kvikio.CompatMode members
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("api, compat, available, real, served", [
    (26, _Mode("OFF"), True, True, "GPUDirect Storage"),
    (26, _Mode("OFF"), False, False, "cuFile compatibility mode"),
    (26, _Mode("ON"), True, False, "kvikio compat mode"),
    (25, False, True, True, "GPUDirect Storage"),
    (25, True, None, False, "kvikio compat mode"),
])
def test_io_path_says_what_served_the_bytes(monkeypatch, api, compat, available, real, served):
    kv = _fake_kvikio(monkeypatch, api=api, compat=compat, gds_available=available)
    info = gds.io_path(kv)
    assert info["real_gds"] is real and info["served_by"].startswith(served)


def test_io_path_driver_failure_means_cufile_compat(monkeypatch):
    kv = _fake_kvikio(monkeypatch, api=26, compat=_Mode("OFF"), driver_error=RuntimeError("cuFileDriverOpen failed"))
    info = gds.io_path(kv)
    assert info["real_gds"] is False and "cuFileDriverOpen failed" in info["gds_driver_note"]


@pytest.mark.slow
def test_cli_skips_with_one_line_reason(run_cli, tmp_path):
    if gds.unavailable_reason() is None:
        pytest.skip("GDS can run here; the skip path is not reachable")
    proc = run_cli("storage", "gds", "--path", str(tmp_path / "g"), "--size", "64M", timeout=120)
    assert proc.returncode == 0
    assert last_line(proc.stderr).startswith("microbench: skipped: storage gds: ")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "g").exists()


def test_cli_bad_size_is_usage_error(cli, tmp_path):
    proc = cli("storage", "gds", "--path", str(tmp_path), "--size", "0", timeout=120)
    assert proc.returncode == 2 and "invalid --size '0'" in last_line(proc.stderr)
