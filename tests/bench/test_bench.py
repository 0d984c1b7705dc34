import torch

from kattn.bench import machine_info, measure_time
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


def test_peak_memory_does_not_count_earlier_calls():
    # the profiler's running total keeps blocks allocated in an earlier session and freed
    # outside one (here the returned outputs, and one kept alive); each call's peak is its own
    kept = []

    def work():
        kept.append(torch.ones(500_000))  # 2 MB that outlives the call
        a = torch.ones(1_000_000)  # 4 MB
        b = torch.ones(2_000_000)  # 8 MB
        del a
        return b

    peaks = [peak_memory_bytes(work) for _ in range(4)]
    assert all(14e6 <= p < 15e6 for p in peaks), peaks


def test_machine_info_names_versions():
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["kattn"]
