"""A null engine for gateway benchmarks: the real ZeroMQ protocol, no model, tokens as fast as they are taken.

    python bench/null_engine.py --endpoint ipc://... --tokens 785,3974,... [--credits FILE] [--window 2]

One thread and one ROUTER socket (frames decoded by ``shared.wire``; garbage
answered with an ErrorReply) that answers like the engine:

    Stats     -> StatsReply (max_model_len, vocab_size, engine_started_unix, rounds, num_requests_running)
    Generate  -> a stream of ``max_tokens`` tokens, cycling through ``--tokens``, then Finished length
    Abort     -> the stream ends at once with Finished abort

Rounds: each round gives one token (``--burst N``: N) to every stream that may take one and
sends, per gateway, one TokenBatch holding all of that gateway's streams of
the round (as the engine does), then the Finished of streams that ran out.

Pacing (``--credits``): the benchmark's clients count the tokens each of
their streams received in a shared file of int64 counters, one per client
slot; a request names its slot in its first prompt token (``SLOT_BASE +
slot``), or, when its prompt is a rendered chat template, in its seed. A
stream gets its next token only while fewer than ``--window`` of its tokens
are unread by its client, so the engine runs exactly as fast as the
gateway delivers (a stream whose counter has not moved for ``STALL_S`` gets a
token anyway, so a miscount cannot stall it). Without ``--credits`` every
stream gets a token every round. When no stream can take a token the loop
sleeps ``IDLE_S``. ``--garbage-every N`` adds a malformed TokenBatch after
every Nth round (the gateway must log it, drop it and keep serving). TokenBatch frames are built directly (checked at start
against the codec's encoding of the same batch).
"""

from __future__ import annotations

import argparse
import mmap
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from checkout import use_checkout

use_checkout()

import zmq  # noqa: E402

from ignis.shared.wire import (  # noqa: E402
    GATEWAY_ENGINE,
    GATEWAY_TO_ENGINE,
    Abort,
    Finished,
    Generate,
    Stats,
    StatsReply,
    StreamTokens,
    TokenBatch,
    Usage,
    WireError,
)
from ignis.shared.wire_codec import ErrorReply  # noqa: E402

SLOT_BASE = 1000
"""A prompt whose first id is SLOT_BASE + k belongs to client slot k."""
MAX_MODEL_LEN = 1 << 20
VOCAB_SIZE = 248_320
STALL_S = 0.05
MALFORMED = [orjson.dumps({"type": "token_batch", "v": 1, "ids": ["nobody"], "counts": [3]}), b"\0\0\0\0"]
"""A TokenBatch whose counts do not match its frame (``--garbage-every``): the gateway must drop it."""
IDLE_S = 0.0005
"""How long the loop sleeps when every stream waits for its client."""


@dataclass
class Stream:
    id: str
    peer: bytes
    prompt_len: int
    left: int
    slot: int | None
    read_base: int  # the slot's counter when the stream began
    sent: int = 0
    moved_at: float = 0.0  # when its client last read one of its tokens
    last_read: int = 0


class Credits:
    """The clients' per-slot read counters (int64 each), shared through a file."""

    def __init__(self, path: str):
        self._file = Path(path).open("r+b")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.counts = np.frombuffer(self._map, dtype=np.int64)

    def read_all(self) -> list[int]:
        return self.counts.tolist()


def token_batch_frames(ids: list[str], tokens: list[int], counts: list[int] | None = None) -> list[bytes]:
    """The frames of a TokenBatch giving stream ``ids[i]`` its ``counts[i]`` (default: one each) of ``tokens`` in
    order, built directly (a round's hot path); ``check_framing`` proves them equal to the codec's."""
    header = orjson.dumps({"type": TokenBatch.TYPE, "v": GATEWAY_ENGINE.version, "ids": ids,
                           "counts": [1] * len(ids) if counts is None else counts})
    return [header, np.asarray(tokens, dtype="<i4").tobytes()]


def check_framing() -> None:
    ids, tokens = ["a-0", "b-1"], [5, 248_000]
    batch = TokenBatch(tuple(StreamTokens(i, (t,)) for i, t in zip(ids, tokens)))
    pairs = TokenBatch((StreamTokens(ids[0], (5, 6, 7)), StreamTokens(ids[1], (8,))))
    if (token_batch_frames(ids, tokens) != GATEWAY_ENGINE.encode(batch)
            or token_batch_frames(ids, [5, 6, 7, 8], [3, 1]) != GATEWAY_ENGINE.encode(pairs)):
        raise SystemExit("null engine: its TokenBatch framing differs from shared.wire's")


class NullEngine:
    """One thread, one ROUTER socket: the inbox is read between rounds, as the engine does."""

    def __init__(self, endpoint: str, tokens: list[int], credits: Credits | None, window: int,
                 garbage_every: int = 0, burst: int = 1):
        self.garbage_every = garbage_every
        self.burst = burst
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(endpoint)
        self.tokens = tokens
        self.credits = credits
        self.window = window
        self.streams: dict[str, Stream] = {}
        self.started = time.time()
        self.rounds = 0
        self.garbage = 0

    def run(self, stop) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not stop():
            busy = self._round()
            if busy or poller.poll(0 if self.streams else 50):
                self._take_inbox()
            elif self.streams:
                time.sleep(IDLE_S)

    def _send(self, peer: bytes, frames: list[bytes]) -> None:
        try:
            self.sock.send_multipart([peer, *frames])
        except zmq.ZMQError:
            pass  # the gateway is gone (ROUTER_MANDATORY): its streams end with the next Abort or never

    def _take_inbox(self) -> None:
        while True:
            try:
                peer, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = GATEWAY_ENGINE.decode(frames, GATEWAY_TO_ENGINE)
            except WireError as e:
                self.garbage += 1
                self._send(peer, GATEWAY_ENGINE.encode(ErrorReply(str(e)[:4000])))
                continue
            self._handle(msg, peer)

    def _handle(self, msg, peer: bytes) -> None:
        if isinstance(msg, Stats):
            self._send(peer, GATEWAY_ENGINE.encode(StatsReply({
                "max_model_len": MAX_MODEL_LEN, "vocab_size": VOCAB_SIZE, "engine_started_unix": self.started,
                "rounds": self.rounds, "num_requests_running": len(self.streams)})))
        elif isinstance(msg, Generate):
            first = msg.prompt_ids[0] - SLOT_BASE
            slots = len(self.credits.counts) if self.credits is not None else 0
            if not 0 <= first < slots and msg.sampling.seed is not None:  # a templated prompt: its seed names it
                first = msg.sampling.seed - SLOT_BASE
            slot = first if 0 <= first < slots else None
            base = int(self.credits.counts[slot]) if slot is not None else 0
            self.streams[msg.id] = Stream(msg.id, peer, len(msg.prompt_ids), msg.sampling.max_tokens, slot, base,
                                          moved_at=time.monotonic(), last_read=base)
        elif isinstance(msg, Abort):
            s = self.streams.pop(msg.id, None)
            if s is not None:
                self._finish(s, "abort")

    def _finish(self, s: Stream, reason: str) -> None:
        self._send(s.peer, GATEWAY_ENGINE.encode(Finished(s.id, reason, Usage(s.prompt_len, s.sent))))

    def _round(self) -> bool:
        """One round; False when no stream could take a token."""
        if not self.streams:
            return False
        now = time.monotonic()
        reads = self.credits.read_all() if self.credits is not None else None
        batches: dict[bytes, tuple[list[str], list[int], list[int]]] = {}
        done: list[Stream] = []
        n, window = len(self.tokens), self.window
        for s in self.streams.values():
            if s.slot is not None:
                read = reads[s.slot]
                if read != s.last_read:
                    s.last_read, s.moved_at = read, now
                if s.sent - (read - s.read_base) >= window and now - s.moved_at <= STALL_S:
                    continue
            ids, counts, toks = batches.setdefault(s.peer, ([], [], []))
            k = min(self.burst, s.left)
            ids.append(s.id)
            counts.append(k)
            toks.extend(self.tokens[(s.sent + j) % n] for j in range(k))
            s.sent += k
            s.left -= k
            if s.left <= 0:
                done.append(s)
        for peer, (ids, counts, toks) in batches.items():
            self._send(peer, token_batch_frames(ids, toks, counts))
            if self.garbage_every and self.rounds % self.garbage_every == 0:
                self._send(peer, MALFORMED)
        for s in done:
            del self.streams[s.id]
            self._finish(s, "length")
        if batches:
            self.rounds += 1
        return bool(batches)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind (the gateway's --engine-endpoint)")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids every stream cycles through")
    ap.add_argument("--credits", default=None, help="file of int64 per-slot read counters (see the docstring)")
    ap.add_argument("--window", type=int, default=2, help="unread tokens allowed per stream with --credits")
    ap.add_argument("--burst", type=int, default=1, help="tokens each stream gets per round (tests that need "
                    "output fast; pacing by --credits assumes 1)")
    ap.add_argument("--garbage-every", type=int, default=0, help="after every Nth round also send a malformed "
                    "TokenBatch to each gateway (tests)")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    engine = NullEngine(args.endpoint, tokens, Credits(args.credits) if args.credits else None, args.window,
                        args.garbage_every, args.burst)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    check_framing()
    print(f"READY {args.endpoint}", flush=True)
    try:
        engine.run(lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
