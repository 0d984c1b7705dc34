"""Speed and memory of registered mechanisms against softmax, checked before they are timed.

For every length, every mechanism is built, its output (and, when the backward pass is timed,
its input gradients) is checked against its own dense reference (``Attention.reference``, in
float64) and only then timed: interleaved rounds over all mechanisms of that length, each
round warmed up, the reported time the median of the round medians (CUDA events on GPU).
Peak memory is the CUDA allocator's peak on GPU and the peak of tracked tensor allocations on
CPU, inputs excluded. Ratios are to softmax measured in the same rounds. Modules are in eval
mode: no dropout, no feature redraws.

Measurements that would not fit are skipped, not attempted. The time of a call at the next
length is predicted from the fastest round at the previous one (noise on a shared machine only
ever adds time) scaled by the growth in L of the mechanism's registered complexity
(:mod:`kattn.bench.growth`), so a noisy measurement cannot make a linear mechanism look
quadratic; peak memory, which is not noisy, is extrapolated from the last two measured lengths
(power law, exponent clamped to [1, 2.5]). A mechanism is skipped at a length where either
prediction passes ``max_call_seconds`` or ``memory_limit_bytes``; its row says why
(``skipped``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..registry import available, build, spec
from .growth import Growth, time_growth
from .timing import Rounds, interleaved_rounds, peak_memory_bytes

PASSES = ("forward", "backward", "both")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}  # fmt: skip
#: largest relative error of output and gradients against the float64 reference, per dtype
#: (signed feature maps such as trf lose about 3e-3 to rounding in float32; bugs give > 0.1)
CHECK_TOLERANCE = {"float64": 1e-6, "float32": 1e-2, "float16": 5e-2, "bfloat16": 1e-1}
BASELINE = "softmax"


@dataclass(frozen=True)
class SpeedConfig:
    """What is measured: shapes, dtype, device, pass, and the limits that skip a row."""

    mechanisms: tuple[str, ...] = ()  # empty: every registered mechanism
    lengths: tuple[int, ...] = (256, 1024, 4096)
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    features: int | None = None  # M for every mechanism with a size option; None: defaults
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"  # forward | backward | both
    causal: bool = False
    rounds: int = 5
    seconds: float = 0.3  # time per round and candidate
    check_max_length: int = 2048  # checks at longer lengths reuse the longest checked one
    max_call_seconds: float = 2.0
    memory_limit_bytes: int = 8 << 30
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not self.lengths or min(self.lengths) < 2:
            raise ValueError(f"lengths must be >= 2, got {self.lengths}")
        for key in ("batch", "heads", "head_dim", "rounds"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.features is not None and self.features < 1:
            raise ValueError(f"features must be >= 1, got {self.features}")
        unknown = [n for n in self.mechanisms if n not in available()]
        if unknown:
            raise ValueError(f"unknown mechanism(s) {unknown}; choose from {available()}")

    def names(self) -> list[str]:
        """The mechanisms measured, softmax (the baseline) first."""
        names = list(dict.fromkeys(self.mechanisms or available()))
        return [BASELINE] + [n for n in names if n != BASELINE]


@dataclass
class SpeedRow:
    """One mechanism at one length. ``speedup`` is softmax time / this time, ``memory_ratio``
    this peak / softmax's; ``check_error`` the largest relative error against the reference."""

    mechanism: str
    length: int
    status: str = "ok"  # ok | unsupported: ... | skipped: ... | check failed: ... | error: ...
    time_ms: float | None = None
    peak_memory_mib: float | None = None
    speedup: float | None = None
    memory_ratio: float | None = None
    check_error: float | None = None
    checked_at: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # why the length was not measured (status "skipped: <why>")


def size_options(name: str, features: int | None) -> dict[str, Any]:
    """``{option: features}`` for the size option mechanism ``name`` registered (none: {})."""
    option = spec(name).size_option
    return {} if features is None or option is None else {option: features}


def unsupported(name: str, config: SpeedConfig) -> str | None:
    """Why ``name`` cannot run ``config`` (None: it can)."""
    if config.causal and not spec(name).supports_causal:
        return "unsupported: no causal form"
    return None


class _Case:
    """A built mechanism with its inputs and the callable that is timed."""

    def __init__(self, name: str, length: int, config: SpeedConfig) -> None:
        self.name, self.config = name, config
        self.device, self.dtype = torch.device(config.device), DTYPES[config.dtype]
        self.options = size_options(name, config.features)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            attn = build(name, head_dim=config.head_dim, num_heads=config.heads,
                         max_len=length, **self.options)  # fmt: skip
        self.attn = attn.eval().to(device=self.device, dtype=self.dtype)
        g = torch.Generator().manual_seed(config.seed + length)
        shape = (config.batch, config.heads, length, config.head_dim)
        q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
        self.inputs = [x.to(self.device, self.dtype) for x in (q, k, v)]
        grad_out = torch.randn(shape, generator=g).to(self.device, self.dtype)
        self.grad_out = grad_out
        self.fn = self._timed()

    def _forward(self, *inputs: Tensor) -> Tensor:
        q, k, v = inputs
        return self.attn(q, k, v, causal=self.config.causal)

    def _timed(self) -> Callable[[], Any]:
        mode = self.config.mode
        if mode == "forward":

            def forward() -> Tensor:
                with torch.no_grad():
                    return self._forward(*self.inputs)

            return forward
        leaves = [x.requires_grad_() for x in self.inputs]
        leaves += [p for p in self.attn.parameters() if p.requires_grad]
        if mode == "both":
            return lambda: torch.autograd.grad(
                self._forward(*self.inputs), leaves, self.grad_out, allow_unused=True
            )
        out = self._forward(*self.inputs)  # the graph whose backward pass alone is timed
        return lambda: torch.autograd.grad(
            out, leaves, self.grad_out, retain_graph=True, allow_unused=True
        )

    def check(self) -> float:
        """Largest relative error of the output (and of the input gradients when a backward
        pass is timed) against the module's float64 dense reference on the same inputs."""
        reference = copy.deepcopy(self.attn).double()
        backward = self.config.mode != "forward"
        ours = [x.detach().clone().requires_grad_(backward) for x in self.inputs]
        exact = [x.detach().double().requires_grad_(backward) for x in self.inputs]
        with torch.set_grad_enabled(backward):
            out = self._forward(*ours)
            ref = reference.reference(*exact, causal=self.config.causal)
        errors = [_relative_error(out, ref)]
        if backward:
            got = torch.autograd.grad(out, ours, self.grad_out)
            want = torch.autograd.grad(ref, exact, self.grad_out.double())
            errors += [_relative_error(a, b) for a, b in zip(got, want, strict=True)]
        return max(errors)


def _relative_error(out: Tensor, ref: Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def _predict(history: list[tuple[int, float]], length: int, *, top: float = 2.5) -> float:
    """Extrapolate a measured quantity to ``length`` from its last two points (0: unknown)."""
    if not history:
        return 0.0
    (l0, y0), (l1, y1) = history[-2:] if len(history) > 1 else (history[-1], history[-1])
    if l1 == l0 or y0 <= 0 or y1 <= 0:
        exponent = 1.0
    else:
        exponent = min(max(math.log(y1 / y0) / math.log(l1 / l0), 1.0), top)
    return y1 * (length / l1) ** exponent


def measure_speed(
    config: SpeedConfig, *, progress: Callable[[str], None] | None = None
) -> list[SpeedRow]:
    """Every mechanism of ``config`` at every length: check, then time and peak memory."""
    names = config.names()
    rows: list[SpeedRow] = []
    fastest: dict[str, tuple[int, float]] = {}  # (length, fastest round) of the last measured
    memory: dict[str, list[tuple[int, float]]] = {n: [] for n in names}
    checked: dict[str, tuple[int, float]] = {}
    tolerance = CHECK_TOLERANCE[config.dtype]
    say = progress or (lambda text: None)
    for length in sorted(set(config.lengths)):
        cases: dict[str, _Case] = {}
        by_name = {n: SpeedRow(n, length, options=size_options(n, config.features)) for n in names}
        for name in names:
            row = by_name[name]
            if why := unsupported(name, config):
                row.status = why
                continue
            if why := _too_big(name, length, fastest, memory, config):
                row.status, row.skipped = f"skipped: {why}", why
                continue
            try:
                case = _Case(name, length, config)
                if length <= config.check_max_length or name not in checked:
                    say(f"L={length}: checking {name}")
                    checked[name] = (length, case.check())
                row.checked_at, row.check_error = checked[name]
            except NotImplementedError:
                row.status = "ok (no reference to check)"
            except (RuntimeError, ValueError) as err:
                row.status = f"error: {_first_line(err)}"
                continue
            if row.check_error is not None and row.check_error > tolerance:
                row.status = f"check failed: relative error {row.check_error:.2g} > {tolerance:g}"
                continue
            cases[name] = case
        if cases:
            say(f"L={length}: timing {', '.join(cases)}")
            try:
                timed = interleaved_rounds(
                    {n: c.fn for n, c in cases.items()},
                    rounds=config.rounds,
                    seconds=config.seconds,
                    log=None,
                    device=config.device,
                )
            except RuntimeError as err:  # out of memory mid-round: measure one by one
                say(f"L={length}: {_first_line(err)}; timing one at a time")
                timed = _one_by_one(cases, config, by_name)
            for name, case in cases.items():
                if name not in timed.seconds:
                    continue
                row = by_name[name]
                row.time_ms = timed.seconds[name] * 1e3
                fastest[name] = (length, min(timed.round_seconds[name]))
                peak = peak_memory_bytes(case.fn, device=config.device)
                row.peak_memory_mib = peak / 2**20
                memory[name].append((length, float(peak)))
        del cases
        _ratios(by_name)
        rows += [by_name[n] for n in names]
    return rows


def _one_by_one(cases: dict[str, _Case], config: SpeedConfig, rows: dict[str, SpeedRow]) -> Rounds:
    timed = Rounds({}, {}, {})
    for name, case in cases.items():
        try:
            alone = interleaved_rounds(
                {name: case.fn},
                rounds=config.rounds,
                seconds=config.seconds,
                log=None,
                device=config.device,
            )
        except RuntimeError as err:
            rows[name].status = f"error: {_first_line(err)}"
            continue
        timed.seconds.update(alone.seconds)
        timed.round_seconds.update(alone.round_seconds)
        timed.repeats.update(alone.repeats)
    return timed


def _too_big(
    name: str,
    length: int,
    fastest: dict[str, tuple[int, float]],
    memory: dict[str, list[tuple[int, float]]],
    config: SpeedConfig,
) -> str | None:
    """Why ``name`` is not measured at ``length`` (None: it is)."""
    if name in fastest:
        measured, seconds = fastest[name]
        growth = time_growth(spec(name).complexity)
        assumed = "" if growth else ", assumed: no term in L in its complexity"
        growth = growth or Growth(2)
        predicted = seconds * growth.scale(measured, length)
        if predicted > config.max_call_seconds:
            return (
                f"predicted {predicted:.3g} s per call > {config.max_call_seconds:g} s "
                f"({growth.describe()} from {seconds * 1e3:.3g} ms at L={measured:,}{assumed})"
            )
    peak = _predict(memory[name], length)
    if peak > config.memory_limit_bytes:
        return (
            f"predicted {peak / 2**30:.3g} GiB > {config.memory_limit_bytes / 2**30:g} GiB "
            "memory limit"
        )
    return None


def _ratios(rows: dict[str, SpeedRow]) -> None:
    base = rows[BASELINE]
    for row in rows.values():
        if row.time_ms is not None and base.time_ms is not None:
            row.speedup = base.time_ms / row.time_ms
        if row.peak_memory_mib and base.peak_memory_mib:
            row.memory_ratio = row.peak_memory_mib / base.peak_memory_mib


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


@dataclass(frozen=True)
class Crossover:
    """Where a mechanism becomes faster than softmax: ``length`` (interpolated in log-log
    between the two measured lengths around it) or ``below`` / ``above`` the measured range
    (``never``: not faster at any measured length; ``none``: too few measurements)."""

    mechanism: str
    kind: str  # at | below | above | none
    length: float | None

    def describe(self) -> str:
        if self.kind == "at" and self.length is not None:
            return f"≈ {self.length:,.0f}"
        if self.kind == "below" and self.length is not None:
            return f"< {self.length:,.0f} (faster at every length)"
        if self.kind == "above" and self.length is not None:
            return f"> {self.length:,.0f} (slower at every length)"
        return "n/a"


def crossovers(rows: Sequence[SpeedRow]) -> list[Crossover]:
    """The crossover length against softmax of every mechanism but softmax: the length from
    which on the mechanism stays faster."""
    names = list(dict.fromkeys(r.mechanism for r in rows if r.mechanism != BASELINE))
    result = []
    for name in names:
        points = [(r.length, r.speedup) for r in rows if r.mechanism == name and r.speedup]
        points.sort()
        if not points:
            result.append(Crossover(name, "none", None))
            continue
        slower = [i for i, (_, s) in enumerate(points) if s < 1.0]
        if not slower:
            result.append(Crossover(name, "below", float(points[0][0])))
        elif slower[-1] == len(points) - 1:
            result.append(Crossover(name, "above", float(points[-1][0])))
        else:
            (l0, s0), (l1, s1) = points[slower[-1]], points[slower[-1] + 1]
            t = math.log(s0) / (math.log(s0) - math.log(s1))  # where log speed-up crosses 0
            result.append(Crossover(name, "at", math.exp(math.log(l0) + t * math.log(l1 / l0))))
    return result
