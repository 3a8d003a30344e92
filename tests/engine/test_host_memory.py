"""Host blocks: named shared memory reserved up front, and a private fallback when /dev/shm is too small."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import torch

from ignis.shared import shm_blocks
from ignis.engine.host_memory import HostBlock


def test_a_host_block_is_named_shared_memory_of_its_size():
    block = HostBlock((3, 5), torch.float32, "cpu", "test")
    try:
        path = os.path.join(shm_blocks.SHM_DIR, block.shm_name)
        assert os.path.getsize(path) >= 3 * 5 * 4
        block.tensor[:] = 7.0
        assert float(block.tensor.sum()) == 7.0 * 15
    finally:
        block.release()
    assert not os.path.exists(path)


def test_a_host_blocks_name_cannot_be_taken_first_and_is_still_reclaimable_by_pid():
    """Another local user who creates ``ignis-<pid>-0-kv`` ahead of an engine must not stop it from starting:
    the name has a random part (and the orphan sweep still reads the creator's pid from it)."""
    block = HostBlock((2, 2), torch.float32, "cpu", "kv")
    try:
        m = shm_blocks.ENGINE_BLOCK.match(block.shm_name)
        assert m is not None and int(m.group(1)) == os.getpid()
        pid, serial, rand, tag = block.shm_name[len("ignis-"):].split("-", 3)
        assert len(rand) == 8 and tag == "kv", block.shm_name
    finally:
        block.release()


def test_too_small_shared_memory_gives_a_private_block_and_a_warning(monkeypatch, caplog):
    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_blocks.os, "posix_fallocate", no_room)
    before = set(os.listdir(shm_blocks.SHM_DIR))
    with caplog.at_level(logging.WARNING, logger="ignis.engine"):
        block = HostBlock((4, 1024), torch.float32, "cpu", "slots-ssm")
    assert block.shm_name is None  # not exported: the lower tiers stay off
    assert block.tensor.shape == (4, 1024) and float(block.tensor.abs().sum()) == 0.0
    block.tensor += 1  # usable memory of its own
    assert "--shm-size" in caplog.text and "slots-ssm" in caplog.text
    assert set(os.listdir(shm_blocks.SHM_DIR)) <= before  # the shared object was unlinked
    block.release()


def test_a_state_with_a_private_slot_block_exports_nothing(monkeypatch):
    from ignis.shared.demo import ensure_demo_model
    from ignis.engine.models.config import load_config
    from ignis.engine.models.state import ModelState
    from ignis.engine.tiers.wiring import exported_blocks

    cfg = load_config(ensure_demo_model())
    state = ModelState.allocate(cfg, num_pages=4, lanes=1, dtype=torch.float32, shared=True)
    real = shm_blocks.os.posix_fallocate

    def fail_for_slots(fd, offset, length):
        if length > 0 and os.readlink(f"/proc/self/fd/{fd}").endswith("slots-conv"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, offset, length)

    monkeypatch.setattr(shm_blocks.os, "posix_fallocate", fail_for_slots)
    try:
        state.allocate_slots(device_slots=0, host_slots=2)
        assert [b.shm_name is None for b in state.host_blocks] == [False, True]
        assert exported_blocks(state) is None
        state.save_image(0, 1)  # the private slot still works for reuse on the device side
    finally:
        state.close()


@pytest.mark.skipif(not os.path.isdir(shm_blocks.SHM_DIR), reason="needs a Linux /dev/shm")
def test_reserve_reports_a_filesystem_without_fallocate_as_fine(monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(shm_blocks.os, "posix_fallocate", unsupported)
    block = HostBlock((2,), torch.float32, "cpu", "t")
    try:
        assert block.shm_name is not None
    finally:
        block.release()
