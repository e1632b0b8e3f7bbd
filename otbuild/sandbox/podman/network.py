"""The podman network of each phase of a trial, from task.toml's policy (`TaskConfig.agent_network`,
`.verifier_network`): `public` is podman's default network (or `OTBUILD_PODMAN_NETWORK`),
`no-network` none. An `allowlist` is refused (`NetworkPolicyError`, naming the task and its
hosts) rather than widened to the whole internet: a podman network cannot limit what its DNS and
routes reach.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from otbuild.sandbox.errors import SandboxError
from otbuild.tasks.task_toml import PUBLIC, NetworkPolicy, TaskConfig


class NetworkPolicyError(SandboxError):
    """The task asks for a network policy a podman trial cannot enforce (an allowlist): the
    trial is refused, never run with more network than the task allows."""


@dataclass(frozen=True)
class TrialNetworks:
    """The podman network of each phase of a trial: a network's name, or `none`."""

    agent: str
    verifier: str

    @property
    def started_on(self) -> str:
        """The container starts on the network a phase needs (a phase without one is then
        disconnected), or none when no phase needs one."""
        return self.agent if self.agent != "none" else self.verifier


def trial_networks(task: str, config: TaskConfig, network: str = "task") -> TrialNetworks:
    """The networks of a trial of `task` with this TaskConfig, under the recipe's
    `limits.network` (`none`: every phase offline). `public`: `OTBUILD_PODMAN_NETWORK` or
    podman's default network; `no-network` (or an allowlist of no hosts): none; an allowlist
    of hosts: NetworkPolicyError naming the task, the phase and the hosts."""
    if network == "none":
        return TrialNetworks("none", "none")
    public = os.environ.get("OTBUILD_PODMAN_NETWORK", "podman")

    def one(policy: NetworkPolicy, phase: str) -> str:
        if policy.offline:
            return "none"
        if policy.mode == PUBLIC:
            return public
        raise NetworkPolicyError(
            f"task {task!r}: its {phase} may reach only {', '.join(policy.allowed_hosts)} (network_mode = "
            '"allowlist"); a podman trial cannot enforce an allowlist and never widens it to the whole '
            "internet. Run it through Harbor on an environment that enforces allowlists (sandbox: harbor), "
            "or offline (limits.network: none)"
        )

    return TrialNetworks(one(config.agent_network, "agent"), one(config.verifier_network, "verifier"))
