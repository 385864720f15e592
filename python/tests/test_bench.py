"""python3 -m kvvm.bench runs (tiny sizes here) and reports every row and ratio."""
import json

import pytest

pytest.importorskip("torch")
from kvvm import bench  # noqa: E402


def test_bench_small(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--only", "decode", "--contexts", "64,200", "--batches", "1,3",
                     "--steps", "2",
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
        assert r["ratio_step_d_over_c"] > 0 and r["steps"] == 2
        u = r["update_extra_us"]
        assert u["n"] == 2 and u["min"] <= u["p25"] <= u["median"] <= u["p75"] <= u["max"]
        assert set(r["append_us"]) == set("abcde")


def test_bench_update_small(tmp_path, capsys):
    """The update group: KVCache.update against bare_update at each length in one context,
    tight and decode, with the spread and the ratio to the first length (the bench checks
    that both wrote the same K/V)."""
    out = tmp_path / "bench.json"
    rc = bench.main(["--only", "update", "--contexts", "200,64", "--update-steps", "3",
                     "--warmup", "1", "--granule", "4K", "--layers", "2", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "update group" in text and "(a) libkvvm views" not in text
    j = json.loads(out.read_text())
    assert j["rows"] == [] and j["update"] == {"steps": 3, "batch": 1}
    rows = j["update_rows"]
    assert [(r["context"], r["mode"]) for r in rows] == [(64, "tight"), (64, "decode"),
                                                         (200, "tight"), (200, "decode")]
    assert rows[0]["price_over_first"] == 1.0 and rows[1]["price_over_first"] == 1.0
    for r in rows:
        p = r["price_us"]
        assert r["steps"] == 3 and p["n"] == 3 and r["update_us"] > 0 and r["bare_us"] > 0
        assert p["min"] <= p["p25"] <= p["median"] <= p["p75"] <= p["max"]


def test_bench_prefix_small(tmp_path, capsys):
    """The prefix group: both ways per length, the cached blocks attached (the bench itself
    checks the logits agree), the times and ratio reported with their spread."""
    out = tmp_path / "bench.json"
    rc = bench.main(["--only", "prefix", "--prefix-lengths", "64,200", "--prefix-suffix", "8",
                     "--prefix-trials", "2", "--prefix-granule", "4K", "--chunk", "48",
                     "--layers", "1", "--head-dim", "16", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "prefix group" in text and "full/attach" in text and "(a) libkvvm views" not in text
    j = json.loads(out.read_text())
    assert j["rows"] == [] and j["prefix"]["chunk"] == 48
    assert [r["prefix_tokens"] for r in j["prefix_rows"]] == [64, 200]
    for r in j["prefix_rows"]:
        assert r["block_tokens"] == 64 and r["attached_blocks"] == r["prefix_tokens"] // 64
        assert r["trials"] == 2 and r["full_ms"] > 0 and r["attach_ms"] > 0
        assert r["ratio_full_over_attach"] == pytest.approx(r["full_ms"] / r["attach_ms"])
        sp = r["ratio_spread"]
        assert sp["min"] <= sp["p25"] <= sp["p75"] <= sp["max"]
