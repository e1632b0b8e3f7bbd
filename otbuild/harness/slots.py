"""How many trials run at once: `concurrency` agents at work (the model's load: what the recipe's
`concurrency` sets), and beside them as many trials again, getting ready (sandbox, verifier
parked, terminal and its first screen) or done with their agents (verifier, clean-up). A trial
takes an agent slot when its first request is ready to go and hands it back when its last agent
ends: the next trial's start and this one's verifier (a Python start, a test suite) are no
longer time the model waits for. At most `concurrency` trials get ready (or wait ready) at once,
in the order they came: at a shard's start the first agents' trials get the CPU first, not all
2 x concurrency starts at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TrialSlots:
    """`trial()`: one trial's place; `pipelined=False`: a trial holds its agent slot from its
    start to its end (its sandbox's start and its verifier inside), as before this split."""

    def __init__(self, concurrency: int, *, pipelined: bool = True):
        self._agents = asyncio.Semaphore(concurrency)
        self._trials = asyncio.Semaphore(2 * concurrency if pipelined else concurrency)
        self._getting_ready = asyncio.Semaphore(concurrency)
        self.pipelined = pipelined

    @asynccontextmanager
    async def trial(self) -> AsyncIterator[TrialSlot]:
        async with self._trials:
            slot = TrialSlot(self._agents)
            if self.pipelined:
                await self._getting_ready.acquire()
                slot.ready = self._getting_ready  # handed back with its first agent slot
            else:
                await slot.agent()
                slot.pipelined = False
            try:
                yield slot
            finally:
                slot.release()


class TrialSlot:
    """One trial's agent slot: `agent()` before its first request (again: at once), `agents_done()`
    once its last agent has ended; the trial's end hands it back in any case."""

    def __init__(self, agents: asyncio.Semaphore):
        self._agents = agents
        self.ready: asyncio.Semaphore | None = None  # the place among the trials getting ready, while held
        self.held = False
        self.pipelined = True
        self.agents_finished = False

    async def agent(self) -> float:
        """Wait for the agent slot; the seconds waited."""
        if self.held:
            return 0.0
        start = time.monotonic()
        await self._agents.acquire()
        self.held = True
        self._ready_done()
        return time.monotonic() - start

    def agents_done(self) -> None:
        self.agents_finished = True
        if self.pipelined:
            self.release()

    async def finish(self, trial: asyncio.Future) -> tuple[dict, bool]:
        """`trial`'s trace, and whether the shard stopped (cancelled this) meanwhile: a trial
        whose agents are done then still runs its verifier to its end, so its record is kept
        (its model calls are not made again); one still at its agents is cancelled, as before."""
        try:
            return await asyncio.shield(trial), False
        except asyncio.CancelledError:
            if not self.agents_finished:
                trial.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await trial  # its sandbox closed before the shard's stop goes on
                raise
        return await trial, True

    def release(self) -> None:
        self._ready_done()
        if self.held:
            self.held = False
            self._agents.release()

    def _ready_done(self) -> None:
        if self.ready is not None:
            self.ready.release()
            self.ready = None
