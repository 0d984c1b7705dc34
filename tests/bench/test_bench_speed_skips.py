"""``kattn bench speed`` skips a length only where the mechanism's complexity, applied to its
fastest measured round at the previous length, passes the time budget; the table says which
cells were skipped and why."""

from __future__ import annotations

import csv
import json

import pytest

import kattn
import kattn.bench.speed as speed
from kattn.bench.growth import Growth, time_growth
from kattn.bench.speed import SpeedConfig, measure_speed
from kattn.bench.speed_report import speed_markdown, write_speed
from kattn.bench.timing import Rounds
from kattn.cli import main

from ..markdown_tables import check_tables

INFO = {"processor": "test CPU", "torch_threads": 2, "kattn": "0.0", "torch": "2.0"}
#: seconds per call at L=32; softmax grows like L², performer like L
AT_32 = {"softmax": 1e-3, "performer": 1e-3}


def fake_rounds(noisy: dict[tuple[str, int], list[float]]):
    """An ``interleaved_rounds`` that times nothing: each candidate's three round medians are
    its cost at the length the callable carries, or ``noisy[name, length]``."""

    def rounds(fns, *, rounds, seconds, log, device):
        per_round = {}
        for name, fn in fns.items():
            power = 2 if name == "softmax" else 1
            cost = AT_32[name] * (fn.length / 32) ** power
            per_round[name] = noisy.get((name, fn.length), [cost] * 3)
        medians = {name: sorted(times)[1] for name, times in per_round.items()}
        return Rounds(medians, per_round, {name: 3 for name in fns})

    return rounds


@pytest.fixture
def timed(monkeypatch):
    """``measure_speed`` with the timer and the memory probe replaced; the timed callables
    carry their length."""
    built = speed._Case._timed

    def timed_fn(self):
        fn = built(self)

        def call():
            return fn()

        call.length = self.inputs[0].shape[2]
        return call

    monkeypatch.setattr(speed._Case, "_timed", timed_fn)
    monkeypatch.setattr(speed, "peak_memory_bytes", lambda fn, device: 1000 * fn.length)

    def run(noisy=None, **options):
        monkeypatch.setattr(speed, "interleaved_rounds", fake_rounds(noisy or {}))
        config = SpeedConfig(mechanisms=("performer",), lengths=(32, 64, 4096), heads=1,
                             head_dim=8, rounds=3, seconds=0.001, check_max_length=64,
                             max_call_seconds=1.0, **options)  # fmt: skip
        rows = measure_speed(config)
        return config, {(r.mechanism, r.length): r for r in rows}

    return run


def test_a_quadratic_mechanism_is_skipped_where_its_predicted_time_passes_the_budget(timed):
    config, rows = timed()
    softmax = rows["softmax", 4096]  # 4 ms at L=64, times (4096/64)² = 16.4 s > 1 s
    assert softmax.time_ms is None and softmax.status.startswith("skipped")
    assert softmax.skipped == "predicted 16.4 s per call > 1 s (O(L²) from 4 ms at L=64)"
    assert rows["performer", 4096].status == "ok"
    assert rows["performer", 4096].time_ms == pytest.approx(128.0)
    text = speed_markdown(config, list(rows.values()), INFO)
    assert check_tables(text) == 2
    assert "| softmax | 1 (1×) | 4 (1×) | skipped [1] | baseline |" in text
    assert "[1] softmax, L=4,096: predicted 16.4 s per call > 1 s (O(L²) from 4 ms" in text


def test_a_linear_mechanism_is_not_skipped_after_noisy_rounds(timed):
    # two of performer's three rounds at L=64 ran on a busy machine: 8 and 9 ms instead of 2
    _, rows = timed(noisy={("performer", 64): [8e-3, 2e-3, 9e-3]})
    assert rows["performer", 64].time_ms == pytest.approx(8.0)  # the median, as reported
    # predicted from the fastest round and O(L): 2 ms × 64 = 128 ms, well inside the budget
    assert rows["performer", 4096].status == "ok"


def test_the_skip_reason_is_a_field_of_the_json_and_csv(timed, tmp_path):
    config, rows = timed()
    paths = write_speed(tmp_path, config, list(rows.values()), INFO)
    report = json.loads(paths[1].read_text())
    found = {(r["mechanism"], r["length"]): r["skipped"] for r in report["rows"]}
    assert found["softmax", 4096].startswith("predicted 16.4 s per call")
    assert found["performer", 4096] is None
    table = list(csv.DictReader(paths[0].open()))
    assert [r["skipped"] for r in table if r["mechanism"] == "softmax"][-1].startswith(
        "predicted 16.4 s"
    )


def test_cli_marks_the_skipped_cells(tmp_path, capsys):
    # measured: softmax at L=16 times 256² passes 0.2 s; linear times 256 stays far below
    argv = ["bench", "speed", "--mechanisms", "linear", "--lengths", "16,4096", "--heads", "1",
            "--head-dim", "16", "--repeats", "1", "--seconds", "0.01",
            "--max-call-seconds", "0.2", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    (md,) = tmp_path.glob("*.md")
    text = md.read_text()
    assert "| softmax |" in text and "| skipped [1] | baseline |" in text
    assert "- [1] softmax, L=4,096: predicted" in text and "(O(L²) from" in text
    assert "| linear |" in text and "skipped [2]" not in text


@pytest.mark.parametrize(
    "complexity, growth",
    [
        ("O(L²·D) time; O(L) memory with fused kernels, O(L²) otherwise", Growth(2, False)),
        ("O(Lq·Lk·(D+Dv)) time, O(Lq·Lk) memory", Growth(2, False)),
        ("O(L·m·(D+Dv) + m³) time, O(L·m + m²) memory (m landmarks)", Growth(1, False)),
        ("O(L·M·(log D + Dv)); O(M·Dv) per recurrent step", Growth(1, False)),
        (
            "O(L log L·M·Dv) by FFT, or exact O(L²·(M+Dv)) in blocks of queries (O(L) memory "
            "per block row), whichever is faster; decoding O(t·(M+Dv))",
            Growth(1, True),
        ),
        ("O(M·Dv) per step", None),
    ],
)
def test_growth_is_read_from_the_complexity(complexity, growth):
    assert time_growth(complexity) == growth


def test_every_registered_mechanism_states_a_readable_growth():
    growth = {name: time_growth(kattn.spec(name).complexity) for name in kattn.available()}
    assert None not in growth.values(), [n for n, g in growth.items() if g is None]
    assert growth["softmax"] == growth["gaussian"] == Growth(2, False)
    assert growth["performer"] == growth["linear"] == growth["linformer"] == Growth(1, False)
    assert Growth(1, False).scale(1024, 4096) == 4.0
    assert Growth(2, False).describe() == "O(L²)" and Growth(1, True).describe() == "O(L log L)"


def test_out_of_memory_mid_round_times_one_mechanism_at_a_time(monkeypatch):
    timer = speed.interleaved_rounds

    def rounds(fns, **kwargs):
        if len(fns) > 1:
            raise RuntimeError("out of memory")
        return timer(fns, **kwargs)

    monkeypatch.setattr(speed, "interleaved_rounds", rounds)
    config = SpeedConfig(mechanisms=("linear",), lengths=(32, 64), heads=1, head_dim=8,
                         rounds=2, seconds=0.001)  # fmt: skip
    rows = measure_speed(config)
    assert all(r.status == "ok" and r.time_ms > 0 for r in rows)
