"""KV events on the wire, as vLLM publishes them: ZeroMQ PUB of msgpack event batches, with a replay socket.

Enabled by ``--kv-events-endpoint`` (off by default: nothing is bound). What
goes out is vLLM's ``KVEventBatch`` (``vllm/distributed/kv_events.py``),
msgspec's array-like tagged encoding written with plain msgpack::

    batch     [ts, [event, ...], data_parallel_rank]
    event     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
               lora_name]
              ["BlockRemoved", block_hashes, medium]
              ["AllBlocksCleared"]

Each batch is one multipart message ``(topic, sequence number as 8-byte
big-endian, payload)``; sequence numbers count from 0. With
``--kv-events-replay-endpoint`` a ROUTER socket answers a request (a REQ or
DEALER frame holding the 8-byte big-endian sequence number to start from)
with every batch still in the bounded buffer from that number on, each as
``(seq, payload)``, then ``(-1 as 8 bytes, b"")``.

The engine loop never waits on this: events of a loop turn are collected
(``add``) and handed over as one batch (``flush``, which gives it its
sequence number) to a bounded queue that a thread drains into the sockets. A
batch that finds the queue full is dropped and counted (``dropped``; the
metric ``ignis:kv_events_dropped_total``; a warning at the 1st, 10th, 100th,
... drop); its number is used up, so a subscriber sees the gap and can ask
the replay socket (or resynchronise). The PUB socket binds when
the endpoint is ``ipc://``, ``inproc://`` or has a wildcard host (``*``),
else connects (an aggregator that binds a SUB socket), as vLLM does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgpack
import zmq

from ignis.engine.reuse.block_events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from ignis.shared.zmq_queues import open_to_network

log = logging.getLogger("ignis.engine")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay socket's last frame pair: ``(END_SEQ, b"")``."""


def encode_event(event: BlockEvent) -> list:
    """One event as msgspec's array-like tagged struct: the class name first, then the fields in order."""
    if isinstance(event, BlockStored):
        return ["BlockStored", list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
                event.block_size, event.lora_id, event.medium, None]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV block event: {event!r}")


def encode_batch(ts: float, events: list[BlockEvent], data_parallel_rank: int = 0) -> bytes:
    """A ``KVEventBatch`` payload."""
    return msgpack.packb([ts, [encode_event(e) for e in events], data_parallel_rank], use_bin_type=True)


def binds(endpoint: str) -> bool:
    """Whether the PUB socket binds ``endpoint`` (else it connects), by vLLM's rule."""
    return endpoint.startswith(("ipc://", "inproc://")) or "*" in endpoint or "::" in endpoint


class KvEventPublisher:
    """The PUB (and optional ROUTER replay) sockets and the thread that feeds them."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 data_parallel_rank: int = 0, buffer_batches: int = 10_000, max_queue: int = 1_000,
                 hwm: int = 100_000, ctx: zmq.Context | None = None):
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self.dropped = 0  # batches dropped because the queue was full
        self.published = 0  # batches sent
        self.malformed = 0  # replay requests refused as malformed
        self._pending: list[BlockEvent] = []
        self._next_seq = 0  # the next batch's sequence number (a dropped batch uses one up)
        self._queue: "queue.Queue[tuple[int, list[BlockEvent]] | None]" = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_batches)
        self._ctx = ctx or zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            if binds(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            for where, bound in ((endpoint, binds(endpoint)), (replay_endpoint or "", bool(replay_endpoint))):
                if bound and open_to_network(where):  # the replay socket always binds
                    log.warning("KV events at %s go to anyone who can reach it (no authentication): they hold "
                                "every prompt's token ids; keep it on a trusted network", where)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(f"cannot open the KV events sockets ({endpoint}, {replay_endpoint}): {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    # ----- engine loop side ------------------------------------------------------------------

    def add(self, event: BlockEvent) -> None:
        """Collect one event for the next batch (the engine loop's thread only)."""
        self._pending.append(event)

    def flush(self) -> None:
        """Hand the events collected since the last flush over as one batch; never waits."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        try:
            self._queue.put_nowait((seq, batch))
        except queue.Full:
            self.dropped += 1
            if str(self.dropped).strip("0") == "1":  # 1, 10, 100, ...
                log.warning("KV events: %d batches dropped so far (the publisher's queue was full; batch %d is "
                            "a gap subscribers see); ignis:kv_events_dropped_total counts them", self.dropped, seq)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (for at most ``timeout`` seconds), then close the sockets."""
        self.flush()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_sockets()

    # ----- publisher thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._replay is not None:
                try:
                    while self._replay.poll(0):
                        self._answer_replay()
                except zmq.ZMQError:  # a replay peer's trouble never stops the publishing
                    log.exception("KV events: replay request failed")
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, batch = item
            payload = encode_batch(time.time(), batch, self.rank)
            try:  # a PUB socket never waits: past its high-water mark a slow subscriber misses the batch
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                log.exception("KV events: cannot send batch %d", seq)
            self._buffer.append((seq, payload))
            self.published += 1

    def _answer_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) not in (2, 3) or len(frames[-1]) != 8 or (len(frames) == 3 and frames[1]):
            self.malformed += 1
            log.warning("KV events: malformed replay request (%d frames) ignored", len(frames))
            return
        envelope = [frames[0], b""] if len(frames) == 3 else [frames[0]]
        start = int.from_bytes(frames[-1], "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart(envelope + [seq.to_bytes(8, "big"), payload])
        self._replay.send_multipart(envelope + [END_SEQ, b""])

    def _close_sockets(self) -> None:
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)


def open_kv_events(config) -> KvEventPublisher | None:
    """The publisher ``config`` asks for (``--kv-events-endpoint``), or None when it is off."""
    if config.kv_events_endpoint in (None, "", "off"):
        return None
    return KvEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint,
                            config.kv_events_topic)
