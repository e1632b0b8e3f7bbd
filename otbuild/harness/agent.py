"""A trial's agent: turns in the sandbox's terminal (the model answers, its commands run, the
screen goes back), in the recipe's protocol (terminus-2's JSON or native tool calls:
otbuild/harness/turns.py), until it declares the task complete twice, runs out of time or
episodes, or its shell exits."""

from __future__ import annotations

import asyncio
import hashlib
import time

from otbuild.harness import protocol
from otbuild.harness.config import StepPlan, TrialContext, TrialThread
from otbuild.harness.endings import DONE, OUT_OF_EPISODES, SHELL_EXITED, TIMEOUT
from otbuild.harness.record import StepRun
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.harness.tools import ToolsTurns
from otbuild.harness.turns import Terminus2Turns
from otbuild.sandbox import SandboxError

SETTLE_SECONDS = 2.0  # wait for the first prompt


def request_seed(seed_key: str, turn: int) -> int:
    """The sampling seed of a trial's request `turn` for an engine that takes one per request
    (`seeds_requests`: otbuild's own models, whose sampling is then the same whichever trial asks
    first): from the run, the task, the sample and the turn alone."""
    return int(hashlib.sha256(f"{seed_key}:{turn}".encode()).hexdigest()[:8], 16)


async def run_agent(trial: TrialContext, step: StepPlan, run: StepRun, keep) -> str:
    """Turns on the step's instruction in the recipe's protocol (otbuild/harness/turns.py:
    terminus-2's JSON or native tool calls), recorded in `run.messages` and `run.completions`.
    Returns why they stopped; a context overflow raises ContextLengthExceededError. `keep`: the
    parked verifier, which ending the terminal leaves be. The agent's shell has the step's
    `agent_env`."""
    box, engine, thread, task, messages = trial.box, trial.engine, trial.thread, step.task, run.messages
    deadline = time.monotonic() + step.agent_timeout
    turns = make_protocol(trial.config.protocol, trial.config.prompt)
    term = await thread(_open_terminal, box, step.agent_env)
    try:
        screen = await thread(term.read, SETTLE_SECONDS)
        messages.extend(turns.first_messages(task.instruction, screen))
        if trial.slot is not None:  # the first request is ready: the trial's turn with the model
            with box.clock_paused():  # waiting is not the trial's time: nothing of it runs
                deadline += await trial.slot.agent()
        pending_complete = False
        for turn in range(trial.config.trials.max_episodes):
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            extra = turns.request()
            if getattr(engine, "needs_solution", False):  # the oracle reads the task's solution
                extra.update(task=task, style=getattr(turns, "style", None))
            if getattr(engine, "seeds_requests", False):
                extra["seed"] = request_seed(step.seed_key, turn)
            try:
                completion = await asyncio.wait_for(engine.complete(messages, **extra), left)
            except TimeoutError:
                return TIMEOUT
            run.completions.append(completion)
            messages.append(turns.assistant_message(completion))
            plan = turns.handle(completion)
            if plan.complete and pending_complete:
                return DONE
            for action in plan.actions:
                if action.commands is None:
                    messages.append(action.reply(None, True))
                    continue
                output = await _execute(term, action.commands, deadline, thread)
                alive = term.alive
                messages.append(action.reply(output, alive))
                if not alive:
                    return SHELL_EXITED
            if plan.complete is not None:
                pending_complete = plan.complete
        return OUT_OF_EPISODES
    finally:
        await thread(_close_terminal, box, term, keep)


def make_protocol(name: str, prompt: str) -> Terminus2Turns | ToolsTurns:
    """The turn protocol `name` (settings.recipe.PROTOCOLS) in prompt style `prompt`."""
    if name == "tools":
        return ToolsTurns()
    if name != "terminus2":
        raise ValueError(f"unknown harness protocol {name!r}; choose from terminus2, tools")
    return Terminus2Turns(protocol.prompt_style(prompt))


def _open_terminal(box, env: dict[str, str]) -> Terminal:
    try:
        term = Terminal(box.argv(["bash", "--noprofile", "--norc", "-i"], env={**env, **SHELL_ENV}, tty=True))
    except OSError as e:  # no pty or no fork left on the host
        raise SandboxError(f"could not start the agent's terminal: {e}") from e
    box.adopt(term.proc)  # kill_all ends it with its pid namespace: no /proc scan
    return term


def _close_terminal(box, term: Terminal, keep=None) -> None:
    """Everything the agent started ends with the terminal's namespace (kill_all), then the pty."""
    box.kill_all(keep=keep)
    term.close()


async def _execute(term: Terminal, commands: list[protocol.Command], deadline: float, thread: TrialThread) -> str:
    out = []
    for c in commands:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        term.send(c.keystrokes)
        out.append(await thread(term.read, min(c.duration, left)))
    if not commands:  # nothing to run: what the terminal already shows (as tmux would capture)
        out.append(term.read(0, False))
    return protocol.cap_output("".join(out))
