"""What admission and preemption read and change of the scheduler: a Protocol, so they never import it.

``Scheduler`` owns these; ``engine.admission`` and ``engine.preemption`` are
its parts and take it as a ``SchedulerState``.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from ignis.engine.decode_lanes import DecodeLanes
from ignis.engine.eviction import Evictor
from ignis.engine.page_pool import PagePool
from ignis.engine.request import Request
from ignis.engine.reuse.learned_points import LearnedPoints
from ignis.engine.reuse.store import RetainedStore
from ignis.engine.scheduler_config import SchedulerConfig


class SchedulerState(Protocol):
    config: SchedulerConfig
    pool: PagePool
    store: RetainedStore
    evictor: Evictor
    learned: LearnedPoints | None  # None: learned points (and shortfall reasons) are off
    lanes: DecodeLanes
    waiting: dict[str, deque[Request]]  # by request class, in admission order
    num_preemptions: int
