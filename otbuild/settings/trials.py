"""The settings of agent trials, declared once for every section that runs them: the
teacher's rollouts, eval, and RL's rollouts (`rl.sandbox`). The harness takes them as
`TrialConfig(trials_of(section), prompt)` (otbuild/harness/config.py).

The limits section is built from the sandbox's own `Limits` (otbuild/settings/limits.py: the
sandbox is standard-library only, so its fields, bounds and descriptions are the one
definition and the recipe's model follows them).
"""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, create_model, field_validator, model_validator

from otbuild.settings.base import MAX_EPISODES, Sharded, Strict, execution_only
from otbuild.settings.limits import BACKENDS, Limits

HARBOR = "harbor"  # trials through Harbor's CLI (teacher and eval only): otbuild/harbor/


def _limits_section() -> type[Strict]:
    hints = typing.get_type_hints(Limits)
    spec: dict[str, Any] = {}
    for f in fields(Limits):
        if not f.metadata.get("recipe"):
            continue  # set by the harness, not by a recipe (wall_seconds)
        meta = {k: v for k, v in f.metadata.items() if k != "recipe"}
        declare = execution_only if meta.pop("execution_only", False) else Field
        spec[f.name] = (hints[f.name], declare(f.default, description=meta.pop("description") or None, **meta))
    return create_model("SandboxLimits", __base__=Strict, __doc__="Per-trial limits of the sandbox.", **spec)


if typing.TYPE_CHECKING:

    class SandboxLimits(Strict):
        """What the checker sees of the model built from `Limits` at import: its fields are Limits'."""

        def __getattr__(self, name: str) -> Any: ...
else:
    SandboxLimits = _limits_section()


# the Harbor agents otbuild runs and reads (otbuild.harbor.job.AGENTS)
HARBOR_AGENTS = ("oracle", "nop", "terminus-2", "mini-swe-agent")


class HarborBackend(Strict):
    """Tasks that need their container image run through Harbor's CLI (its own Python 3.12
    env: scripts/harbor-env.sh) in one of its environments; `otbuild` is our sandbox."""

    environment: str = Field(default="docker", description="docker, daytona, modal, ..., otbuild, or module:Class")
    agent: str | None = Field(
        default=None,
        description="oracle, nop, terminus-2 or mini-swe-agent; default: oracle for the oracle engine, else terminus-2",
    )
    agent_kwargs: dict[str, Any] = Field(default_factory=dict)
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("agent")
    @classmethod
    def _a_supported_agent(cls, agent: str | None) -> str | None:
        if agent is not None and agent not in HARBOR_AGENTS:
            raise ValueError(f"{agent!r} is not a Harbor agent otbuild runs and reads: {', '.join(HARBOR_AGENTS)}")
        return agent


# engines that answer from a script, not a model, and the Harbor agent that does the same
SCRIPTED = {"oracle": "oracle", "noop": "nop"}


def harbor_agent(agent: str | None, engine: str | None) -> str:
    """The Harbor agent a section runs: its `harbor.agent`, else Harbor's own for a scripted
    engine (oracle: oracle, noop: nop), else terminus-2."""
    return agent or SCRIPTED.get(engine or "", "terminus-2")


class Trials(Strict):
    """How each trial runs: its sandbox and limits, its turn budget and timeouts (paper:
    timeout = min(cap, the task's own x multiplier); 2 for 8B, 16 for 32B models). As Harbor:
    a task without `[agent] timeout_sec` has no agent limit of its own (so: the cap), and the
    verifier's (`[verifier] timeout_sec`, default 600 s) is scaled and capped alike."""

    sandbox: Literal[(*BACKENDS, HARBOR)] = Field(  # type: ignore[valid-type]
        default="bwrap", description="a local sandbox (docs/sandbox.md), or harbor: Harbor's CLI runs the trials"
    )
    limits: SandboxLimits = SandboxLimits()
    max_episodes: int = Field(default=50, ge=1, le=MAX_EPISODES, description="agent turns per trial")
    agent_timeout_sec: float | None = Field(default=None, gt=0, description="default: the task's own")
    timeout_multiplier: float = Field(default=1.0, gt=0)
    timeout_cap_sec: float = Field(default=7200, gt=0, description="effective = min(cap, task timeout x multiplier)")
    keep_reasoning: bool = Field(
        default=True,
        description="a reasoning parser's text stays in the traces, "
        "before the answer in <think>...</think> (as Harbor exports it)",
    )
    build_network: Literal["none", "public"] = execution_only(
        "none",
        description="podman: whether a task image's RUN lines may reach the network while it is built "
        "(they are the task's own commands, run on the host's podman; OT-Agent's Dockerfiles `apt-get install`: "
        "public); base images are pulled as limits.pull says either way",
    )
    host_env: tuple[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ...] = Field(
        default=(),
        description="host environment variables a task.toml's `${VAR}` may read (none by default: "
        "a task naming any other fails as HostEnvNotAllowed); with sandbox: harbor, the only ones Harbor gets "
        "beside its own (docs/security.md)",
    )


class RunHealth(Strict):
    """When a run of trials is broken however healthy its endpoint looked (docs/failures.md,
    "A broken run"): its trials average about one turn, every trial got the same reward, or one
    error ended most of them. Checked over the merged traces (otbuild/stagekit/run_health.py);
    the numbers go in the stage's stats either way."""

    on_broken: Literal["fail", "warn"] = Field(
        default="fail",
        description="fail: the stage fails naming the numbers; warn: it writes its artifact and "
        "records the warning. An eval's turns and rewards only warn (they measure the model under test)",
    )
    min_trials: int = Field(default=20, ge=1, description="a run of fewer trials is not judged (too few to tell)")
    max_mean_turns: float | None = Field(
        default=1.5, ge=0, description="trials averaging at most this many turns: broken (null: not checked)"
    )
    same_reward: bool = Field(
        default=True,
        description="every verified trial got the same reward: broken (an oracle passing every trial "
        "is what it should do)",
    )
    max_error_share: float | None = Field(
        default=0.5,
        gt=0,
        le=1,
        description="one error (by name) ended at least this share of the trials: broken (null: not checked)",
    )


class ShardedTrials(Trials, Sharded):
    """Trials of a stage of its own (teacher rollouts, eval): in shards that are separate
    Snakemake jobs, run by otbuild's harness or by Harbor's."""

    harbor: HarborBackend = HarborBackend()  # used with sandbox: harbor
    capture: bool = Field(
        default=True,
        description="every model call goes through a recording proxy: calls.parquet beside the traces "
        "holds each request and answer (token ids and log-probs where the server gives them; docs/engines.md)",
    )
    capture_logprobs: bool = Field(
        default=True,
        description="with capture, a vLLM otbuild started is asked for each answer token's log-prob besides "
        "the token ids; false: calls.parquet's logprobs are null and vLLM skips their work (docs/engines.md)",
    )
    infra_retries: int = execution_only(
        10,
        ge=0,
        le=100,
        description="reruns of a trial that failed for "
        "infrastructure reasons (docs/failures.md), waiting backoff_sec, doubling",
    )
    max_infra_failures: float = execution_only(
        0.05,
        ge=0,
        le=1,
        description="a shard with more infrastructure "
        "failures (a fraction of its trials, after retries) fails, naming them",
    )
    health: RunHealth = execution_only(
        RunHealth(), description="when the merged run is broken: one-turn trials, one reward, one error"
    )

    @model_validator(mode="after")
    def _reasoning_switch(self):
        if self.sandbox == HARBOR and not self.keep_reasoning:
            raise ValueError(
                "keep_reasoning: false applies to otbuild's own harness; with sandbox: "
                "harbor the traces are what Harbor exports (reasoning included)"
            )
        return self


def trials_of(section) -> Trials:
    """The trial settings of a teacher, eval or rl section (or of their stages' settings): the
    section itself, or rl's `sandbox`."""
    return section if isinstance(section, Trials) else section.sandbox


class PolicyTrials(Trials):
    """RL's trials (`rl.sandbox`): the policy answers in the training process, so they run in
    otbuild's harness, never through Harbor."""

    @model_validator(mode="after")
    def _local(self):
        if self.sandbox == HARBOR:
            raise ValueError(
                f"sandbox: harbor runs teacher and eval trials; rl's run in a local sandbox ({', '.join(BACKENDS)})"
            )
        return self
