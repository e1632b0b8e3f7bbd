"""Recipe sections of the training stages: `sft` and `rl` (and the `ModelSpec` they start from).

Defaults are the paper's (OT-Agent, "Data Recipes for Agentic Models": full-parameter SFT of
Qwen3-8B/32B, lr 4e-5 cosine, warmup 0.1, global batch 96, 32K context, DeepSpeed ZeRO-3, qwen3
template; RLOO with PPO clip 0.2/0.2, no KL, AdamW lr 5e-6, batch 64, 8 samples, temperature
0.7), so the otagent_v2_* recipes only name the base model. CPU recipes (smoke) set a `tiny`
model and small numbers. Execution knobs that do not change what is produced
(`save_steps`, `concurrency`, `launcher`, ...) are `execution_only`: not part of the content
id (otbuild/settings/identity.py); see docs/training.md.

What the stages consume and produce (otbuild/stages/sft.py, otbuild/stages/rl.py):
  sft: inputs [kept.parquet of trace_filter]             -> checkpoint dir (checkpoint.json first)
  rl:  inputs [sft's checkpoint.json, a task parquet]    -> checkpoint dir (checkpoint.json first)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from otbuild.settings.base import Strict, engine_args, execution_only
from otbuild.settings.trials import PolicyTrials

ChatTemplate = Literal["auto", "qwen3", "qwen3_thinking"]
CHAT_TEMPLATE: ChatTemplate = Field(
    default="auto",
    description="qwen3_thinking: every assistant turn keeps its <think> reasoning (the "
    "paper's 32B); qwen3: reasoning removed before training (its 8B); auto: the model's own template "
    "when it has one (it must render assistant turns verbatim: Qwen3's own strips earlier reasoning), "
    "else qwen3_thinking",
)


# Attention head widths both of vLLM's attention paths serve: its CPU backend's
# (`CPUAttentionBackend.get_supported_head_sizes`, vLLM 0.32) within FlashAttention's (multiples
# of 8 up to 256 on a GPU). The tiny student is built with one of them, so the checkpoints
# otbuild trains load in `vllm serve` as they are (tests/engines/test_vllm_live.py).
VLLM_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class TinyModel(Strict):
    """A Qwen3-architecture model built from scratch: a byte-level BPE tokenizer trained
    deterministically on a bounded sample of the trace set, with the qwen3 chat template's
    special tokens. No download, ever (the embedded default student)."""

    kind: Literal["tiny"]
    vocab_size: int = Field(default=1024, ge=300, description="BPE target (256 bytes + merges + specials)")
    tokenizer: Literal["bytelevel", "names"] = Field(
        default="bytelevel",
        description="names: spaces, punctuation and digits isolated before BPE, "
        "so a name is the same tokens wherever it appears (students that must copy names)",
    )
    hidden_size: int = Field(default=64, ge=8)
    intermediate_size: int = Field(default=128, ge=8)
    num_hidden_layers: int = Field(default=2, ge=1)
    num_attention_heads: int = Field(default=4, ge=1)
    num_key_value_heads: int = Field(default=2, ge=1)
    head_dim: int = Field(
        default=32,
        description=f"each attention head's width: one of {VLLM_HEAD_DIMS} "
        "(what vLLM serves on CPU and GPU); need not be hidden_size / num_attention_heads",
    )
    max_position_embeddings: int = Field(default=4096, ge=64)
    seed: int = 0
    chat_template: ChatTemplate = CHAT_TEMPLATE

    @model_validator(mode="after")
    def _heads(self):
        if self.head_dim not in VLLM_HEAD_DIMS:
            widths = ", ".join(map(str, VLLM_HEAD_DIMS))
            raise ValueError(
                f"head_dim {self.head_dim}: vLLM serves heads of width {widths} "
                "only (its CPU build refuses the others at the first request)"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self


class PretrainedModel(Strict):
    """A model dir on disk (or an HF id already in the local HF cache: otbuild never downloads).
    Its own chat template is used when it has one, else otbuild's qwen3 one (`chat_template`)."""

    kind: Literal["pretrained"]
    path: str = Field(min_length=1, description="model dir (relative to the project root) or HF id")
    chat_template: ChatTemplate = CHAT_TEMPLATE


ModelSpec = Annotated[TinyModel | PretrainedModel, Field(discriminator="kind")]


class WandbTracking(Strict):
    """A wandb run per training stage (needs the `wandb` package; its id: the stage and content id)."""

    project: str = Field(min_length=1)
    entity: str | None = None
    name: str | None = Field(default=None, description="default: STAGE-CONTENT_ID")
    tags: tuple[str, ...] = ()
    mode: Literal["online", "offline", "disabled"] | None = Field(
        default=None, description="default: WANDB_MODE, else online"
    )
    dir: str | None = Field(default=None, description="its files go to DIR/wandb/ (default: the checkpoint dir)")


class Tracking(Strict):
    """Where the per-step numbers of train_log.jsonl also go (otbuild/train/tracking.py)."""

    tensorboard: bool = Field(default=True, description="event files at the top of the checkpoint dir")
    wandb: WandbTracking | None = None


class Launch(Strict):
    """How a training stage starts its processes: one per GPU across the nodes Slurm grants."""

    launcher: Literal["auto", "local", "torchrun", "deepspeed"] = execution_only("auto")
    gpus_per_node: int | None = execution_only(None, ge=1, description="default: what Slurm grants")
    master_port: int = execution_only(29500, ge=1024, le=65535)
    tracking: Tracking = execution_only(Tracking(), description="TensorBoard event files, a wandb run")


class Training(Launch):
    """What SFT and RL train with alike: AdamW (torch's, or DeepSpeed's on GPU), gradient
    clipping, precision, the seed. Each declares its own learning rate and ZeRO stage."""

    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    precision: Literal["auto", "bf16", "fp32"] = Field(default="auto", description="auto: bf16 on GPU")
    optimizer: Literal["auto", "torch", "deepspeed"] = Field(
        default="auto", description="auto: DeepSpeed's fused Adam on GPU, torch AdamW on CPU"
    )
    seed: int = 0


class Sft(Training):
    """Full-parameter SFT through DeepSpeed on the filtered traces (loss on assistant tokens)."""

    model: ModelSpec
    # optimisation: the paper's settings
    learning_rate: float = Field(default=4e-5, gt=0)
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    global_batch_size: int = Field(default=96, ge=1, description="sequences per optimizer step")
    per_device_batch_size: int = Field(default=1, ge=1)
    epochs: float = Field(default=5.0, gt=0, description="paper: 5-7")
    max_steps: int | None = Field(
        default=None, ge=0, description="optimizer steps, overriding epochs (0: the untrained base model)"
    )
    # data
    cutoff_len: int = Field(default=32768, ge=16, description="tokens per sequence (32K context)")
    truncation: Literal["right", "drop"] = Field(
        default="right", description="right: keep the first cutoff_len tokens; drop: skip the trace"
    )
    max_dropped_fraction: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="fail when more of the traces are dropped (template "
        "mismatch, too long, nothing supervised); the counts per reason are in the provenance",
    )
    packing: bool = False
    copy_loss_weight: float = Field(
        default=0.0,
        ge=0,
        description="tiny students: weight of an auxiliary copying objective (random "
        "token strings, repeated) added to every step; it installs the induction heads a model trained "
        "from scratch lacks, so names are copied from the instruction into commands",
    )
    train_on_prompt: bool = Field(
        default=False,
        description="loss on every token, not only the assistant's (tiny students: the "
        "terminal's echo of each command teaches copying)",
    )
    token_budget: int | None = Field(
        default=None, ge=1, description="compute-controlled ablations: train on this many tokens"
    )
    # execution
    zero_stage: Literal[0, 1, 2, 3] = 3
    gradient_checkpointing: bool = True
    tokenize_workers: Annotated[int, Field(ge=1)] | Literal["auto"] = execution_only(
        "auto",
        description="processes rank 0 tokenizes the traces in, a batch of OTBUILD_TOKENIZE_BATCH "
        "traces each, at most 2 batches per worker in memory (auto: one per CPU the job grants it); the "
        "tokenized set is the same whatever the count",
    )
    save_steps: int = execution_only(100, ge=1, description="resumable checkpoint every N steps")
    save_total_limit: int = execution_only(1, ge=1)
    keep_checkpoints: bool = execution_only(False, description="keep checkpoints/ after the final save")

    @model_validator(mode="after")
    def _batches(self):
        if self.global_batch_size % self.per_device_batch_size:
            raise ValueError(
                f"global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"per_device_batch_size ({self.per_device_batch_size})"
            )
        if self.packing and self.per_device_batch_size != 1:
            raise ValueError("packing fills a whole row per device: set per_device_batch_size: 1")
        return self


class SkyrlOptions(Strict):
    """`rl.trainer: skyrl` only (otbuild/train/skyrl.py; docs/training.md, "RL through SkyRL")."""

    environment: str = Field(
        default="docker", description="Harbor environment type of SkyRL's trials (docker, daytona, modal, ...)"
    )
    max_staleness_steps: int = Field(
        default=16, ge=0, description="fully async: steps a rollout's policy may lag the one it trains (OT-Agent: 16)"
    )
    overrides: dict[str, Any] = Field(
        default={},
        description="more SkyRL config, as dot keys (trainer.policy.fsdp_config.cpu_offload: true); they win",
    )


class Rl(Training):
    """RLOO on the SFT checkpoint: multi-turn rollouts in the terminus-2 harness, verifier reward.
    Every rank (one per GPU) rolls out its share of a step's tasks with its replica of the
    policy; the update is DeepSpeed data parallel (ZeRO 0-2: every rank keeps whole weights)."""

    trainer: Literal["otbuild", "skyrl"] = Field(
        default="otbuild",
        description="otbuild: this trainer (one node); skyrl: SkyRL's fully async trainer "
        "on Ray across the job's nodes (docs/training.md)",
    )
    skyrl: SkyrlOptions = SkyrlOptions()
    steps: int = Field(ge=1, description="optimizer steps (each: batch_size tasks x samples_per_task)")
    batch_size: int = Field(default=64, ge=1, description="tasks per step")
    samples_per_task: int = Field(default=8, ge=2, description="k: the leave-one-out baseline needs 2+")
    skip_bands: list[Literal["impossible", "very_hard", "hard", "medium", "easy", "trivial"]] = Field(
        default=["trivial", "impossible"],
        description="where the tasks have a `band` column (the difficulty stage's), leave out those bands: "
        "a task every sample passes, or none does, gives its RLOO group zero advantage (tasks without a band stay)",
    )
    temperature: float = Field(default=0.7, gt=0)
    max_tokens: int = Field(default=4096, ge=1, description="per assistant turn")
    max_context: int = Field(default=32768, ge=64, description="a turn whose prompt is longer ends the trial")
    learning_rate: float = Field(default=5e-6, gt=0)
    clip_low: float = Field(default=0.2, ge=0)
    clip_high: float = Field(default=0.2, ge=0)
    kl_coef: float = Field(default=0.0, ge=0, description="k3 estimator against the SFT model; paper: 0")
    std_eps: float = Field(default=1e-6, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="steps whose rollouts may run ahead of the update, on weights at most this "
        "many updates old (their ratio taken against the log-probs that sampled them); 0: synchronous. "
        "rollout: vllm runs at most 1 ahead (its server holds one version)",
    )
    micro_batch_tokens: int = Field(default=16384, ge=64, description="tokens per forward/backward")
    zero_stage: Literal[0, 1, 2] = 2
    rollout: Literal["transformers", "vllm", "auto"] = Field(
        default="transformers",
        description="transformers: in process (CPU/1 GPU); vllm: one server for the run; "
        "auto: vllm where it is installed, else transformers (decided by the job)",
    )
    vllm_args: dict[str, Any] = engine_args(
        of="rollout", description="rollout: vllm: vllm serve settings (tensor_parallel_size, ...)"
    )
    weight_sync: Literal["reload", "restart"] = execution_only(
        "reload",
        description="rollout: vllm: how each step's policy reaches the one live server: reloaded "
        "in place (generation paused across it) or served by a new server per step",
    )
    sandbox: PolicyTrials = Field(default=PolicyTrials(), description="the rollouts' trial settings, as the teacher's")
    concurrency: int = execution_only(8, ge=1)
    save_steps: int = execution_only(10, ge=1)
