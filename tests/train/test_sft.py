"""SFT: assistant-only loss, templates, truncation/budget/packing policies, batch arithmetic,
DeepSpeed config and Slurm launch, the LLaMA-Factory export, the tiny student, the stage's
checkpoint dir, and resume after a real kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from otbuild.settings.train import Launch, TinyModel
from otbuild.settings.stages import SftSettings
from otbuild.traces.table import TRACE_SCHEMA, write_traces
from otbuild.train import data as D
from otbuild.train.chat import TemplateMismatch, tokenize_conversation
from otbuild.train.dist import (
    BatchSizeError,
    ds_config,
    expand_hostlist,
    grad_accum_steps,
    launch_command,
    outside_group,
)
from otbuild.train.tokenized import TokenizedSet, build_tokenized_set
from otbuild.train.toy import trace_rows, write_toy_traces

TINY = {
    "kind": "tiny",
    "vocab_size": 700,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
FAST = {
    "model": TINY,
    "learning_rate": 1e-3,
    "global_batch_size": 4,
    "per_device_batch_size": 2,
    "epochs": 1,
    "cutoff_len": 512,
    "zero_stage": 0,
    "gradient_checkpointing": False,
    "save_steps": 1000,
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    return write_toy_traces(tmp_path_factory.mktemp("traces") / "kept.parquet", 12, full_prompt=False)


@pytest.fixture(scope="module")
def tok(traces, tmp_path_factory):
    from otbuild.train.model import load_tokenizer, materialise

    base = materialise(TinyModel(**TINY), tmp_path_factory.mktemp("tiny") / "m", traces)
    return load_tokenizer(base)[0]


def _trace_set(dest: Path, convs) -> Path:
    """A trace parquet holding these conversations."""
    rows = []
    for i, conv in enumerate(convs):
        row = dict.fromkeys(TRACE_SCHEMA.names)
        row.update(conversations=conv, task=f"t{i}", trial_name=f"t-{i}", sample_idx=0)
        rows.append(row)
    write_traces(dest, rows)
    return dest


def _tokenized(tmp_path: Path, tok, traces: Path, cutoff_len: int = 4096, template: str = "auto", **kw):
    out = tmp_path / f"tokenized-{cutoff_len}-{template}-{'-'.join(f'{k}{v}' for k, v in kw.items())}"
    build_tokenized_set(traces, tok, template, cutoff_len, out, **kw)
    return TokenizedSet(out)


def _build(tmp_path, tok, traces, cutoff_len=4096, truncation="right", **policy) -> D.Dataset:
    return D.build(
        _tokenized(tmp_path, tok, traces, cutoff_len, truncation=truncation), cutoff_len=cutoff_len, **policy
    )


# -- the loss mask --------------------------------------------------------------------------
CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "list the files"},
    {"role": "assistant", "content": '{"commands": [{"keystrokes": "ls\\n"}]}'},
    {"role": "tool", "content": "a.txt b.txt"},
    {"role": "user", "content": "now count them"},
    {"role": "assistant", "content": "2"},
]


def test_only_assistant_tokens_carry_loss(tok):
    ids, mask = tokenize_conversation(tok, CONV)
    assert tok.decode(ids[mask]) == '{"commands": [{"keystrokes": "ls\\n"}]}<|im_end|>2<|im_end|>'
    unsupervised = tok.decode(ids[~mask])
    for m in CONV:
        if m["role"] != "assistant":
            assert m["content"] in unsupervised  # system, user and tool text: no loss
    assert "<tool_response>" in unsupervised and "<|im_start|>assistant" in unsupervised
    # the collated batch keeps exactly that mask; padding carries none
    batch = D.collate([D.Row(ids, mask), D.Row(ids[:5], mask[:5])], tok.pad_token_id)
    assert batch["target_mask"][0].tolist() == mask.tolist() and not batch["target_mask"][1].any()


def test_model_template_preferred_else_qwen3(tok):
    from otbuild.train.chat import ensure_template, qwen3_template

    class Tok:
        chat_template = "{{ messages[0]['content'] }}"

    own = Tok()
    assert ensure_template(own) == "model" and own.chat_template == "{{ messages[0]['content'] }}"
    bare = Tok()
    bare.chat_template = None
    assert ensure_template(bare) == "qwen3_thinking" and bare.chat_template == qwen3_template()
    assert ensure_template(bare) == "qwen3_thinking"  # idempotent: otbuild's own is not "the model's"
    assert ensure_template(own, "qwen3") == "qwen3" and own.chat_template == qwen3_template()


def test_a_template_that_rewrites_assistant_text_is_a_mismatch(tmp_path, tok):
    from otbuild.train.model import load_tokenizer

    tok2 = load_tokenizer(Path(tok.name_or_path))[0]
    tok2.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(TemplateMismatch):
        tokenize_conversation(tok2, CONV)
    seqs = _tokenized(tmp_path, tok2, _trace_set(tmp_path / "one.parquet", [CONV]))
    assert seqs.stats["dropped"]["template_mismatch"] == 1 and not len(seqs)


# -- reasoning traces and Qwen3's templates (issue 14) ----------------------------------------
THINK = [
    {"role": "user", "content": "Count the files in /app."},
    {"role": "assistant", "content": '<think>I should list them first.</think>\n{"commands": ["ls"]}'},
    {"role": "user", "content": "a.txt b.txt c.txt"},
    {"role": "assistant", "content": '<think>Three names, so 3.</think>\n{"answer": 3}'},
]


def _with_template(tok, template: str | None):
    from otbuild.train.model import load_tokenizer

    other = load_tokenizer(Path(tok.name_or_path))[0]
    other.chat_template = template
    return other


def _real_qwen3(tok):
    """A tokenizer with Qwen3's own chat template (the text TRL ships as qwen3.jinja)."""
    trl = pytest.importorskip("trl")
    return _with_template(tok, (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text())


def test_qwen3s_own_template_drops_multi_turn_reasoning_traces_loudly(tmp_path, tok):
    from otbuild.train.chat import render
    from otbuild.train.sft import SftDataError, check_dropped

    real = _real_qwen3(tok)
    text = render(real, THINK)
    assert "I should list them first." not in text and "Three names, so 3." in text  # Qwen3's behaviour
    traces = _trace_set(tmp_path / "think.parquet", [THINK] * 3)
    seqs = _tokenized(tmp_path, real, traces, template="auto")
    assert seqs.stats["chat_template"] == "model" and seqs.stats["dropped"]["template_mismatch"] == 3
    with pytest.raises(
        SftDataError,
        match=r"think\.parquet: 3 of 3 traces dropped .*template_mismatch: 3.*"
        r"chat_template: qwen3_thinking",
    ):
        check_dropped(seqs.stats, 0.01, [traces])


def test_qwen3_thinking_keeps_the_reasoning_of_every_turn(tmp_path, tok):
    from otbuild.train.chat import for_template, render

    real = _real_qwen3(tok)
    ids, mask = tokenize_conversation(tok, THINK, "qwen3_thinking")
    assert tok.decode(ids[mask]) == (
        '<think>\nI should list them first.\n</think>\n\n{"commands": ["ls"]}<|im_end|>'
        '<think>\nThree names, so 3.\n</think>\n\n{"answer": 3}<|im_end|>'
    )
    # each turn laid out as Qwen3 lays out the turn it keeps (the last one)
    ours = render(tok, for_template(THINK, "qwen3_thinking"))
    assert ours.endswith(render(real, THINK)[render(real, THINK).rindex("<|im_start|>assistant") :])
    traces = _trace_set(tmp_path / "think.parquet", [THINK] * 3)
    seqs = _tokenized(tmp_path, _with_template(tok, "{{ 'a model template' }}"), traces, template="qwen3_thinking")
    assert len(seqs) == 3 and not any(seqs.stats["dropped"].values())
    assert seqs.stats["chat_template"] == "qwen3_thinking"


def test_qwen3_non_thinking_strips_the_reasoning_before_training(tmp_path, tok):
    from otbuild.train.chat import for_template, render

    real = _real_qwen3(tok)
    ids, mask = tokenize_conversation(tok, THINK, "qwen3")
    assert "think>" not in tok.decode(ids)
    assert tok.decode(ids[mask]) == '{"commands": ["ls"]}<|im_end|>{"answer": 3}<|im_end|>'
    # the history before the last user message is what Qwen3's own template renders
    ours = render(tok, for_template(THINK, "qwen3"))
    cut = ours.rindex("<|im_start|>assistant")
    assert ours[:cut] == render(real, THINK)[:cut]
    traces = _trace_set(tmp_path / "think.parquet", [THINK] * 3)
    seqs = _tokenized(tmp_path, tok, traces, template="qwen3")
    assert len(seqs) == 3 and seqs.stats["chat_template"] == "qwen3"


@pytest.mark.parametrize("kind", ["bytelevel", "names"])
def test_byte_offsets_from_ids_give_the_tokenizers_own_offsets(tmp_path, traces, kind):
    """The fast path (offsets summed from each id's bytes) masks exactly what the tokenizer's
    own offsets mask, on non-ASCII text too; a normalizer that changes the text falls back."""
    from tokenizers import normalizers

    from otbuild.train.chat import byte_lengths, render, tokenize_batch
    from otbuild.train.model import load_tokenizer, materialise

    tok = load_tokenizer(materialise(TinyModel(**TINY, tokenizer=kind), tmp_path / kind, traces))[0]
    extra = [
        {"role": "user", "content": "naïve café, 日本語 😀"},
        {"role": "assistant", "content": "<think>über</think>\nrésumé 😀 Å"},
    ]
    convs = [c + extra for c in D.read_conversations([traces])] + [THINK, CONV]
    lengths = byte_lengths(tok)
    assert lengths is not None
    for source in ("model", "qwen3_thinking", "qwen3"):
        slow, fast = tokenize_batch(tok, convs, source), tokenize_batch(tok, convs, source, lengths)
        for (ids_a, mask_a), (ids_b, mask_b) in zip(slow, fast, strict=True):
            assert ids_a.tolist() == ids_b.tolist() and mask_a.tolist() == mask_b.tolist()
    tok.backend_tokenizer.normalizer = normalizers.NFKC()  # U+212B (3 bytes) becomes U+00C5 (2)
    odd = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\u212b ok"}]
    ((ids_a, mask_a),) = tokenize_batch(tok, [odd], "model")
    ((ids_b, mask_b),) = tokenize_batch(tok, [odd], "model", lengths)
    assert int(lengths[ids_b].sum()) != len(render(tok, odd).encode())  # so the offsets were used
    assert ids_a.tolist() == ids_b.tolist() and mask_a.tolist() == mask_b.tolist() and mask_b.any()


# -- data policies --------------------------------------------------------------------------
def test_truncation_policies_are_recorded(tmp_path, tok, traces):
    convs = D.read_conversations([traces])
    lengths = [len(tokenize_conversation(tok, c)[0]) for c in convs]
    cut = sorted(lengths)[len(lengths) // 2]
    right = _build(tmp_path, tok, traces, cut, "right")
    drop = _build(tmp_path, tok, traces, cut, "drop")
    longer = sum(n > cut for n in lengths)
    assert right.stats["truncated"] == longer and right.stats["tokens_cut"] == sum(n - cut for n in lengths if n > cut)
    assert all(len(right.row(i).input_ids) <= cut for i in range(len(right)))
    assert drop.stats["dropped"]["too_long"] == longer and len(drop) == len(convs) - longer


def test_token_budget_is_deterministic_and_respected(tmp_path, tok, traces):
    full = _build(tmp_path, tok, traces)
    budget = full.stats["tokens"] // 2
    a, b, c = (_build(tmp_path, tok, traces, token_budget=budget, seed=s) for s in (3, 3, 4))
    assert a.stats["tokens"] <= budget and a.stats["tokens"] > budget // 2
    rows = [[d.row(i).input_ids.tolist() for i in range(len(d))] for d in (a, b, c)]
    assert rows[0] == rows[1] and a.stats["over_budget"] == len(full) - len(a)
    assert {tuple(r) for r in rows[0]} != {tuple(r) for r in rows[2]}


def test_packing_keeps_traces_apart(tmp_path, tok, traces):
    import torch

    from otbuild.train.model import load_model
    from otbuild.train.sft import _loss_module

    four = _trace_set(tmp_path / "four.parquet", D.read_conversations([traces])[:4])
    plain = _build(tmp_path, tok, four, 2048)
    packed = _build(tmp_path, tok, four, 2048, packing=True)
    assert len(packed) < len(plain)
    row = packed.row(0)
    starts = np.flatnonzero(row.position_ids == 0)
    assert len(starts) >= 2 and not row.mask[starts].any()
    # block-diagonal attention: the packed row's loss is the sum of its traces' losses
    module = _loss_module(load_model(Path(tok.name_or_path)))
    with torch.no_grad():
        b = D.collate([row], tok.pad_token_id)
        b.pop("n_tokens")
        packed_loss = float(module(**b))
        total, pos = 0.0, 0
        for s in list(starts[1:]) + [len(row.input_ids)]:
            seg = D.Row(row.input_ids[pos:s], row.mask[pos:s])
            seg.mask[0] = False
            sb = D.collate([seg], tok.pad_token_id)
            sb.pop("n_tokens")
            total += float(module(**sb))
            pos = s
    assert packed_loss == pytest.approx(total, rel=1e-4)


def _first_fit(lengths, capacity, order):
    """Quadratic reference: each sequence, in `order`, into the first row with room."""
    bins, room = [], []
    for i in order:
        for b, left in enumerate(room):
            if lengths[i] <= left:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packing_is_first_fit_decreasing_and_no_worse_than_first_fit(seed):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 4096, 300), rng.integers(3000, 8192, 40)])
    capacity = 8192
    bins = D.pack(lengths, capacity)
    flat = np.concatenate(bins)
    assert sorted(flat.tolist()) == list(range(len(lengths)))  # every sequence exactly once
    assert all(lengths[b].sum() <= capacity for b in bins)
    decreasing = np.argsort(-lengths, kind="stable").tolist()
    assert [b.tolist() for b in bins] == _first_fit(lengths.tolist(), capacity, decreasing)
    in_order = _first_fit(lengths.tolist(), capacity, range(len(lengths)))  # the packing it replaced
    assert -(-int(lengths.sum()) // capacity) <= len(bins) <= len(in_order)
    assert [b.tolist() for b in D.pack(lengths, capacity)] == [b.tolist() for b in bins]  # deterministic
    assert D.pack([], capacity) == []
    with pytest.raises(ValueError, match="does not fit"):
        D.pack([capacity + 1], capacity)


def test_packing_scales_n_log_n():
    lengths = np.random.default_rng(0).integers(1, 32768, 100_000)
    t0 = time.perf_counter()
    bins = D.pack(lengths, 32768)
    assert time.perf_counter() - t0 < 30  # the quadratic first fit takes hours here
    assert len(bins) >= -(-int(lengths.sum()) // 32768)


# -- the tokenized set -------------------------------------------------------------------------
def test_tokenized_set_is_built_once_and_reused(tmp_path, tok, traces):
    logs: list[str] = []
    out = tmp_path / "tokenized"
    first = build_tokenized_set(traces, tok, "auto", 512, out, log=logs.append)
    stamp = (out / "tokens.arrow").stat().st_mtime_ns
    again = build_tokenized_set(traces, tok, "auto", 512, out, log=logs.append)
    assert again == first and (out / "tokens.arrow").stat().st_mtime_ns == stamp
    assert [x.split(" ")[1] for x in logs] == ["tokenized", "reusing"]
    seqs = TokenizedSet(out)
    assert len(seqs) == first["sequences"] and seqs.lengths.sum() == first["tokens"]
    for i, conv in enumerate(D.read_conversations([traces])):  # the same ids and mask as one by one
        ids, mask = tokenize_conversation(tok, conv)
        got_ids, got_mask = seqs.seq(i)
        assert got_ids.tolist() == ids[:512].tolist() and got_mask.tolist() == mask[:512].tolist()
    build_tokenized_set(traces, tok, "auto", 256, out, log=logs.append)  # another cutoff: rebuilt
    assert logs[-1].startswith("sft: tokenized") and TokenizedSet(out).stats["cutoff_len"] == 256


def test_tokenized_set_streams_in_bounded_batches(tmp_path, tok, traces):
    """batch_rows traces at a time; the result does not depend on the batch size."""
    a = build_tokenized_set(traces, tok, "auto", 512, tmp_path / "a", batch_rows=1)
    b = build_tokenized_set(traces, tok, "auto", 512, tmp_path / "b", batch_rows=5)
    assert a == b
    sa, sb = TokenizedSet(tmp_path / "a"), TokenizedSet(tmp_path / "b")
    assert all(sa.seq(i)[0].tolist() == sb.seq(i)[0].tolist() for i in range(len(sa)))


def test_tokenized_set_in_worker_processes_is_byte_identical(tmp_path, tok, traces):
    """Batches tokenized in 2 spawned workers are appended in input order: the same file, byte
    for byte, and the same counts as one process (drops and truncation included, across files)."""
    from otbuild.train.tokenized import TOKENS, resolve_workers

    convs = [r["conversations"] for r in trace_rows(7, seed=3)]
    other = _trace_set(tmp_path / "other.parquet", [convs[0], [], *convs[1:4], [], *convs[4:]])
    kw = {"batch_rows": 3, "truncation": "drop"}
    one = build_tokenized_set([traces, other], tok, "auto", 1000, tmp_path / "w1", workers=1, **kw)
    two = build_tokenized_set([traces, other], tok, "auto", 1000, tmp_path / "w2", workers=2, **kw)
    assert one == two and one["dropped"]["empty_conversation"] == 2 and one["dropped"]["too_long"]
    assert one["sequences"] and (tmp_path / "w1" / TOKENS).read_bytes() == (tmp_path / "w2" / TOKENS).read_bytes()
    assert TokenizedSet(tmp_path / "w2").stats == one
    assert resolve_workers("auto") == len(os.sched_getaffinity(0)) and resolve_workers(3) == 3
    with pytest.raises(ValueError, match="workers"):
        resolve_workers(0)
    from otbuild.settings.identity import identity  # the worker count is execution-only: no id moves

    assert identity(SftSettings(**FAST, tokenize_workers=7)) == identity(SftSettings(**FAST))


def test_zero_and_one_row_trace_sets(tmp_path, tok, traces):
    from otbuild.stages.sft import run
    from otbuild.train.sft import SftDataError

    empty = _trace_set(tmp_path / "empty.parquet", [])
    stats = build_tokenized_set(empty, tok, "auto", 512, tmp_path / "t0")
    assert stats["traces"] == 0 and len(TokenizedSet(tmp_path / "t0")) == 0
    assert D.build(TokenizedSet(tmp_path / "t0"), cutoff_len=512, packing=True).stats["rows"] == 0
    with pytest.raises(SftDataError, match=r"empty\.parquet: no trainable traces"):
        run(SftSettings(**FAST, max_steps=1), [empty], tmp_path / "ck0")
    one = _trace_set(tmp_path / "one.parquet", D.read_conversations([traces])[:1])
    out = run(SftSettings(**FAST, max_steps=2), [one], tmp_path / "ck1")
    assert out["steps"] == 2 and out["data"]["traces"] == 1 and out["data"]["rows"] == 1
    assert not (tmp_path / "ck1" / "tokenized").exists()  # removed with the finished run


def test_dropped_traces_are_counted_by_reason_and_fail_above_the_limit(tmp_path, traces):
    from otbuild.stages.sft import run
    from otbuild.train.sft import SftDataError

    convs = D.read_conversations([traces])
    no_answer = [{"role": "user", "content": "hello"}]
    mixed = _trace_set(tmp_path / "mixed.parquet", [*convs, no_answer, []])
    with pytest.raises(
        SftDataError,
        match=r"mixed\.parquet: 2 of 14 traces dropped \(14\.3%\), more than "
        r"sft\.max_dropped_fraction 0\.01: empty_conversation: 1, no_assistant_tokens: 1",
    ):
        run(SftSettings(**{**FAST, "max_steps": 1}), [mixed], tmp_path / "a")
    out = run(SftSettings(**{**FAST, "max_steps": 1, "max_dropped_fraction": 0.2}), [mixed], tmp_path / "b")
    assert out["data"]["dropped"] == {
        "empty_conversation": 1,
        "template_mismatch": 0,
        "too_long": 0,
        "no_assistant_tokens": 1,
    }
    assert out["data"]["traces"] == 14 and out["data"]["sequences"] == 12


def test_global_batches_cover_each_epoch_and_fill_the_last():
    n, g = 10, 4
    assert D.steps_per_epoch(n, g) == 3
    epoch0 = [i for s in range(3) for i in D.global_batch_rows(n, s, g, seed=0)]
    assert len(epoch0) == 12 and set(epoch0) == set(range(10))
    assert D.global_batch_rows(n, 1, g, 0) == D.global_batch_rows(n, 1, g, 0)
    assert D.global_batch_rows(n, 3, g, 0) != D.global_batch_rows(n, 0, g, 0)  # epoch 1: new order


# -- batch arithmetic, DeepSpeed, launch ----------------------------------------------------
def test_gradient_accumulation_from_world_size():
    assert grad_accum_steps(96, 16, 1) == 6
    assert grad_accum_steps(96, 1, 4) == 24
    with pytest.raises(BatchSizeError, match=r"96 is not divisible by world_size 5 x per_device_batch_size 1"):
        grad_accum_steps(96, 5, 1)
    with pytest.raises(BatchSizeError, match="use a global batch of 64 or 128"):
        grad_accum_steps(96, 16, 4)


def test_zero3_config_from_the_recipe():
    from otbuild.settings.train import Sft

    s = Sft(model={"kind": "pretrained", "path": "/models/Qwen3-8B"})
    conf = ds_config(s, global_batch=96, per_device=1, world_size=16, on_gpu=True, client_optimizer=False)
    assert conf["train_batch_size"] == 96 and conf["gradient_accumulation_steps"] == 6
    assert conf["zero_optimization"]["stage"] == 3
    assert conf["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert conf["bf16"]["enabled"] and conf["gradient_clipping"] == 1.0
    assert conf["optimizer"]["params"]["lr"] == 4e-5 and conf["optimizer"]["params"]["betas"] == [0.9, 0.999]
    cpu = ds_config(
        s.model_copy(update={"zero_stage": 0}),
        global_batch=96,
        per_device=1,
        world_size=1,
        on_gpu=False,
        client_optimizer=True,
    )
    assert not cpu["bf16"]["enabled"] and "optimizer" not in cpu and cpu["gradient_accumulation_steps"] == 96


def test_hostlist_expansion():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("node7") == ["node7"]
    assert expand_hostlist("a[8-10]-ib") == ["a8-ib", "a9-ib", "a10-ib"]


SLURM_4x4 = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NODELIST": "gh[001-004]",
    "SLURM_JOB_NODELIST": "gh[001-004]",
    "SLURM_NNODES": "4",
    "SLURM_GPUS_ON_NODE": "4",
    "SLURM_PROCID": "0",
    "SLURM_NODEID": "0",
}


def test_launch_command_for_a_4_node_4_gpu_slurm_allocation():
    """One srun task per node, without a GPU option (each sees every GPU of the job on its node);
    each node's launcher starts one process per GPU that node has, read there."""
    argv = ["python", "-m", "otbuild.train", "sft", "kept.parquet", "--outdir", "out dir"]
    cmd = launch_command(Launch(master_port=29511), SLURM_4x4, argv)
    assert cmd[:8] == [
        "srun",
        "--overlap",
        "--nodes=4",
        "--ntasks=4",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "bash",
        "-c",
    ]
    assert cmd[8] == (
        "exec python -m torch.distributed.run --nnodes=4 --nproc-per-node=${SLURM_GPUS_ON_NODE:-1} "
        "--rdzv-backend=c10d --rdzv-endpoint=gh001:29511 --rdzv-id=4242 "
        "-m otbuild.train sft kept.parquet --outdir 'out dir'"
    )
    ds = launch_command(Launch(launcher="deepspeed", master_port=29511), SLURM_4x4, argv)
    assert ds[:8] == cmd[:8]
    assert ds[8].startswith(
        "exec deepspeed --no_ssh --num_nodes=4 --num_gpus=${SLURM_GPUS_ON_NODE:-1} "
        "--node_rank=$SLURM_NODEID --master_addr=gh001 --master_port=29511 "
        "--module otbuild.train sft"
    )
    # gpus_per_node from the recipe wins over Slurm's
    assert "--nproc-per-node=2 " in launch_command(Launch(gpus_per_node=2), SLURM_4x4, argv)[8]
    # inside a job step (a rule without `mpi`): no new step, torchrun on this node's GPUs
    step = {**SLURM_4x4, "SLURM_STEP_ID": "0"}
    assert launch_command(Launch(), step, argv)[:5] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
    ]
    # no Slurm: one local process (the stage trains in process), or torchrun --standalone
    assert launch_command(Launch(), {}, argv) == argv
    assert launch_command(Launch(gpus_per_node=8), {}, argv)[:5] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=8",
    ]


# -- schema -----------------------------------------------------------------------------------
def test_schema_defaults_are_the_papers():
    from pydantic import ValidationError

    from otbuild.settings.train import Rl, Sft

    s = Sft(model={"kind": "pretrained", "path": "Qwen/Qwen3-8B"})
    assert (s.learning_rate, s.lr_scheduler, s.warmup_ratio, s.global_batch_size, s.cutoff_len, s.zero_stage) == (
        4e-5,
        "cosine",
        0.1,
        96,
        32768,
        3,
    )
    r = Rl(steps=10)
    assert (r.learning_rate, r.batch_size, r.samples_per_task, r.temperature, r.clip_low, r.clip_high, r.kl_coef) == (
        5e-6,
        64,
        8,
        0.7,
        0.2,
        0.2,
        0.0,
    )
    with pytest.raises(ValidationError, match="multiple of per_device_batch_size"):
        Sft(model={"kind": "tiny"}, global_batch_size=10, per_device_batch_size=4)
    with pytest.raises(ValidationError):
        Sft(model={"kind": "tiny"}, lerning_rate=1e-5)


# -- the tiny student, the export ------------------------------------------------------------
def test_tiny_student_is_deterministic_and_has_the_template_specials(tmp_path, traces):
    from otbuild.train.model import materialise

    a = materialise(TinyModel(**TINY), tmp_path / "a", traces)
    b = materialise(TinyModel(**TINY), tmp_path / "b", traces)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["hidden_size"] == 32
    vocab = json.loads((a / "tokenizer.json").read_text())["added_tokens"]
    assert {"<|im_start|>", "<|im_end|>", "<think>", "<tool_response>"} <= {t["content"] for t in vocab}


def test_llamafactory_export(tmp_path, traces):
    from otbuild.train.__main__ import main

    assert main(["export-llamafactory", str(traces), "--outdir", str(tmp_path / "lf")]) == 0
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())
    assert info["otbuild_sft"]["formatting"] == "sharegpt"
    assert info["otbuild_sft"]["tags"]["role_tag"] == "role"
    rows = json.loads((tmp_path / "lf" / "otbuild_sft.json").read_text())
    assert len(rows) == 12 and rows[0]["messages"] == trace_rows(12, full_prompt=False)[0]["conversations"]


# -- training ---------------------------------------------------------------------------------
def _log(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "train_log.jsonl").read_text().splitlines()]


def test_sft_stage_writes_the_checkpoint_dir(tmp_path, traces):
    from otbuild.stages.sft import run

    stats = run(SftSettings(**{**FAST, "token_budget": 3000}), [traces], tmp_path / "ck")
    out = tmp_path / "ck"
    names = {p.name for p in out.iterdir()}
    assert {"checkpoint.json", "model.safetensors", "config.json", "tokenizer.json", "train_log.jsonl"} <= names
    assert "checkpoints" not in names and "base_model" not in names
    manifest = json.loads((out / "checkpoint.json").read_text())
    assert manifest["files"]["model.safetensors"] and manifest["data"]["tokens"] <= 3000
    log = _log(out)
    assert [r["step"] for r in log] == list(range(1, manifest["total_steps"] + 1))
    assert {"step", "loss", "lr", "tokens", "tokens_seen", "time"} <= set(log[0])
    assert log[-1]["tokens_seen"] == sum(r["tokens"] for r in log) == stats["tokens_seen"]
    assert log[0]["lr"] == 0.0 and max(r["lr"] for r in log) <= 1e-3  # warmup from 0, cosine


def test_loss_is_a_global_token_mean_whatever_the_micro_batching(tmp_path, traces):
    from safetensors.numpy import load_file

    from otbuild.train.sft import train

    a = train(SftSettings(**{**FAST, "per_device_batch_size": 4, "zero_stage": 0}), [traces], tmp_path / "a")
    b = train(SftSettings(**{**FAST, "per_device_batch_size": 1, "zero_stage": 3}), [traces], tmp_path / "b")
    assert a["gradient_accumulation_steps"] == 1 and b["gradient_accumulation_steps"] == 4
    la, lb = _log(tmp_path / "a"), _log(tmp_path / "b")
    assert [r["loss"] for r in la] == pytest.approx([r["loss"] for r in lb], rel=1e-4)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], atol=2e-5)


def _last_step(path: Path) -> int:
    """The last step a running job has logged (a line being written is not one yet)."""
    log = path / "train_log.jsonl"
    lines = log.read_text().splitlines(keepends=True) if log.exists() else []
    return max([json.loads(x)["step"] for x in lines if x.endswith("\n")], default=0)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_saved_step(tmp_path, traces):
    settings = {**FAST, "epochs": 4, "global_batch_size": 2, "per_device_batch_size": 1, "save_steps": 5}
    (tmp_path / "s.json").write_text(json.dumps(settings))

    # a fresh single-process group each (this process may hold one, with its own MASTER_PORT)
    env = outside_group(dict(os.environ))

    def start(outdir, delay=None):  # delay: each step that much longer (tests/support/slow_train.py)
        entry = (
            ["-m", "otbuild.train"]
            if delay is None
            else [str(Path(__file__).parents[1] / "support" / "slow_train.py"), delay]
        )
        return subprocess.Popen(
            [
                sys.executable,
                *entry,
                "sft",
                str(traces),
                "--outdir",
                str(outdir),
                "--settings",
                f"@{tmp_path / 's.json'}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )

    ref = start(tmp_path / "ref")
    run = start(tmp_path / "run", "0.3")
    latest = tmp_path / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 120
    while not (latest.exists() and latest.read_text().strip() == "step-10"):
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
        time.sleep(0.1)
    while _last_step(tmp_path / "run") <= 11:  # steps past the checkpoint, which the resumed run redoes
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert not (tmp_path / "run" / "checkpoint.json").exists()
    assert max(r["step"] for r in _log(tmp_path / "run")) > 10
    again = start(tmp_path / "run")
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out
    assert "sft: resumed from step 10" in out
    assert "sft: reusing the tokenized set" in out and "sft: tokenized " not in out  # not tokenized again
    log = _log(tmp_path / "run")
    assert [r["step"] for r in log] == list(range(1, 25))  # 12 rows / 2 x 4 epochs, none twice
    from tests.train.test_tracking import scalars  # TensorBoard shows every step once, the resumed run's values

    assert scalars(tmp_path / "run")["train/loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in log]
    ref.communicate(timeout=180)
    assert ref.returncode == 0
    rlog = _log(tmp_path / "ref")
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in rlog], rel=1e-5)
    assert log[-1]["tokens_seen"] == rlog[-1]["tokens_seen"]
    from safetensors.numpy import load_file

    a, b = load_file(tmp_path / "run" / "model.safetensors"), load_file(tmp_path / "ref" / "model.safetensors")
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-5)


@pytest.mark.slow
def test_two_ranks_share_one_tokenized_set(tmp_path, traces, capfd):
    """Two local ranks (torchrun, gloo): rank 0 tokenizes once, in 2 spawned worker processes
    (3 batches of 4 traces), and both train on its memory map."""
    from otbuild.stages.sft import run

    env = outside_group(dict(os.environ))
    with pytest.MonkeyPatch.context() as mp:
        for k in set(os.environ) - set(env):
            mp.delenv(k)
        mp.setenv("OTBUILD_TOKENIZE_BATCH", "4")  # read by the ranks' processes
        stats = run(
            SftSettings(
                **{**FAST, "gpus_per_node": 2, "per_device_batch_size": 1, "max_steps": 2, "tokenize_workers": 2}
            ),
            [traces],
            tmp_path / "ck",
        )
    out = capfd.readouterr().out
    assert stats["world_size"] == 2 and stats["steps"] == 2
    assert out.count("sft: tokenized ") == 1 and "sft: reusing" not in out and "; 2 processes)" in out
    assert len([x for x in out.splitlines() if x.startswith("sft: ") and " rows, " in x]) == 2  # each rank


# -- the tiny student that learns (issue 11) -------------------------------------------------
def _pieces(tok, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]


def test_names_tokenizer_keeps_a_name_the_same_tokens_everywhere():
    from otbuild.engines.tiny import train_tokenizer

    texts = [
        "Move every file from `/app/reports_42/` into `/app/inbox_17/`.",
        '{"keystrokes":"mv reports_42/* inbox_17/\\n"}',
    ] * 20
    byte = train_tokenizer(texts, vocab_size=300)
    assert " reports" in _pieces(byte, "mv reports_42/") and " reports" not in _pieces(byte, "`/app/reports_42/`")
    names = train_tokenizer(texts, vocab_size=300, kind="names")
    for text in ("mv reports_42/", "`/app/reports_42/`", '"reports_42 x"'):
        pieces = _pieces(names, text)
        at = pieces.index("reports_")
        assert pieces[at : at + 2] == ["reports_", "42"] and "".join(pieces) == text


def test_zero_steps_is_the_untrained_base_on_compact_traces(tmp_path):
    """max_steps: 0 saves the base model as built; harness.prompt compact (the `prompt` the
    plan adds) rewrites the traces before the tokenizer is trained on them."""
    from safetensors.numpy import load_file

    from otbuild.train.model import materialise
    from otbuild.train.sft import train

    traces = write_toy_traces(tmp_path / "kept.parquet", 6, full_prompt=True)
    spec = {**TINY, "tokenizer": "names"}
    manifest = train(
        SftSettings(**{**FAST, "model": spec, "max_steps": 0, "prompt": "compact"}), [traces], tmp_path / "ck"
    )
    assert manifest["steps"] == 0 and not _log(tmp_path / "ck")
    base = materialise(TinyModel(**spec), tmp_path / "base", traces, "compact")
    assert (base / "tokenizer.json").read_text() == (tmp_path / "ck" / "tokenizer.json").read_text()
    a, b = load_file(base / "model.safetensors"), load_file(tmp_path / "ck" / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_copy_objective_is_logged_deterministic_and_trains(tmp_path, tok, traces):
    """copy_loss_weight adds a copying objective (random strings, repeated; targets the repeat)
    to every step: logged as copy_loss, the same batch for the same (seed, step, rank)."""
    from otbuild.train.sft import COPY_SPAN, copy_batch, train

    a, b = copy_batch(tok, 3, 0, 0), copy_batch(tok, 3, 0, 0)
    assert a["input_ids"].equal(b["input_ids"]) and not a["input_ids"].equal(copy_batch(tok, 4, 0, 0)["input_ids"])
    ids = a["input_ids"]
    assert ids[:, :COPY_SPAN].equal(ids[:, COPY_SPAN:]) and not set(ids.flatten().tolist()) & set(tok.all_special_ids)
    assert a["target_mask"][:, COPY_SPAN + 1 :].all() and not a["target_mask"][:, : COPY_SPAN + 1].any()
    train(
        SftSettings(
            **{
                **FAST,
                "global_batch_size": 1,
                "per_device_batch_size": 1,
                "max_steps": 20,
                "learning_rate": 3e-3,
                "copy_loss_weight": 1.0,
            }
        ),
        [traces],
        tmp_path / "ck",
    )
    log = _log(tmp_path / "ck")
    assert len(log) == 20 and all("copy_loss" in r for r in log)
    assert log[-1]["copy_loss"] < log[0]["copy_loss"]


def test_a_multi_step_trace_trains_each_step_on_the_conversation_it_was_sent(tmp_path, tok):
    """Each step of a multi-step trial began a conversation of its own (Harbor's terminus-2
    has no resume), so SFT tokenizes each step as a sequence of its own (its trace's row
    number kept), never conditioning step two's answers on step one; LLaMA-Factory's export
    holds one record per step as well. Any other trace stays one sequence."""
    from otbuild.train.llamafactory import write_handoff
    from otbuild.settings.train import Sft

    one = [{"role": "user", "content": "make notes"}, {"role": "assistant", "content": "done one"}]
    two = [{"role": "user", "content": "append data"}, {"role": "assistant", "content": "done two"}]
    rows = [dict.fromkeys(TRACE_SCHEMA.names) for _ in range(2)]
    rows[0].update(
        conversations=one + two,
        task="steps",
        trial_name="s",
        sample_idx=0,
        metadata=json.dumps({"steps": [{"name": "a", "first_message": 0}, {"name": "b", "first_message": 2}]}),
    )
    rows[1].update(conversations=one + two, task="plain", trial_name="p", sample_idx=0, metadata="{}")
    write_traces(tmp_path / "kept.parquet", rows)
    seqs = _tokenized(tmp_path, tok, tmp_path / "kept.parquet")
    assert seqs.stats["traces"] == 2 and seqs.stats["sequences"] == 3
    ids = [seqs.seq(i)[0] for i in range(3)]
    texts = [tok.decode(x) for x in ids]
    assert "make notes" in texts[0] and "append data" not in texts[0]
    assert "append data" in texts[1] and "make notes" not in texts[1]
    assert "make notes" in texts[2] and "append data" in texts[2]  # one conversation: one sequence
    out = write_handoff(
        [tmp_path / "kept.parquet"],
        tmp_path / "lf",
        Sft(model={"kind": "tiny"}, global_batch_size=8),
        "Qwen/Qwen3-8B",
        8,
    )
    records = [r["messages"] for r in json.loads((tmp_path / "lf" / "otbuild_sft.json").read_text())]
    assert out["rows"] == 3 and records == [one, two, one + two]
