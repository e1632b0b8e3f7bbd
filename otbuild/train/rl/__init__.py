"""RLOO for multi-turn agents: rollouts through the terminus-2 harness, verifier rewards.
Its parts: `loss` (the math), `policy` (the model as the harness's engine), `server` (the
vLLM server of `rollout: vllm`), `trainer` (the step and the run; `train` is the entry).

One step:
1. `batch_size` tasks (a seeded order per pass over the task table), `samples_per_task` = k
   trials each, run by `run_trial` in the sandbox with the current policy. The policy is an
   Engine (`PolicyEngine`) over the model being trained: it renders the chat, samples in
   process with transformers, and records each turn's exact prompt and completion token ids
   (no re-tokenisation of what the model said).
2. Reward: the verifier's (no reward counts as 0). A trial whose outcome eval leaves out of
   its scores (infrastructure, not_run: docs/failures.md) is masked: reward 0 in the log,
   counted as `rollout_infra_masked`, left out of its task's baseline and of the loss.
   Advantage (per task, over its unmasked samples): A_i = (r_i - mean_{j != i} r_j) /
   (std_j r_j + eps), std with Bessel's correction; a task whose rewards are all equal, or
   with fewer than 2 unmasked samples, contributes zero.
3. Loss: PPO-clip over assistant tokens only (the recorded completions), ratio
   exp(logp - logp_old) clipped to [1 - clip_low, 1 + clip_high], advantage shared by every
   token of a trajectory, token-mean over all assistant tokens of the step; optional k3 KL to
   the starting model (kl_coef, 0 by default). log-probs use logits / temperature (the
   sampling distribution). logp_old is the policy before the step's update (recomputed here,
   as with a separate rollout engine), so with ppo_epochs 1 the ratio starts at 1.
4. AdamW (lr 5e-6), grad clipping; one line per step in train_log.jsonl (reward, loss, ...),
   also written to TensorBoard event files and a wandb run (`tracking`: otbuild/train/tracking.py);
   checkpoints/step-N (DeepSpeed's: weights, optimizer) every save_steps; a killed run resumes
   from the last one (the loop SFT shares: otbuild/train/loop.py).

Scale-out: one process per GPU (otbuild.train.dist.launch_command: srun + torchrun over the
Slurm allocation), DeepSpeed data parallel with ZeRO 0-2 and bf16 on GPU. Each rank holds a
whole replica of the policy, rolls out its share of the step's tasks (whole tasks: a task's k
samples share their baseline), and the update sums the ranks' gradients (`update`).

A trajectory's turns are joined into one sequence when each prompt extends the previous
prompt + completion token for token (the usual case); otherwise they are separate sequences.

Rollouts on vLLM (`rollout: vllm`, one trainer process): the step's policy is saved and
served (docs/training.md, "Weight sync").
"""
