"""Ranking and room plans, pure: exact eviction orders and exactly which entries spill or go."""

from __future__ import annotations

from ignis.tierd.ranking import Candidate, DiskView, Rank, eviction_order, plan_arena_room, plan_disk_room, rank_key

NOW, TTL = 10_000.0, 300.0


def rank(kind, cls, used, seq=0):
    return Rank(kind, cls, NOW - used, seq)  # ``used``: seconds ago


def cand(key, kind, cls, ago, size=1, file_bytes=100, seq=0):
    return Candidate(key, rank(kind, cls, ago, seq), size, file_bytes)


def keys(cands):
    return [c.key for c in cands]


def test_order_retained_before_live_agent_before_interactive_then_lru():
    cands = [
        cand("live-int-old", "live", "interactive", 50), cand("live-agent-new", "live", "agent", 1),
        cand("ret-int-new", "retained", "interactive", 1), cand("ret-agent-new", "retained", "agent", 2),
        cand("ret-agent-old", "retained", "agent", 60), cand("live-agent-old", "live", "agent", 90),
        cand("ret-int-old", "retained", "interactive", 100),
    ]
    assert keys(eviction_order(cands, NOW, TTL)) == [
        "ret-agent-old", "ret-agent-new", "ret-int-old", "ret-int-new",
        "live-agent-old", "live-agent-new", "live-int-old",
    ]


def test_an_idle_interactive_checkpoint_ranks_as_an_agents_after_the_ttl():
    idle = cand("ret-int-idle", "retained", "interactive", TTL + 1)
    fresh_agent = cand("ret-agent", "retained", "agent", 5)
    assert keys(eviction_order([fresh_agent, idle], NOW, TTL)) == ["ret-int-idle", "ret-agent"]
    assert keys(eviction_order([fresh_agent, idle], NOW, 1e9)) == ["ret-agent", "ret-int-idle"]
    live_idle = cand("live-int-idle", "live", "interactive", TTL + 1)  # live work never decays
    assert rank_key(live_idle.rank, NOW, TTL)[1] == 1


def test_ties_go_by_arrival():
    a, b = cand("b", "retained", "agent", 5, seq=2), cand("a", "retained", "agent", 5, seq=1)
    assert keys(eviction_order([a, b], NOW, TTL)) == ["a", "b"]


def test_no_plan_needed_when_there_is_room():
    assert plan_arena_room(4, 4, rank("live", "agent", 0), [], None, NOW, TTL).empty


def test_disk_off_discards_retained_lowest_first_and_skips_live():
    arena = [cand("live-a", "live", "agent", 90, size=2), cand("ret-i", "retained", "interactive", 10, size=1),
             cand("ret-a", "retained", "agent", 5, size=1)]
    plan = plan_arena_room(1, 3, rank("live", "interactive", 0), arena, None, NOW, TTL)
    assert plan.arena_discards == ["ret-a", "ret-i"] and plan.spills == [] and plan.disk_discards == []
    # one block more than the retained entries free: live-a cannot be discarded, so there is no plan
    assert plan_arena_room(1, 4, rank("live", "interactive", 0), arena, None, NOW, TTL) is None


def test_only_entries_ranked_below_the_incoming_one_give_way():
    arena = [cand("ret-int", "retained", "interactive", 10), cand("live-a", "live", "agent", 10)]
    incoming_ret_agent = rank("retained", "agent", 0)
    assert plan_arena_room(0, 1, incoming_ret_agent, arena, None, NOW, TTL) is None
    plan = plan_arena_room(0, 1, rank("retained", "interactive", 0), arena, None, NOW, TTL)
    assert plan.arena_discards == ["ret-int"]
    disk = DiskView(free=1000, cands=())
    plan = plan_arena_room(0, 2, rank("live", "interactive", 0), arena, disk, NOW, TTL)
    assert plan.spills == ["ret-int", "live-a"]  # retained first, then the lower live entry


def test_disk_on_spills_and_makes_disk_room_from_retained_only():
    arena = [cand("live-old", "live", "agent", 90, size=2, file_bytes=300),
             cand("ret", "retained", "agent", 10, size=1, file_bytes=300)]
    disk = DiskView(free=100, cands=(cand("d-live", "live", "agent", 500, size=300),
                                     cand("d-ret-new", "retained", "interactive", 1, size=300),
                                     cand("d-ret-old", "retained", "agent", 400, size=300)))
    plan = plan_arena_room(0, 3, rank("live", "interactive", 0), arena, disk, NOW, TTL)
    # "ret" may push out only disk entries ranked below it (d-ret-old); live-old then takes d-ret-new's
    # room; d-live stays whatever it costs
    assert plan.spills == ["ret", "live-old"]
    assert plan.disk_discards == ["d-ret-old", "d-ret-new"]
    assert plan.arena_discards == []


def test_a_retained_victim_is_discarded_when_disk_cannot_take_it():
    arena = [cand("ret", "retained", "agent", 10, size=1, file_bytes=300)]
    disk = DiskView(free=100, cands=(cand("d-live", "live", "agent", 500, size=300),))
    plan = plan_arena_room(0, 1, rank("live", "agent", 0), arena, disk, NOW, TTL)
    assert plan.arena_discards == ["ret"] and plan.spills == [] and plan.disk_discards == []


def test_live_victims_with_a_full_disk_of_live_work_mean_no_plan_and_nothing_touched():
    arena = [cand("ret", "retained", "agent", 10, size=1), cand("live", "live", "agent", 10, size=1)]
    disk = DiskView(free=0, cands=(cand("d-live", "live", "agent", 500, size=1000),))
    assert plan_arena_room(0, 2, rank("live", "interactive", 0), arena, disk, NOW, TTL) is None


def test_disk_room_for_a_direct_write():
    disk = DiskView(free=50, cands=(cand("d-ret-b", "retained", "agent", 5, size=100),
                                    cand("d-ret-a", "retained", "agent", 50, size=100),
                                    cand("d-live", "live", "agent", 500, size=100)))
    plan = plan_disk_room(disk, 200, rank("live", "agent", 0), NOW, TTL)
    assert plan.disk_discards == ["d-ret-a", "d-ret-b"]
    assert plan_disk_room(disk, 300, rank("live", "agent", 0), NOW, TTL) is None  # d-live never goes
    assert plan_disk_room(disk, 40, rank("retained", "agent", 0), NOW, TTL).empty
    # a retained entry older than every disk entry cannot push any of them out
    assert plan_disk_room(disk, 100, rank("retained", "agent", 1000), NOW, TTL) is None
