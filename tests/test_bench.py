import torch

from kattn.bench import compare_mechanisms, format_table, machine_info, measure_time
from kattn.bench.timing import peak_memory_bytes


def test_measure_time_reports_a_median():
    calls = []
    timing = measure_time(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and timing.repeats == 5
    assert 0 <= timing.min <= timing.median <= timing.max


def test_peak_memory_sees_live_allocations():
    def work():
        a = torch.ones(1_000_000)  # 4 MB
        b = torch.ones(2_000_000)  # 8 MB, alive together with a
        del a
        c = torch.ones(1_000_000)  # 4 MB after a is gone: the peak stays at 12 MB
        return b, c

    peak = peak_memory_bytes(work)
    assert 12e6 <= peak < 14e6


def test_machine_info_names_versions():
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["kattn"]


def test_comparison_rows():
    rows = compare_mechanisms(
        ["softmax", "performer", "linear"], heads=2, length=64, head_dim=16, repeats=1
    )
    by_name = {r.name: r for r in rows}
    assert by_name["softmax"].error < 1e-6 and by_name["softmax"].exact
    assert by_name["performer"].error > 0 and not by_name["performer"].exact
    table = format_table(rows)
    assert table.count("\n") == 4 and "| performer |" in table


def test_interleaved_rounds_time_every_candidate_in_every_round():
    from kattn.bench import interleaved_rounds

    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1

        return fn

    logged = []
    result = interleaved_rounds(
        {"a": make("a"), "b": make("b")}, rounds=3, seconds=0.0, log=logged.append
    )
    assert set(result.seconds) == {"a", "b"} and len(logged) == 3
    assert all(len(times) == 3 for times in result.round_seconds.values())
    assert result.repeats == {"a": 3, "b": 3}
    # one warm-up and one timed call to size the rounds, then 3 × (1 warm-up + 3 timed)
    assert calls == {"a": 2 + 3 * 4, "b": 2 + 3 * 4}
