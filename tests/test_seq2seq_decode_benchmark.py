"""``benchmarks/seq2seq_decode_speed.py`` runs end to end (``--quick``) and writes its tables."""

import json

from .test_benchmark_scripts import run_quick

TIMES = ("encode_seconds", "cross_cache_seconds", "first_seconds", "last_seconds", "all_seconds")


def test_seq2seq_decode_speed_quick_run_writes_results(tmp_path):
    run_quick("seq2seq_decode_speed.py", tmp_path)
    (md,) = tmp_path.glob("seq2seq-decode-*-quick.md")
    (js,) = tmp_path.glob("seq2seq-decode-*-quick.json")
    report = json.loads(js.read_text())
    assert report["command"].startswith("python benchmarks/seq2seq_decode_speed.py --quick")
    assert report["config"]["lengths"] == [16, 32] and report["config"]["threads"] == 1
    assert set(report["config"]["configs"]) == {"softmax", "nprf_rpe"}
    assert max(report["correctness_max_abs_error"].values()) < 1e-4
    # every round runs both configurations at both lengths, each to the end of its target
    runs = report["runs"]
    assert {(r["round"], r["length"], r["config"]) for r in runs} == {
        (i, n, c) for i in range(2) for n in (16, 32) for c in ("softmax", "nprf_rpe")
    }
    assert all(r["position"] == r["length"] and len(r["block_seconds"]) == r["length"] // 4
               for r in runs)  # fmt: skip
    assert all(r[key] > 0 for r in runs for key in TIMES)
    for length in ("16", "32"):
        soft, kern = (report["summary"][length][c] for c in ("softmax", "nprf_rpe"))
        assert set(report["ratios"][length]) == {*TIMES, "state_bytes"}
        ratio = report["ratios"][length]["state_bytes"]
        assert ratio["value"] == soft["state_bytes"] / kern["state_bytes"]
        assert len(ratio["rounds"]) == 2
    # a key/value cache grows with the target; the recurrent state and kernelized sums do not
    short, long = (report["summary"][n] for n in ("16", "32"))
    assert long["softmax"]["self_state_bytes"] == 2 * short["softmax"]["self_state_bytes"]
    assert long["softmax"]["cross_cache_bytes"] == 2 * short["softmax"]["cross_cache_bytes"]
    assert long["nprf_rpe"]["state_bytes"] == short["nprf_rpe"]["state_bytes"]
    probe = {(r["rpe"], r["position"]): r["state_bytes"] for r in report["rpe_probe"]}
    assert probe[("decay", 8)] == probe[("decay", 24)]
    assert probe[("toeplitz", 8)] < probe[("toeplitz", 24)]
    assert "| 32 | softmax / other |" in md.read_text()
