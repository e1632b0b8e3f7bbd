"""Training: SFT (DeepSpeed, resumable) and RLOO (multi-turn, through the harness).

Modules: chat (templates, assistant mask), data (truncation, token budget, packing, batches),
model (the tiny student / a pretrained dir), dist (DeepSpeed config, launchers), loop (the
training loop SFT and RL share; each plugs in its step), sft, rl,
export (LLaMA-Factory sharegpt). CLI: `python -m otbuild.train {sft,rl,export-llamafactory}`.
Heavy imports (torch, deepspeed, transformers) happen inside functions.
"""
