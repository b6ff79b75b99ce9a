"""The profile: measured step latencies per model, and the latency curves fitted from them.

A profile is the only thing the Markov chain, the simulator and the runtime's `auto`
batching share. It is a versioned JSON document (described in docs/tuner.md); this
module reads, validates and writes it, and turns its points into `L_i(b)`: step time in
ms of a decode step with `b` requests, alone or co-located (while another model steps
on the same cores). Between measured batch sizes we interpolate linearly; beyond the
largest we extend the affine least-squares line through the points, and refuse batch
sizes far beyond what was measured rather than extrapolate wildly.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenrouter import engines
from tokenrouter.tuner.errors import TuneError

PROFILE_FORMAT = "tokenrouter-profile"
PROFILE_VERSION = 1

#: How far past the largest measured batch size a curve may be extended (a ratio).
MAX_EXTRAPOLATION = 4.0


class ProfileError(TuneError):
    """A profile file that is missing, malformed or does not cover what is asked."""


@dataclass(frozen=True)
class Curve:
    """Step latency (ms) against batch size, from measured points."""

    batch_sizes: tuple[int, ...]
    ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.batch_sizes) == 0 or len(self.batch_sizes) != len(self.ms):
            raise ProfileError("a latency curve needs as many latencies as batch sizes (at least one)")
        if any(b < 1 for b in self.batch_sizes) or list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ProfileError(f"batch sizes must be distinct, increasing and >= 1, got {list(self.batch_sizes)}")
        if any(not np.isfinite(v) or v <= 0 for v in self.ms):
            raise ProfileError(f"latencies must be positive numbers of ms, got {list(self.ms)}")

    def affine(self) -> tuple[float, float]:
        """Least-squares (intercept, slope) with slope >= 0: L(b) ~ a + s b."""
        b = np.asarray(self.batch_sizes, float)
        y = np.asarray(self.ms, float)
        if len(b) == 1:
            return float(y[0]), 0.0
        slope, intercept = np.polyfit(b, y, 1)
        if slope < 0:
            return float(y.mean()), 0.0
        return float(intercept), float(slope)

    def __call__(self, b: float) -> float:
        bs = np.asarray(self.batch_sizes, float)
        y = np.maximum.accumulate(np.asarray(self.ms, float))  # a bigger batch is never faster
        if b <= bs[-1]:
            return float(np.interp(b, bs, y))
        if b > MAX_EXTRAPOLATION * bs[-1]:
            raise ProfileError(
                f"batch size {b:g} is more than {MAX_EXTRAPOLATION:g}x the largest profiled batch "
                f"({int(bs[-1])}); profile larger batches (--batch-sizes)")
        _, slope = self.affine()
        return float(y[-1] + slope * (b - bs[-1]))


@dataclass(frozen=True)
class ModelProfile:
    """One model's measurements: decode alone, decode co-located, optional extends."""

    name: str
    alone: Curve
    co_located: Curve | None = None
    extend: dict[int, Curve] = field(default_factory=dict)  # tokens per request -> curve
    path: str = ""
    threads: int = 0
    engine: str = engines.DEFAULT  # the engine that stepped it (`tokenrouter/engines.py`)

    def step_ms(self, batch: int, co_located: bool = False, tokens: float = 1.0) -> float:
        """L_i(b): one step of `batch` requests feeding `tokens` tokens each on average
        (1 = a decode), alone or while another model steps. Above one token the time comes
        from the extend curves, interpolated linearly in tokens between the decode curve
        (1 token) and the measured extends, extended linearly from the last two beyond the
        largest (up to MAX_EXTRAPOLATION times it); without extend curves every step is
        timed as a decode. Co-location scales it by the decode's measured slowdown."""
        decode = self.alone(batch)
        ms = self._extend_ms(batch, tokens, decode) if tokens > 1 and self.extend else decode
        if co_located and self.co_located is not None:
            ms *= max(self.co_located(batch), decode) / decode
        return ms

    def _extend_ms(self, batch: int, tokens: float, decode: float) -> float:
        ks = [1] + sorted(self.extend)
        ms = np.maximum.accumulate([decode] + [self.extend[k](batch) for k in ks[1:]])
        if tokens <= ks[-1]:
            return float(np.interp(tokens, ks, ms))
        if tokens > MAX_EXTRAPOLATION * ks[-1]:
            raise ProfileError(f"steps of {tokens:g} tokens per request are more than {MAX_EXTRAPOLATION:g}x "
                               f"the longest profiled extend ({ks[-1]}); profile longer extends (--extend)")
        slope = (ms[-1] - ms[-2]) / (ks[-1] - ks[-2])
        return float(ms[-1] + slope * (tokens - ks[-1]))

    def slowdown(self, batch: int) -> float:
        """1 + c: how much slower a step is while another model steps on the same cores."""
        return self.step_ms(batch, True) / self.step_ms(batch, False)


@dataclass(frozen=True)
class Profile:
    models: dict[str, ModelProfile]
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    source: str = ""

    def __getitem__(self, name: str) -> ModelProfile:
        try:
            return self.models[name]
        except KeyError:
            raise ProfileError(f"the profile has no model {name!r} (it has {sorted(self.models)})") from None

    def step_ms(self, model: str, batch: int, co_located: bool = False, tokens: float = 1.0) -> float:
        return self[model].step_ms(batch, co_located, tokens)

    # ------------------------------------------------------------- building
    @staticmethod
    def affine(models: dict[str, tuple[float, float]], *, colocation: dict[str, float] | float = 0.0,
               batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> "Profile":
        """A synthetic profile: L_i(b) = a_i + s_i (b - 1) ms, co-located (1 + c_i) times
        slower. For studies and tests; real profiles come from `tokenrouter profile`."""
        out = {}
        for name, (a, s) in models.items():
            c = colocation[name] if isinstance(colocation, dict) else colocation
            alone = Curve(tuple(batch_sizes), tuple(a + s * (b - 1) for b in batch_sizes))
            co = Curve(alone.batch_sizes, tuple(v * (1 + c) for v in alone.ms))
            out[name] = ModelProfile(name, alone, co)
        return Profile(out, machine={"synthetic": True}, created=timestamp())

    # --------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        models = {}
        for name, m in self.models.items():
            decode: dict[str, Any] = {"batch_sizes": list(m.alone.batch_sizes), "alone_ms": list(m.alone.ms)}
            if m.co_located is not None:
                if m.co_located.batch_sizes != m.alone.batch_sizes:
                    decode["co_located_batch_sizes"] = list(m.co_located.batch_sizes)
                decode["co_located_ms"] = list(m.co_located.ms)
            entry: dict[str, Any] = {"path": m.path, "engine": m.engine, "threads": m.threads, "decode": decode}
            if m.extend:
                entry["extend"] = [{"tokens": k, "batch_sizes": list(c.batch_sizes), "alone_ms": list(c.ms)}
                                   for k, c in sorted(m.extend.items())]
            models[name] = entry
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "created": self.created,
                "source": self.source, "machine": self.machine, "models": models}

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @staticmethod
    def from_dict(data: Any, where: str = "profile") -> "Profile":
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise ProfileError(f"{where}: not a tokenrouter profile (expected \"format\": \"{PROFILE_FORMAT}\")")
        if data.get("version") != PROFILE_VERSION:
            raise ProfileError(f"{where}: profile version {data.get('version')!r} is not {PROFILE_VERSION}; "
                               "re-run `tokenrouter profile`")
        raw = data.get("models")
        if not isinstance(raw, dict) or not raw:
            raise ProfileError(f"{where}: \"models\" must be a non-empty object")
        models = {}
        for name, entry in raw.items():
            try:
                dec = entry["decode"]
                alone = Curve(tuple(int(b) for b in dec["batch_sizes"]), tuple(float(v) for v in dec["alone_ms"]))
                co = None
                if dec.get("co_located_ms") is not None:
                    cbs = dec.get("co_located_batch_sizes", dec["batch_sizes"])
                    co = Curve(tuple(int(b) for b in cbs), tuple(float(v) for v in dec["co_located_ms"]))
                ext = {int(e["tokens"]): Curve(tuple(int(b) for b in e["batch_sizes"]),
                                               tuple(float(v) for v in e["alone_ms"]))
                       for e in entry.get("extend", [])}
            except ProfileError as exc:
                raise ProfileError(f"{where}: model {name!r}: {exc}") from None
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(f"{where}: model {name!r}: malformed decode entry ({exc})") from None
            models[name] = ModelProfile(name, alone, co, ext, str(entry.get("path", "")), int(entry.get("threads", 0)),
                                        str(entry.get("engine", engines.DEFAULT)))
        return Profile(models, dict(data.get("machine", {})), str(data.get("created", "")), str(data.get("source", "")))

    @staticmethod
    def load(path: str | os.PathLike) -> "Profile":
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON ({exc})") from None
        return Profile.from_dict(data, str(path))


def timestamp() -> str:
    """Now, in UTC, to the second: when a profile was made."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge whether a profile applies to their machine."""
    info: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                            "processor": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    return info
