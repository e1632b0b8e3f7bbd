"""The policy being trained as an Engine for the harness: sampled in process with transformers
(`PolicyEngine`) or by the vLLM server it is synced to (`ServedPolicyEngine`), each trial's
turns recorded as token ids with their sampling log-probs; and the copy of it that vLLM serves."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from otbuild.engines.base import Completion, ContextLengthExceededError
from otbuild.engines.toolcalls import parse_tool_calls
from otbuild.fsio import write_json
from otbuild.train.chat import clean
from otbuild.train.rl.loss import TokenSequence, Turn, token_logprobs


class Policy:
    """The model being trained, shared by every rollout of a step (generation is serialised)."""

    def __init__(
        self, model, tokenizer, *, temperature: float, max_tokens: int, max_context: int, name: str = "policy"
    ):
        self.model, self.tok = model, tokenizer
        self.temperature, self.max_tokens, self.max_context = temperature, max_tokens, max_context
        self.name = name
        self.lock = threading.Lock()

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt as the chat template renders it, with the offered `tools` (and earlier tool
        calls, arguments as objects: otbuild/train/chat.py `clean`), as SFT and vLLM render it."""
        text = self.tok.apply_chat_template(clean(messages), tools=tools, tokenize=False, add_generation_prompt=True)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def answer(self, ids: list[int], tools: list[dict] | None) -> tuple[str, list[dict] | None]:
        """(text, tool_calls) of sampled tokens: offered tools, the `<tool_call>` blocks read as
        vLLM's hermes parser reads them (the text before them the content; its markers are
        special tokens of a tiny student, so kept in the decoded text); else the text alone."""
        if not tools:
            return self.tok.decode(ids, skip_special_tokens=True), None
        text = self.tok.decode([t for t in ids if t != self.tok.eos_token_id], skip_special_tokens=False)
        content, calls = parse_tool_calls(text)
        return content or "", calls

    def sample(self, prompt_ids: list[int], seed: int | None = None) -> tuple[list[int], list[float]]:
        """Sampled answer tokens and their log-probs under the sampling distribution (logits /
        temperature); with `seed` (the harness's per request), the same whichever of the step's
        concurrent trials asks first (the trainer's own RNG state is left as it was)."""
        import torch

        budget = min(self.max_tokens, self.max_context - len(prompt_ids))
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with self.lock, torch.no_grad(), torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            was_training = self.model.training
            self.model.eval()
            x = torch.tensor([prompt_ids], device=self.model.device)
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=self.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=budget,
                eos_token_id=self.tok.eos_token_id,
                pad_token_id=self.tok.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            self.model.train(was_training)
        ids = out.sequences[0, len(prompt_ids) :]
        scores = torch.stack(out.scores[: len(ids)])[:, 0].float()  # the sampling step's logits / temperature
        logprobs = torch.log_softmax(scores, -1).gather(-1, ids[:, None])[:, 0]
        return ids.tolist(), logprobs.tolist()

    def session(self, server=None):
        return PolicyEngine(self) if server is None else ServedPolicyEngine(self, server)


class PolicyEngine:
    """One trial's view of the policy: an Engine that records its turns."""

    name = "policy"
    provider = "otbuild"
    seeds_requests = True
    takes_tools = True  # renders the offered tools, reads its answer's <tool_call> blocks (hermes)

    def __init__(self, policy: Policy):
        self.policy = policy
        self.model = policy.name
        self.turns: list[Turn] = []

    async def complete(
        self, messages: list[dict], seed: int | None = None, tools: list[dict] | None = None, **_
    ) -> Completion:
        p = self.policy
        prompt = p.prompt_ids(messages, tools)
        if len(prompt) >= p.max_context:
            raise ContextLengthExceededError(f"prompt of {len(prompt)} tokens >= max_context {p.max_context}")
        ids, logprobs = await asyncio.to_thread(p.sample, prompt, seed)
        self.turns.append(Turn(prompt, ids, logprobs))
        stopped = bool(ids) and ids[-1] == p.tok.eos_token_id
        text, calls = p.answer(ids, tools)
        finish = "tool_calls" if calls else "stop" if stopped else "length"  # as vLLM's
        return Completion(text, len(prompt), len(ids), finish, tool_calls=calls)

    async def aclose(self) -> None:
        pass


class ServedPolicyEngine(PolicyEngine):
    """One trial's view of the policy served by vLLM (rollout: vllm): each turn trains on the
    token ids the server saw and sampled: the prompt as it tokenized it (its chat template, the
    tools it was offered) and the answer with its sampling log-probs (vLLM's `return_token_ids`
    and `logprobs`; the server runs with `logprobs_mode: processed_logprobs`, after
    temperature, as the trainer computes them). A turn whose prompt the trainer's own render
    differs from is a train-serve mismatch: counted (`prompt_mismatches`), trained on as served.
    A server that gives no prompt ids leaves the trainer's render."""

    provider = "hosted_vllm"
    seeds_requests = False  # vLLM samples as it batches (docs/reproducibility.md)

    def __init__(self, policy: Policy, server):
        super().__init__(policy)
        self.server = server
        self.prompt_mismatches = 0  # turns whose served prompt is not the trainer's render
        self.served_prompts = 0  # turns whose prompt ids the server gave

    async def complete(
        self, messages: list[dict], seed: int | None = None, tools: list[dict] | None = None, **_
    ) -> Completion:  # seed: unused
        p = self.policy
        prompt = p.prompt_ids(messages, tools)
        if len(prompt) >= p.max_context:
            raise ContextLengthExceededError(f"prompt of {len(prompt)} tokens >= max_context {p.max_context}")
        c = await self.server.complete(
            messages,
            temperature=p.temperature,
            logprobs=True,
            return_token_ids=True,
            max_tokens=min(p.max_tokens, p.max_context - len(prompt)),
            **({"tools": tools} if tools else {}),  # read back by the server's tool-call parser (vllm_args)
        )
        ids, logprobs = c.token_ids, c.logprobs
        if ids is None or logprobs is None or len(ids) != len(logprobs):  # not vLLM's answer: re-tokenised
            ids, logprobs = p.tok(c.text, add_special_tokens=False)["input_ids"], None
            if c.finish_reason == "stop":
                ids.append(p.tok.eos_token_id)
        if c.prompt_token_ids is not None:
            self.served_prompts += 1
            if list(c.prompt_token_ids) != prompt:
                self.prompt_mismatches += 1
                prompt = list(c.prompt_token_ids)
        self.turns.append(Turn(prompt, list(ids), logprobs))
        if c.usage_reported:  # the tokens the server counted (its `usage`), for the stage's usage
            return Completion(c.text, c.n_input_tokens, c.n_output_tokens, c.finish_reason, tool_calls=c.tool_calls)
        return Completion(c.text, len(prompt), len(ids), c.finish_reason, tool_calls=c.tool_calls)


def sequence_logprob(model, tokenizer, messages: list[dict], answer: str) -> float:
    """log p(answer + end-of-turn | messages) under `model` (temperature 1): for tests/evals."""
    import torch

    policy = Policy(model, tokenizer, temperature=1.0, max_tokens=1, max_context=10**9)
    prompt = policy.prompt_ids(messages)
    ans = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        lp = token_logprobs(
            model, [TokenSequence(prompt + ans, [False] * len(prompt) + [True] * len(ans))], 1.0, tokenizer.pad_token_id
        )
    return float(lp[0].sum())


def save_served_copy(policy: Policy, dest: Path) -> None:
    """The policy as vLLM serves it: its weights in one safetensors file, its config and
    tokenizer. Untied (the output embedding saved as its own `lm_head.weight`, the config saying
    so): vLLM 0.32 reloads a tied model's embedding in place but leaves its output head at the
    old weights, so a tied copy would serve weights no trainer ever had."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    model = policy.model
    with torch.no_grad():
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state["lm_head.weight"] = model.get_input_embeddings().weight.detach().to("cpu").clone()
    tmp = dest / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(dest / "model.safetensors")
    config = model.config.to_dict()
    config["tie_word_embeddings"] = False
    write_json(dest / "config.json", config)
    if not (dest / "tokenizer_config.json").exists():
        policy.tok.save_pretrained(dest)
