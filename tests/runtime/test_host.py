"""The host description every figure carries."""

import time

from tokenrouter.runtime.host import host_info


def test_host_info_names_the_cpu_and_measures_read_bandwidth():
    info = host_info()
    assert info["cpu"] and info["cores"] >= 1
    assert len(info["load_average"]) == 3
    assert time.strptime(info["date"], "%Y-%m-%dT%H:%M:%SZ").tm_year >= 2026
    assert info["read_gb_per_s"] > 0.1  # a sum over 256 MB: any machine reads faster than this
    assert "read_gb_per_s" not in host_info(bandwidth=False)
