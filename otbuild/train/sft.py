"""Full-parameter SFT through DeepSpeed, resumable; the checkpoint dir is the artifact.

outdir after a successful run:
  checkpoint.json          manifest, written last: files + sha256, base model, steps, tokens,
                           data policy stats, the settings, where each rank ran (node, GPUs)
                           (first output: feeds downstream)
  model.safetensors        the weights (one file), config.json, generation_config.json
  tokenizer.json, tokenizer_config.json, chat_template.jinja (what the tokenizer saves)
  train_log.jsonl          one line per optimizer step: step, epoch, loss, lr, grad_norm,
                           tokens (this step), tokens_per_second, tokens_seen,
                           supervised_tokens_seen, time
  events.out.tfevents.*    the same numbers for TensorBoard (`tracking`, otbuild/train/tracking.py)
while running (and after a kill): checkpoints/step-N/ (DeepSpeed: weights, optimizer,
scheduler, client state) + checkpoints/latest; tokenized/ (the training set, tokenized once by
rank 0 and memory-mapped by every rank: otbuild/train/tokenized.py); base_model/ (a built
tiny model). The loop around SFT's step (resume, the log, tracking, checkpoints, the final
save and manifest) is the one RL shares: otbuild/train/loop.py.

Loss: cross entropy summed over the supervised (assistant) tokens of a global batch, divided
by their count (token mean over the global batch, whatever the micro-batching). Logits are
computed only at supervised positions, in checkpointed chunks, so a 32K x 150K-vocab logit
tensor is never materialised.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

from otbuild.settings.stages import SftSettings
from otbuild.train.data import build as build_dataset
from otbuild.train.data import collate, global_batch_rows, steps_per_epoch
from otbuild.train.dist import client_adamw, ds_config, init_distributed, uses_client_optimizer
from otbuild.train.loop import Trainer, run
from otbuild.train.model import load_model, load_tokenizer, materialise
from otbuild.train.tokenized import TokenizedSet, build_tokenized_set, remove_tokenized_set

TOKENIZED = "tokenized"
LOSS_CHUNK = 4096  # supervised positions per lm_head chunk
COPY_BATCH, COPY_SPAN = 4, 20  # the copying objective: 4 rows of 20 random tokens, each repeated
COPY_TARGETS = COPY_BATCH * (COPY_SPAN - 1)  # the repeat less its first token, per row


def lr_lambda(kind: str, warmup: int, total: int):
    """transformers' schedules: linear warmup, then cosine / linear decay to 0, or constant."""

    def f(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return f


def _loss_module(model):
    import torch
    from torch.utils.checkpoint import checkpoint

    class CausalLMLoss(torch.nn.Module):
        """model -> summed CE over target positions (logits only where there is a target)."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, target_mask, attention_mask=None, position_ids=None):
            hidden = self.model.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state
            sel = target_mask[:, 1:]
            h = hidden[:, :-1][sel]
            y = input_ids[:, 1:][sel]
            total = hidden.new_zeros((), dtype=torch.float32)
            for a in range(0, len(y), LOSS_CHUNK):
                total = total + checkpoint(self._ce, h[a : a + LOSS_CHUNK], y[a : a + LOSS_CHUNK], use_reentrant=False)
            if not len(y):  # keep every parameter in the graph (ZeRO hooks expect it)
                total = total + hidden.sum() * 0.0
            return total

        def _ce(self, h, y):
            logits = self.model.lm_head(h).float()
            return torch.nn.functional.cross_entropy(logits, y, reduction="sum")

    return CausalLMLoss(model)


def copyable_tokens(tok):
    """The ids the copying objective draws from: every non-special token."""
    import torch

    special = set(tok.all_special_ids)
    return torch.tensor([i for i in range(len(tok)) if i not in special])


def copy_batch(tok, step: int, seed: int, rank: int, allowed=None) -> dict:
    """Rows of COPY_SPAN random (non-special) tokens followed by the same tokens again; the
    targets are the repeat. Deterministic in (seed, step, rank): a resumed run sees the same.
    `allowed`: copyable_tokens(tok), computed once by a training loop."""
    import torch

    allowed = copyable_tokens(tok) if allowed is None else allowed
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + rank)
    x = allowed[torch.randint(len(allowed), (COPY_BATCH, COPY_SPAN), generator=g)]
    ids = torch.cat([x, x], 1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, COPY_SPAN + 1 :] = True  # the first token of the repeat cannot be known yet
    return {"input_ids": ids, "target_mask": mask}


def train(cfg: SftSettings, inputs: list[Path], outdir: Path, *, log=print) -> dict:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    return run(SftTrainer(cfg, inputs, outdir, log), outdir, log)


class SftTrainer(Trainer):
    """SFT's part of the loop (otbuild/train/loop.py): the tokenized set, the model under
    DeepSpeed, and a step over one global batch."""

    kind = "sft"
    cfg: SftSettings

    def __init__(self, cfg: SftSettings, inputs: list[Path], outdir: Path, log):
        import torch

        on_gpu = torch.cuda.is_available()
        deepspeed = init_distributed(on_gpu)
        import torch.distributed as dist

        self.cfg, self.rank, self.world = cfg, dist.get_rank(), dist.get_world_size()
        self.t_start = time.monotonic()
        rank, world = self.rank, self.world

        spec = cfg.model
        self.base_dir, self.tokenized = outdir / "base_model", outdir / TOKENIZED
        if rank == 0:  # the tokenized set is built once, by one rank; every rank (and resume) reads it
            base = materialise(spec, self.base_dir, inputs, cfg.prompt)
            tok, template = load_tokenizer(base, spec.chat_template)
            build_tokenized_set(
                inputs,
                tok,
                template,
                cfg.cutoff_len,
                self.tokenized,
                truncation=cfg.truncation,
                train_on_prompt=cfg.train_on_prompt,
                prompt=cfg.prompt,
                workers=cfg.tokenize_workers,
                log=log,
            )
        dist.barrier()
        if rank:
            base = materialise(spec, self.base_dir, inputs, cfg.prompt)  # built by rank 0: found, not rebuilt
            tok, template = load_tokenizer(base, spec.chat_template)
        self.tok, self.template = tok, template
        seqs = TokenizedSet(self.tokenized)
        check_dropped(seqs.stats, cfg.max_dropped_fraction, inputs)
        self.ds = ds = build_dataset(
            seqs, cutoff_len=cfg.cutoff_len, packing=cfg.packing, token_budget=cfg.token_budget, seed=cfg.seed
        )
        if not len(ds):
            raise SftDataError(f"{', '.join(map(str, inputs))}: no trainable traces: {ds.stats}")

        global_batch, per_device = cfg.global_batch_size, cfg.per_device_batch_size
        client_opt = uses_client_optimizer(cfg, on_gpu)
        self.conf = conf = ds_config(
            cfg,
            global_batch=global_batch,
            per_device=per_device,
            world_size=world,
            on_gpu=on_gpu,
            client_optimizer=client_opt,
        )
        self.zero = conf["zero_optimization"]["stage"]
        self.accum = accum = conf["gradient_accumulation_steps"]
        self.per_epoch = steps_per_epoch(len(ds), global_batch)
        self.total_steps = (
            cfg.max_steps if cfg.max_steps is not None else max(1, math.ceil(cfg.epochs * self.per_epoch))
        )
        warmup = math.ceil(cfg.warmup_ratio * self.total_steps)

        dschf = None
        if self.zero == 3:
            from transformers.integrations import HfDeepSpeedConfig

            dschf = HfDeepSpeedConfig(conf)  # noqa: F841 - keeps zero.Init on while loading
        dtype = torch.bfloat16 if conf["bf16"]["enabled"] else torch.float32
        self.model = model = load_model(base, dtype=dtype)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.module = module = _loss_module(model)
        optimizer = client_adamw(module.parameters(), cfg) if client_opt else None
        sched = lr_lambda(cfg.lr_scheduler, warmup, self.total_steps)
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=module,
            model_parameters=None if client_opt else module.parameters(),
            optimizer=optimizer,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, sched),
            config=conf,
        )
        self.save_limit, self.keep_checkpoints = cfg.save_total_limit, cfg.keep_checkpoints
        log(
            f"sft: {len(ds)} rows, {ds.stats['tokens']} tokens, {self.total_steps} steps "
            f"({self.per_epoch}/epoch), world {world} x micro {per_device} x accum {accum} = {global_batch}, "
            f"zero {self.zero}, {'bf16' if conf['bf16']['enabled'] else 'fp32'}"
        )
        self.copyable = copyable_tokens(tok) if cfg.copy_loss_weight else None
        self.tokens_seen = self.sup_seen = 0
        self.t0 = time.monotonic()

    def restore(self, client: dict) -> None:
        self.tokens_seen, self.sup_seen = client["tokens_seen"], client["supervised_tokens_seen"]
        self.t0 = time.monotonic() - client["elapsed"]

    def client_state(self) -> dict:
        return {
            "tokens_seen": self.tokens_seen,
            "supervised_tokens_seen": self.sup_seen,
            "elapsed": time.monotonic() - self.t0,
        }

    def step(self, step: int) -> dict:
        import torch
        import torch.distributed as dist

        cfg, ds, engine, accum, world, rank = self.cfg, self.ds, self.engine, self.accum, self.world, self.rank
        per_device, copy_weight = cfg.per_device_batch_size, cfg.copy_loss_weight
        per_rank = per_device * accum
        t_step = time.monotonic()
        idx = global_batch_rows(len(ds), step, cfg.global_batch_size, cfg.seed)
        n_sup, n_tok = int(ds.supervised[idx].sum()), int(ds.tokens[idx].sum())
        mine = [ds.row(i) for i in idx[rank * per_rank : (rank + 1) * per_rank]]  # this rank's slice
        lr = self.scheduler.get_last_lr()[0]
        loss_sum, gn_local, copy_loss = 0.0, None, None
        for m in range(accum):
            batch = collate(mine[m * per_device : (m + 1) * per_device], self.tok.pad_token_id)
            batch.pop("n_tokens")
            batch = {k: v.to(engine.device) for k, v in batch.items()}
            total = engine(**batch)
            objective = total / max(n_sup, 1) * accum * world
            if copy_weight and m == 0:  # once per step and rank, averaged over ranks
                cb = copy_batch(self.tok, step, cfg.seed, rank, self.copyable)
                copy_loss = engine(**{k: v.to(engine.device) for k, v in cb.items()}) / COPY_TARGETS
                objective = objective + copy_weight * copy_loss * accum
            engine.backward(objective)
            if m == accum - 1 and self.zero == 0:
                grads = [p.grad.float().norm() for p in self.module.parameters() if p.grad is not None]
                gn_local = float(torch.stack(grads).norm()) if grads else 0.0
            engine.step()
            loss_sum += float(total.detach())
        if world > 1:
            t = torch.tensor([loss_sum], dtype=torch.float64, device=engine.device)
            dist.all_reduce(t)
            loss_sum = float(t.item())
        self.tokens_seen += n_tok
        self.sup_seen += n_sup
        gn = engine.get_global_grad_norm()
        if gn is None and self.zero == 0:
            gn = gn_local  # before clipping, as DeepSpeed reports it for ZeRO
        rec = {
            "step": step + 1,
            "epoch": round((step + 1) / self.per_epoch, 4),
            "loss": loss_sum / max(n_sup, 1),
            "lr": lr,
            "grad_norm": None if gn is None else float(gn),
            "tokens": n_tok,
            "tokens_per_second": round(n_tok / max(time.monotonic() - t_step, 1e-9), 1),
            "supervised_tokens": n_sup,
            "tokens_seen": self.tokens_seen,
            "supervised_tokens_seen": self.sup_seen,
            "time": round(time.monotonic() - self.t0, 3),
        }
        if copy_loss is not None:
            rec["copy_loss"] = float(copy_loss.detach())
        return rec

    def note(self, rec: dict) -> str:
        return f"loss {rec['loss']:.4g}"

    def weights(self):
        self.train_time = time.monotonic() - self.t0
        state = (
            self.engine._zero3_consolidated_16bit_state_dict() if self.zero == 3 else self.engine.module.state_dict()
        )
        if self.rank == 0:
            state = {k.removeprefix("model."): v for k, v in state.items()}
        return self.model, self.tok, state

    def finish(self, outdir: Path) -> dict:
        cfg = self.cfg
        if cfg.model.kind == "tiny":
            shutil.rmtree(self.base_dir, ignore_errors=True)
        remove_tokenized_set(self.tokenized)
        return {
            "base_model": cfg.model.model_dump(mode="json"),
            "chat_template": self.template,
            "total_steps": self.total_steps,
            "steps_per_epoch": self.per_epoch,
            "epochs": cfg.epochs,
            "gradient_accumulation_steps": self.accum,
            "global_batch_size": cfg.global_batch_size,
            "tokens_seen": self.tokens_seen,
            "supervised_tokens_seen": self.sup_seen,
            "train_seconds": round(self.train_time, 3),
            "wall_seconds": round(time.monotonic() - self.t_start, 3),
            "data": self.ds.stats,
            "deepspeed": self.conf,
        }


class SftDataError(ValueError):
    """The trace set cannot be trained on as configured (a failed build, exit code 1)."""


def check_dropped(stats: dict, max_fraction: float, inputs) -> None:
    """Fail when more than `max_fraction` of the traces were dropped, naming the reasons."""
    dropped = {k: v for k, v in stats["dropped"].items() if v}
    n = sum(dropped.values())
    if n and n > max_fraction * stats["traces"]:
        hint = (
            " (the model's own chat template rewrites assistant turns: Qwen3's strips the reasoning "
            "before the last user message; set sft.model.chat_template: qwen3_thinking to keep it "
            "in every turn, or qwen3 to train without it)"
            if dropped.get("template_mismatch")
            else ""
        )
        raise SftDataError(
            f"{', '.join(map(str, inputs))}: {n} of {stats['traces']} traces dropped "
            f"({n / stats['traces']:.1%}), more than sft.max_dropped_fraction {max_fraction}: "
            + ", ".join(f"{k}: {v}" for k, v in dropped.items())
            + hint
        )
