"""The vLLM server of `rollout: vllm`: one for the whole run, synced to each step's weights."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from otbuild.settings.stages import RlSettings
from otbuild.train.rl.policy import Policy, save_served_copy

if TYPE_CHECKING:
    from otbuild.engines.process import ServerProcess


class PolicyServer:
    """rollout: vllm. One `vllm serve` for the whole run, on a copy of the policy saved in
    `workroot/policy` (tensor/data parallel and the rest from `vllm_args`). `sync(policy,
    version)` before each step's rollouts moves the current weights into it: saved over the
    copy, then reloaded in place while generation is paused (`weight_sync: reload`, vLLM's
    collective RPC: otbuild/engines/vllm.py), or served by a new server (`restart`, and
    whenever the server is gone). Trials ask it through `client()`; `version` is the optimizer
    step whose weights it serves. It listens on no TCP port, as its development endpoints
    (/collective_rpc, /pause) take no API key: on a unix socket in a folder only this user may
    enter (`server.uds`), which its clients here talk over. It takes requests with this run's own
    key only, too (`VLLM_API_KEY`, in its environment, never on its command line), which vLLM
    checks on its /v1 routes alone (docs/security.md)."""

    def __init__(self, cfg: RlSettings, workroot: Path):
        import secrets

        from otbuild.engines import LLM
        from otbuild.engines.vllm import WEIGHT_SYNC_ENV

        self.key = secrets.token_urlsafe(32)
        self.cfg, self.dir = cfg, workroot / "policy"
        args = dict(cfg.vllm_args)
        if cfg.protocol == "tools":  # the trials offer tools: the server reads the policy's calls (Qwen3's format)
            args = {"tool_call_parser": "hermes", **args, "enable_auto_tool_choice": True}
        # log-probs after temperature, as the trainer computes them (the behaviour policy's)
        self.llm = LLM(
            engine="vllm",
            model=str(self.dir),
            concurrency=cfg.concurrency,
            engine_args={
                "served_model_name": "policy",
                "logprobs_mode": "processed_logprobs",
                **args,
                "env": {**args.get("env", {}), **WEIGHT_SYNC_ENV, "VLLM_API_KEY": self.key},
            },
        )
        self.base_url: str | None = None
        self.server: ServerProcess | None = None
        self.version: int | None = None
        self.release: str | None = None

    def sync(self, policy: Policy, version: int) -> str:
        """Serve `policy`'s weights as `version`; how they got there: reload or start."""
        from otbuild.engines.managed import server_version
        from otbuild.engines.vllm import VLLMEngine, reload_weights

        save_served_copy(policy, self.dir)
        if self.server is not None and self.server.exit_code() is None and self.cfg.weight_sync == "reload":
            reload_weights(
                cast(str, self.base_url).removesuffix("/v1"), str(self.dir), key=self.key, uds=self.server.uds
            )
            how = "reload"
        else:
            self.stop()
            self.base_url, self.server = VLLMEngine(self.llm)._launch(private=True)
            self.release = server_version(self.base_url.removesuffix("/v1"), self.server.uds)
            how = "start"
        self.version = version
        return how

    def client(self):
        """An engine over the live server for one event loop (a step's rollouts)."""
        from otbuild.engines.managed import ServerDiedError
        from otbuild.engines.openai import OpenAIEngine
        from otbuild.settings.engines import client_settings

        server = cast("ServerProcess", self.server)

        def alive() -> None:
            if (why := server.gone()) is not None:
                raise ServerDiedError(why)

        return OpenAIEngine(
            client_settings(self.llm),
            base_url=self.base_url,
            api_key=self.key,
            name="vllm",
            provider="hosted_vllm",
            trust_env=False,
            alive=alive,
            uds=server.uds,
        )

    @property
    def engine(self) -> str:
        """What serves the rollouts, as the step log names it: "vllm RELEASE"."""
        return f"vllm {self.release}" if self.release else "vllm"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = self.base_url = None
