"""benchmarks/soak.py's RSS growth: a subserver killed during the run is measured over its
last process's life, after that process's own warm-up, not against the process it replaced."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def _soak():
    sys.path.insert(0, str(SOAK.parent))  # its helper `_serve.py` sits beside it
    spec = importlib.util.spec_from_file_location("soak_script", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _series(rss_of_t) -> list[dict]:
    return [{"t": float(t), "rss_mb": rss_of_t(t)} for t in range(0, 1810, 10)]


def test_a_restarted_subserver_is_measured_from_its_own_warm_up():
    soak = _soak()

    def rss(t):  # `large` warms to 3,700 MB, is killed at 600 s, its new process warms again to 3,700
        life = t if t < 600 else t - 600
        large = None if t == 600 else 3400 + min(300, life)
        return {"serve": 340 + t / 1800, "large": large}

    g = soak._growth(_series(rss), 600.0, [{"writer": "large", "t": 600.0}])
    assert g["large"]["growth_after_warmup_pct"] == 0.0
    assert g["large"]["process_started_s"] == 600.0 and g["large"]["after_warmup_t"] == 1200.0
    assert g["large"]["start_mb"] == 3400  # the run's first process
    assert g["serve"]["growth_after_warmup_pct"] == round(100 * (1200 / 1800) / (340 + 600 / 1800), 2)
    assert "process_started_s" not in g["serve"]
    # without the kill the new process's smaller RSS after 600 s reads as a fall, then a rise
    g = soak._growth(_series(rss), 600.0)
    assert g["large"]["after_warmup_mb"] == 3410 and g["large"]["growth_after_warmup_pct"] > 8


def test_a_process_killed_late_warms_up_over_half_of_what_it_lived():
    soak = _soak()
    g = soak._growth(_series(lambda t: {"small": 1700 + min(100, t if t < 1200 else t - 1200)}), 600.0,
                     [{"writer": "small", "t": 1200.0}])
    assert g["small"]["after_warmup_t"] == 1500.0 and g["small"]["growth_after_warmup_pct"] == 0.0
