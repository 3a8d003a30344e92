"""Stop strings matched on the output text, across token boundaries.

Text arrives in deltas (one per token or so); a stop string may span several.
The matcher releases text only when it cannot be the start of a stop string:

    released | held (a suffix that is a prefix of some stop string) | next delta ...

On a match the text before the earliest stop string is released and the rest
(the stop string and anything after it) is dropped; with ``include_stop``
(vLLM's ``include_stop_str_in_output``) the stop string is released too, and
only what follows it is dropped. Pure Python.
"""

from __future__ import annotations


class StopMatcher:
    """Tracks one stream's unreleased text against a set of stop strings."""

    def __init__(self, stops: tuple[str, ...] | list[str] = (), include_stop: bool = False):
        stops = tuple(stops)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop strings must be non-empty strings")
        self.stops = stops
        self.include_stop = include_stop
        self.stopped = False
        self.matched: str | None = None
        self.match_end = 0  # where in the last pushed text the match ended (its length past the held text)
        self._held = ""

    def push(self, text: str) -> str:
        """Add a delta; return the text now safe to emit. After a match, returns ''."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        best, matched = -1, None
        for stop in self.stops:
            at = buf.find(stop)
            if at >= 0 and (best < 0 or at < best):
                best, matched = at, stop
        if matched is not None:
            self.match_end = best + len(matched) - (len(buf) - len(text))
            self.stopped, self.matched, self._held = True, matched, ""
            return buf[:best + len(matched)] if self.include_stop else buf[:best]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def finish(self) -> str:
        """The stream ended without a match: release what was held back."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:k]):
                    longest = k
                    break
        return longest
