"""The choices of one prompt (`n` > 1) prefill it once: choice j > 0 forks choice 0's KV.

The frontend submits choice 0 first and each other choice with `fork_of` naming it
(`wire.Submit`). At the start writer, a choice whose parent (choice 0) is here with the same
prompt waits, out of the scheduler's ready set, until the parent's prefill has run; then
its engine forks the parent's KV of all the prompt but its last token (`Engine.fork`:
shared full blocks, the partial one copied), and from there it is an ordinary new request:
its first step feeds that last token (one token, like a decode), so it samples its first
token from logits of its own, with its own seed, and the router sees a step like any other.
The prompt costs P + (n - 1) computed tokens instead of n * P.

Everything else falls back to the plain path, a prefill of its own: an engine without
`fork` (a vLLM writer: its own prefix caching decides what it recomputes), a parent that is
not here (not yet admitted, already released) or whose prompt differs, a parent whose step
failed (its KV may be half written), a prompt of one token (nothing to share), no free
block for the copy. A parent released while its choices wait lets them go on their own. A
choice handed to another writer is an ordinary request there: each writer keeps its own KV
for it, and a writer other than the start one prefills each choice's context on its first
visit.
"""

from __future__ import annotations

from tokenrouter.runtime.subserver.request import Request


class Forks:
    """The choices held here until their parent's prompt KV can be forked."""

    def __init__(self, engine):
        self.engine = engine
        self.can_fork = callable(getattr(engine, "fork", None))
        self.held: dict[str, list[Request]] = {}  # parent rid -> its choices waiting for its prefill
        self.parent: dict[str, str] = {}  # held choice's rid -> its parent's
        self.forked = 0  # choices that shared a parent's prompt KV

    def arrive(self, r: Request, parent: Request | None) -> bool:
        """A new choice `r` of `parent`'s prompt: True when it waits here for the parent's
        prefill; False when it is ready now (forked, or to be prefilled on its own)."""
        if not self.can_fork or parent is None or self.shared(r) == 0:
            return False
        if parent.state.tokens[:parent.state.prompt_len] != r.state.tokens[:r.state.prompt_len]:
            return False  # another prompt (a prompt of another length included)
        if self.engine.fed(parent) >= self.shared(r):
            self.fork(parent, r)
            return False
        self.held.setdefault(parent.rid, []).append(r)
        self.parent[r.rid] = parent.rid
        return True

    @staticmethod
    def shared(r: Request) -> int:
        """The tokens a choice takes from its parent's KV: its prompt but the last token."""
        return r.state.prompt_len - 1

    def fork(self, parent: Request, r: Request) -> None:
        """Fork now if the engine has room for the copy; else `r` prefills on its own."""
        if self.engine.can_fork():
            self.engine.fork(parent, r, self.shared(r))
            self.forked += 1

    def stepped(self, parents: list[Request], ok: bool) -> list[Request]:
        """These requests were stepped (`ok`: without an error): the choices that are ready now."""
        out: list[Request] = []
        for p in parents:
            waiting = self.held.get(p.rid)
            if not waiting:
                continue
            if ok and self.engine.fed(p) < self.shared(waiting[0]):
                continue  # its prefill is not done (an engine that feeds a prompt in parts)
            for r in self.held.pop(p.rid):
                del self.parent[r.rid]
                if ok:
                    self.fork(p, r)
                out.append(r)
        return out

    def release(self, rid: str) -> list[Request]:
        """`rid` ended: a held choice is forgotten; a parent's held choices are ready now,
        each to prefill on its own."""
        parent = self.parent.pop(rid, None)
        if parent is not None:
            self.held[parent] = [r for r in self.held[parent] if r.rid != rid]
        out = self.held.pop(rid, [])
        for r in out:
            del self.parent[r.rid]
        return out
