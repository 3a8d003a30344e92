"""Exported shm blocks: layout views, descriptors tierd can map, touch at creation, unlink on close."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ignis.shared.shm_blocks import ShmBlock, block_name, created_here
from ignis.shared.tier_wire import BlockDesc


def test_a_layer_major_kv_pool_as_runs_items_bytes():
    L, P, H, D = 2, 5, 2, 4  # [L, 2, P, 64, H, D] fp32
    item = 64 * H * D * 4
    with ShmBlock.create("kv", runs=2 * L, items=P, item_bytes=item, instance="t") as b:
        pool = b.typed(np.float32, (L, 2, P, 64, H, D))
        pool[1, 0, 3] = 7.0  # page 3, layer 1, keys
        view = b.item(3).view(np.float32).reshape(2 * L, 64, H, D)
        assert (view[2] == 7.0).all() and (view[[0, 1, 3]] == 0).all()
        d = b.descriptor()
        assert d == BlockDesc("kv", "shm", b.name, 2 * L, P, item, P * item)
        assert d.span_bytes == b.nbytes == pool.nbytes


def test_a_padded_run_stride_and_fill():
    with ShmBlock.create("conv", runs=3, items=2, item_bytes=10, run_stride_bytes=32, fill=5, instance="t") as b:
        assert b.nbytes == 2 * 32 + 20
        assert b.array().strides == (32, 10, 1) and (b.array() == 5).all()


def test_close_unlinks_the_name():
    b = ShmBlock.create("ssm", 1, 1, 4096, instance="t")
    path = f"/dev/shm/{b.name.lstrip('/')}"
    assert os.path.exists(path) and created_here(b.name)
    b.close()
    b.close()  # twice is fine
    assert not os.path.exists(path) and not created_here(b.name)


def test_bad_layouts_raise_before_any_memory_is_allocated():
    with pytest.raises(ValueError, match="runs"):
        ShmBlock.create("kv", 0, 1, 1, instance="t")
    with pytest.raises(ValueError, match="overlap"):
        ShmBlock.create("kv", 2, 4, 8, run_stride_bytes=16, instance="t")
    with pytest.raises(ValueError, match="instance"):
        block_name("../x", "kv")
    with ShmBlock.create("kv", 1, 2, 8, instance="t") as b:
        with pytest.raises(ValueError, match="holds 16"):
            b.typed(np.float32, (5,))
        with pytest.raises(IndexError):
            b.item(2)


def test_a_block_that_does_not_fit_in_shared_memory_is_a_clear_error_and_leaves_nothing(monkeypatch):
    import errno

    from ignis.shared import shm_blocks

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_blocks.os, "posix_fallocate", no_room)
    name = block_name("default", "kv")
    with pytest.raises(shm_blocks.ShmFull, match="--shm-size"):
        ShmBlock.create("kv", runs=2, items=4, item_bytes=4096, shm_name=name)
    assert not os.path.exists(os.path.join(shm_blocks.SHM_DIR, name)) and not created_here(name)


def test_unlink_orphans_takes_only_engine_blocks_of_dead_creators(tmp_path):
    import subprocess
    import sys

    from ignis.shared.shm_blocks import unlink_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = [f"ignis-{dead.pid}-0-kv", f"ignis-{dead.pid}-3-slots-ssm", f"ignis-{os.getpid()}-0-kv",
             f"ignis-default-kv-{dead.pid}-ab12cd34", "other-file"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    gone = unlink_orphans(str(tmp_path))
    assert sorted(gone) == sorted(names[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
