"""The 0.2 calls from Python: Context.set_budget/trim, Sequence.discard/set_class, and the
new info and stats fields (docs/api.md "Elastic memory", "Sliding-window discard",
"Sequence classes")."""
import pytest

import kvvm
from conftest import GRANULE, small_config

TOK_PER_PAGE = GRANULE // 64            # small_config: bytes_per_token 64, page = granule


def test_set_budget_shrinks_grows_and_refuses_bad_values():
    with kvvm.Context(**small_config(device_budget=16 * GRANULE)) as c:
        s = c.create()
        s.grow(2 * TOK_PER_PAGE)                    # 2 pages per region, 4 in all
        with pytest.raises(kvvm.InvalidArgument):
            c.set_budget(GRANULE + 1)               # not a multiple of page_size
        with pytest.raises(kvvm.InvalidArgument):
            c.set_budget(0)
        c.set_budget(8 * GRANULE)
        c.sync()
        st = c.stats()
        assert st["device_bytes_held"] <= 8 * GRANULE
        assert s.info.pages_device == 4 and s.info.resident
        c.set_budget("64K")                         # 16 pages of 4 KiB: grows at once
        s.grow(6 * TOK_PER_PAGE)
        assert s.info.pages_device == 12


def test_set_budget_below_what_cannot_move_changes_nothing():
    with kvvm.Context(**small_config(device_budget=16 * GRANULE)) as c:
        s = c.create()
        s.grow(4 * TOK_PER_PAGE)                    # 8 pages, protected (used this step)
        before = c.stats()["pages_device_total"]
        with pytest.raises(kvvm.OutOfMemory):
            c.set_budget(4 * GRANULE)               # no host tier: nothing can go
        assert c.stats()["pages_device_total"] == before
        assert s.info.pages_device == 8 and s.info.resident


def test_trim_gives_unused_frames_back():
    with kvvm.Context(**small_config(device_budget=16 * GRANULE)) as c:
        s = c.create()
        s.grow(6 * TOK_PER_PAGE)
        s.truncate(TOK_PER_PAGE)                    # frames kept for reuse
        c.step()
        c.sync()
        held = c.stats()["device_bytes_held"]
        c.trim(0)
        c.sync()
        st = c.stats()
        assert st["device_bytes_held"] == 2 * GRANULE < held   # only s's 2 pages
        assert st["frames_released"] > 0
        s.grow(3 * TOK_PER_PAGE)                    # frames are created again on need
        assert s.info.pages_device == 6


def test_discard_releases_the_window_prefix():
    with kvvm.Context(**small_config()) as c:
        s = c.create()
        s.grow(4 * TOK_PER_PAGE)
        s.write(0, 3 * TOK_PER_PAGE * 64, b"\x07" * 64)
        s.discard(2 * TOK_PER_PAGE + 5, region=0)   # pages 0 and 1 of region 0 go
        i = s.info
        assert i.length == 4 * TOK_PER_PAGE and i.pages_device == 6
        assert i.first_kept == 0                    # the smallest over the regions
        with pytest.raises(kvvm.InvalidArgument):
            s.read(0, 0, 64)                        # before first_kept in region 0
        s.read(1, 0, 64)                            # region 1 keeps its tokens
        assert s.read(0, 3 * TOK_PER_PAGE * 64, 64) == b"\x07" * 64
        with pytest.raises(kvvm.InvalidArgument):
            s.discard(4 * TOK_PER_PAGE + 1)         # past the length
        s.discard(2 * TOK_PER_PAGE + 5)             # every region
        assert s.info.first_kept == 2 * TOK_PER_PAGE + 5 and s.info.pages_device == 4
        s.discard(TOK_PER_PAGE)                     # below the earlier one: a no-op
        assert s.info.first_kept == 2 * TOK_PER_PAGE + 5
        assert c.stats()["pages_discarded"] == 4


def test_cached_sequence_is_dropped_before_a_live_one_moves():
    with kvvm.Context(**small_config(device_budget=8 * GRANULE)) as c:
        a = c.create()
        a.grow(4 * TOK_PER_PAGE)                    # the whole device
        a.set_class("cached")
        c.step()                                    # a is no longer protected
        b = c.create()
        b.grow(1)                                   # a is dropped: no copy, no AUTO_SWAP
        i = a.info
        assert i.dropped and i.length == 0 and i.cls == kvvm.SEQ_CACHED
        assert c.stats()["cache_drops"] == 1
        with pytest.raises(kvvm.Stale):
            a.grow(1)
        with pytest.raises(kvvm.Stale):
            a.fork()
        a.set_class(kvvm.SEQ_LIVE)                  # an empty live sequence again
        assert not a.info.dropped and a.length == 0
        with pytest.raises(kvvm.InvalidArgument):
            a.set_class("hot")


def test_pinned_sequence_is_never_moved_by_the_budget():
    with kvvm.Context(**small_config(device_budget=16 * GRANULE,
                                     host_budget=32 * GRANULE)) as c:
        p, l = c.create(), c.create()
        p.grow(2 * TOK_PER_PAGE)
        l.grow(2 * TOK_PER_PAGE)
        p.set_class("pinned")
        c.step()
        c.set_budget(4 * GRANULE)                   # l goes to the host, p stays
        assert p.info.resident and not l.info.resident
        with pytest.raises(kvvm.OutOfMemory):
            c.set_budget(2 * GRANULE)               # p cannot move: nothing changes
        assert p.info.resident
