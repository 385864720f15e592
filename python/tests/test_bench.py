"""python3 -m kvvm.bench runs (tiny sizes here) and reports every row and ratio."""
import json

import pytest

pytest.importorskip("torch")
from kvvm import bench  # noqa: E402


def test_bench_small(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--contexts", "64,200", "--batches", "1,3", "--steps", "2",
                     "--warmup", "1", "--granule", "4K", "--layers", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "(a) libkvvm views" in text and "a/c" in text and "(d) libkvvm through" in text
    j = json.loads(out.read_text())
    assert [(r["context"], r["batch"]) for r in j["rows"]] == [(64, 1), (64, 3), (200, 1),
                                                               (200, 3)]
    for r in j["rows"]:
        m = r["memory_bytes"]
        assert m["b"] == m["live"] and m["a"] >= m["live"]
        assert m["a_slack_pages_per_region_seq"] <= 1.0         # at most one page each
        assert m["c"] > m["live"] and r["ratio_step_a_over_c"] > 0
        assert r["ratio_step_d_over_c"] > 0 and set(r["update_extra_us"]) == {"median", "min",
                                                                             "max"}
