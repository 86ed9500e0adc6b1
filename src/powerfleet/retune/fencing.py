"""Router barriers: a new leader moves every frontend's revision before it does anything else.

The term check before a PATCH cannot cover the instant between the check and the request:
a superseded leader that checked, stalled and then sent its PATCH carries the revision it
read. Every PATCH of the new leader moves that revision on, so such a late PATCH is refused
with 409 -- unless the new leader writes nothing to that router (a rollback to the settings
it already holds, advisory mode, a decision it already holds). The barrier closes that gap:
before its first act on a frontend under a term, the leader PATCHes it with an empty policy
(the frontend bumps its revision and changes nothing). A predecessor's PATCH read before the
barrier is then refused; one read after it is impossible, since its term check runs after
its read and the barrier follows the new term.

Which (term, frontend) pairs have their barrier is kept in Redis only: losing it costs one
more barrier, never safety.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from powerfleet.retune.fanin import PREFIX, TTL_S


@dataclass
class Barriers:
    r: redis.Redis | None
    dgd: str

    def _key(self, term: int) -> str:
        return f"{PREFIX}barrier:{self.dgd}:{term}"

    def written(self, term: int, pod: str) -> bool:
        return self.r is not None and bool(self.r.sismember(self._key(term), pod))

    def mark(self, term: int, pod: str) -> None:
        if self.r is None:
            return
        pipe = self.r.pipeline()
        pipe.sadd(self._key(term), pod)
        pipe.expire(self._key(term), TTL_S)
        pipe.execute()

    def purge(self) -> None:
        if self.r is not None:
            for key in list(self.r.scan_iter(f"{PREFIX}barrier:{self.dgd}:*")):
                self.r.delete(key)
