"""otbuild's LLaMA-Factory handoff against the real LLaMA-Factory: the pinned release (pyproject's
`llamafactory` extra), in .venv-llamafactory (scripts/llamafactory-env.sh, `make
llamafactory-env`), parses each exported YAML with its own argument parser and loads the
exported dataset with its own converter, template and the tiny student's tokenizer
(tests/support/llamafactory_contract.py); the token ids and trained-on labels must be otbuild's own
tokenized SFT set for the same traces, thinking and non-thinking. No GPU needed.

The differences that remain are LLaMA-Factory's, asserted exactly (docs/training.md):
- it trains the newline after each assistant turn's <|im_end|> (its qwen3 templates put it in
  the answer); otbuild trains up to <|im_end|>, the last token the model generates;
- its `qwen3` (thinking) template trains an empty `<think>\\n\\n</think>\\n\\n` before an
  assistant turn that has no reasoning; otbuild's qwen3_thinking renders that turn as it is;
- turns the export merged (LLaMA-Factory drops conversations whose turns do not alternate)
  are one turn there: the same trained tokens, a different prompt layout;
- with `train_on_prompt` it also labels the first token, which no model predicts;
- tool-calling traces (its own tool format: `tools`, function_call and observation turns): a
  conversation offered tools without a system message opens its system turn with two newlines
  before `# Tools`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from otbuild.settings.train import Sft, TinyModel
from otbuild.traces.table import TRACE_SCHEMA, write_traces
from otbuild.train.chat import tokenize_conversation
from otbuild.train.llamafactory import write_handoff
from otbuild.train.tokenized import TokenizedSet, build_tokenized_set
from otbuild.train.toy import trace_rows
from tests.conftest import REPO, pinned_release, tool_answer

LF_PYTHON = REPO / ".venv-llamafactory" / "bin" / "python"
needs_llamafactory = pytest.mark.skipif(
    not LF_PYTHON.is_file(),
    reason="LLaMA-Factory is not installed in .venv-llamafactory: run scripts/llamafactory-env.sh "
    "(make llamafactory-env)",
)
TINY = {
    "kind": "tiny",
    "vocab_size": 600,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
IGNORE = -100  # LLaMA-Factory's IGNORE_INDEX


def test_the_llamafactory_extra_pins_one_release():
    assert pinned_release("llamafactory").count(".") == 2  # e.g. 0.9.5: the release the contract test ran against


def conversations() -> list[list[dict]]:
    """Toy terminus-2 traces with reasoning in every answer, and the shapes the export must
    mend: a system prompt; Harbor's system step then user step (two user turns); a closing
    observation; an answer without reasoning; text beyond ASCII."""
    convs = []
    for k, row in enumerate(trace_rows(6, full_prompt=False)):
        conv = [dict(m) for m in row["conversations"]]
        for i, m in enumerate(conv):
            if m["role"] == "assistant":
                m["content"] = f"<think>\nturn {i}: what to run next, and why — {k}\n</think>\n\n{m['content']}"
        convs.append(conv)
    convs[1].insert(0, {"role": "system", "content": "You are an agent in a terminal."})
    convs[2][2:2] = [{"role": "user", "content": "[summary of the context so far]"}]  # user after user
    convs[3].append({"role": "user", "content": "New Terminal Output:\n$ "})  # ends with an observation
    convs[4][1]["content"] = convs[4][1]["content"].split("</think>\n\n", 1)[1]  # one answer without reasoning
    convs[5][0]["content"] += " Écris « bonjour » dans /app/é.txt ✓"
    return convs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The traces, the tiny student's model dir, and one export per case."""
    from otbuild.train.model import materialise

    tmp = tmp_path_factory.mktemp("lfc")
    rows = []
    for i, conv in enumerate(conversations()):
        row = dict.fromkeys(TRACE_SCHEMA.names)
        row.update(conversations=conv, task=f"t{i}", trial_name=f"t-{i}", sample_idx=0)
        rows.append(row)
    traces = tmp / "kept.parquet"
    write_traces(traces, rows)
    model = materialise(TinyModel(**TINY), tmp / "model", [traces])
    cases = {
        "thinking": {"chat_template": "qwen3_thinking"},
        "nothink": {"chat_template": "qwen3"},
        "nothink_prompt": {"chat_template": "qwen3", "train_on_prompt": True},
        "packed": {"chat_template": "qwen3", "packing": True},
    }
    exports = {}
    for name, c in cases.items():
        sft = Sft(
            model={**TINY, "chat_template": c["chat_template"]},
            cutoff_len=4096,
            global_batch_size=8,
            zero_stage=3,
            max_grad_norm=1e-4,
            adam_betas=(0.9, 0.98),
            weight_decay=0.04,
            **{k: v for k, v in c.items() if k != "chat_template"},
        )
        out = write_handoff([traces], tmp / name, sft, str(model), 4)
        exports[name] = (sft, out)
    return tmp, traces, model, exports


def _contract(tmp, model, runs: dict) -> dict:
    given = {
        "model": str(model),
        "runs": [{"name": n, "yaml": y, "output_dir": str(tmp / "out" / n)} for n, y in runs.items()],
    }
    # LLaMA-Factory's own transformers, not otbuild's
    return tool_answer(
        LF_PYTHON,
        "llamafactory_contract.py",
        given,
        tmp / f"answer-{len(runs)}.json",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        DISABLE_VERSION_CHECK="1",
    )


@pytest.fixture(scope="module")
def contract(setup):
    tmp, _, model, exports = setup
    return _contract(tmp, model, {n: out["yaml"] for n, (_, out) in exports.items()})


def _otbuild_set(setup, name: str) -> TokenizedSet:
    tmp, traces, model, exports = setup
    sft, _ = exports[name]
    build_tokenized_set(
        traces, model, sft.model.chat_template, sft.cutoff_len, tmp / f"tok-{name}", train_on_prompt=sft.train_on_prompt
    )
    return TokenizedSet(tmp / f"tok-{name}")


def _tokenizer(model):
    from otbuild.train.model import load_tokenizer

    return load_tokenizer(model)[0]


def _lf_view(tok, ids: np.ndarray, mask: np.ndarray) -> tuple[list[int], list[int]]:
    """otbuild's (ids, mask) as LLaMA-Factory labels them: also the newline after each
    supervised <|im_end|>."""
    end, nl = tok.convert_tokens_to_ids("<|im_end|>"), tok.encode("\n", add_special_tokens=False)
    assert len(nl) == 1
    lab = mask.copy()
    lab[1:] |= mask[:-1] & (ids[:-1] == end) & (ids[1:] == nl[0])
    return ids.tolist(), [int(t) if m else IGNORE for t, m in zip(ids, lab, strict=True)]


@needs_llamafactory
@pytest.mark.slow
def test_llamafactory_loads_the_export_with_the_recipes_settings(setup, contract):
    *_, exports = setup
    assert contract["llamafactory"] == pinned_release("llamafactory")
    for name, (sft, out) in exports.items():
        run = contract["runs"][name]
        assert run["error"] is None, f"{name}: {run['error']}"
        args = run["args"]
        assert args["template"] == {"qwen3_thinking": "qwen3", "qwen3": "qwen3_nothink"}[sft.model.chat_template]
        assert (args["packing"], args["neat_packing"]) == (sft.packing, sft.packing)  # traces kept apart
        assert (
            args["max_grad_norm"],
            args["adam_beta1"],
            args["adam_beta2"],
            args["weight_decay"],
            args["adam_epsilon"],
            args["optim"],
        ) == (1e-4, 0.9, 0.98, 0.04, 1e-8, "adamw_torch_fused")
        assert (
            args["learning_rate"],
            args["lr_scheduler_type"],
            args["warmup_ratio"],
            args["cutoff_len"],
            args["gradient_accumulation_steps"],
            args["train_on_prompt"],
        ) == (4e-5, "cosine", 0.1, 4096, 2, sft.train_on_prompt)  # 8 = 4 GPUs x 1 x 2; packed rows as otbuild's
        assert out["rows"] == 6  # every conversation: LLaMA-Factory drops none
        if not sft.packing:
            assert len(run["rows"]) == 6
    assert exports["thinking"][1]["merged_turns"] == 1 and exports["thinking"][1]["trailing_turns_dropped"] == 1
    assert exports["thinking"][1]["turns_without_reasoning"] == 1


@needs_llamafactory
@pytest.mark.slow
@pytest.mark.parametrize("name", ["thinking", "nothink", "nothink_prompt"])
def test_llamafactory_trains_on_otbuilds_tokens(setup, contract, name):
    """Row by row, LLaMA-Factory's input ids and labels against otbuild's tokenized set."""
    tmp, traces, model, exports = setup
    tok, ours, theirs = _tokenizer(model), _otbuild_set(setup, name), contract["runs"][name]["rows"]
    sft, out = exports[name]
    exported = [r["messages"] for r in json.loads((tmp / name / "otbuild_sft.json").read_text())]
    assert len(ours) == len(theirs) == len(exported) == 6
    for i, (lf, msgs) in enumerate(zip(theirs, exported, strict=True)):
        ids, mask = ours.seq(i)
        if sft.train_on_prompt:
            assert lf["labels"][0] == lf["input_ids"][0]  # LLaMA-Factory labels the first token too
            lf = {**lf, "labels": [IGNORE, *lf["labels"][1:]]}
        if i in (2, 3, 4):  # rows the export changed, or LLaMA-Factory's thinking template does
            if i == 4 and sft.model.chat_template == "qwen3_thinking":
                msgs = [
                    {**m, "content": "<think>\n\n</think>\n\n" + m["content"]}
                    if m["role"] == "assistant" and "</think>" not in m["content"]
                    else m
                    for m in msgs
                ]
            merged_ids, merged_mask = tokenize_conversation(tok, msgs, sft.model.chat_template)
            if sft.train_on_prompt:
                merged_mask = np.arange(len(merged_ids)) > 0
            assert (lf["input_ids"], lf["labels"]) == _lf_view(tok, merged_ids, merged_mask), i
            if i == 4 and sft.model.chat_template == "qwen3_thinking":
                empty = tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
                assert len(merged_ids) == len(ids) + len(empty)
            elif not sft.train_on_prompt:  # the same trained tokens, the prompt laid out otherwise
                assert merged_ids[merged_mask].tolist() == ids[mask].tolist(), i
            continue
        assert (lf["input_ids"], lf["labels"]) == _lf_view(tok, ids, mask), i


@needs_llamafactory
@pytest.mark.slow
def test_llamafactory_refuses_what_the_export_used_to_write(setup):
    """Proof the check can fail: the old dataset_info.json (a `system` column no record has)
    and a key LLaMA-Factory does not know."""
    tmp, _, model, exports = setup
    old = tmp / "old"
    old.mkdir()
    yml = yaml.safe_load(open(exports["nothink"][1]["yaml"]).read())
    (old / "train.yaml").write_text(yaml.safe_dump(yml))
    (old / "otbuild_sft.json").write_text((tmp / "nothink" / "otbuild_sft.json").read_text())
    info = json.loads((tmp / "nothink" / "dataset_info.json").read_text())
    info["otbuild_sft"]["columns"]["system"] = "system"
    (old / "dataset_info.json").write_text(json.dumps(info))
    bad = tmp / "bad"
    bad.mkdir()
    for f in ("otbuild_sft.json", "dataset_info.json"):
        (bad / f).write_text((tmp / "nothink" / f).read_text())
    (bad / "train.yaml").write_text(yaml.safe_dump({**yml, "packing_neat": True}))
    runs = _contract(tmp, model, {"old": str(old / "train.yaml"), "bad": str(bad / "train.yaml")})["runs"]
    assert "KeyError: 'system'" in runs["old"]["error"]
    assert "packing_neat" in runs["bad"]["error"]


# --- tool-calling traces: LLaMA-Factory's tool format (function_call / observation turns, tools) ---


def tool_conversations() -> list[tuple[list[dict], bool]]:
    """(conversation, has a system message): toy tool-calling traces (no system message), one
    with a system message, text before two parallel calls and their two results, and one whose
    arguments are JSON in another layout than json.dumps' (both write them with json.dumps)."""
    from otbuild.train.toy import tool_trace_rows

    convs = [(row["conversations"], False) for row in tool_trace_rows(3)]

    def call(i, args):
        return {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}

    system = {"role": "system", "content": "You are an agent in a terminal."}
    convs.append(
        (
            [
                system,
                {"role": "user", "content": "List the files, then say where you are."},
                {
                    "role": "assistant",
                    "content": "<think>\nboth at once\n</think>\n\nI'll run two commands.",
                    "tool_calls": [call(1, '{"command": "ls"}'), call(2, '{"command": "pwd"}')],
                },
                {"role": "tool", "content": "a.txt b.txt", "tool_call_id": "c1"},
                {"role": "tool", "content": "/app", "tool_call_id": "c2"},
                {"role": "assistant", "content": "<think>\nseen\n</think>\n\nTwo files, in /app."},
            ],
            True,
        )
    )
    convs.append(
        (
            [
                system,
                {"role": "user", "content": "List the files."},
                {
                    "role": "assistant",
                    "content": "<think>\nls\n</think>\n\n",
                    "tool_calls": [call(1, '{"command":"ls"}')],  # no spaces: not json.dumps' layout
                },
                {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
                {"role": "assistant", "content": "<think>\ndone\n</think>\n\nDone."},
            ],
            True,
        )
    )
    return convs


@pytest.fixture(scope="module")
def tool_setup(tmp_path_factory):
    from otbuild.train.model import materialise
    from otbuild.train.toy import TOY_TOOLS

    tmp = tmp_path_factory.mktemp("lfc-tools")
    rows = []
    for i, (conv, _) in enumerate(tool_conversations()):
        row = dict.fromkeys(TRACE_SCHEMA.names)
        row.update(conversations=conv, task=f"t{i}", trial_name=f"t-{i}", sample_idx=0, tools=json.dumps(TOY_TOOLS))
        rows.append(row)
    traces = tmp / "kept.parquet"
    write_traces(traces, rows)
    model = materialise(TinyModel(**TINY), tmp / "model", [traces])
    exports = {}
    for name, template in (("tools_thinking", "qwen3_thinking"), ("tools_nothink", "qwen3")):
        sft = Sft(model={**TINY, "chat_template": template}, cutoff_len=4096, global_batch_size=8, zero_stage=3)
        exports[name] = (sft, write_handoff([traces], tmp / name, sft, str(model), 4))
    return tmp, traces, model, exports


@pytest.fixture(scope="module")
def tool_contract(tool_setup):
    tmp, _, model, exports = tool_setup
    return _contract(tmp, model, {n: out["yaml"] for n, (_, out) in exports.items()})


def test_the_export_writes_llamafactorys_tool_format(tool_setup):
    tmp, *_, exports = tool_setup
    out = exports["tools_thinking"][1]
    assert (out["rows"], out["rows_with_tools"], out["tools_without_system"]) == (5, 5, 3)
    assert (out["tool_arguments_not_json"], out["dropped"]) == (0, 0)
    info = json.loads((tmp / "tools_thinking" / "dataset_info.json").read_text())["otbuild_sft"]
    assert info["columns"] == {"messages": "messages", "tools": "tools"}
    assert (info["tags"]["function_tag"], info["tags"]["observation_tag"]) == ("function_call", "observation")
    records = json.loads((tmp / "tools_thinking" / "otbuild_sft.json").read_text())
    parallel = records[3]["messages"]
    assert [m["role"] for m in parallel] == ["system", "user", "function_call", "observation", "assistant"]
    assert parallel[2]["content"].endswith(
        'I\'ll run two commands.\n<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}, '
        '{"name": "bash", "arguments": {"command": "pwd"}}]</tool_call>'
    )
    assert parallel[3]["content"] == "a.txt b.txt\n</tool_response>\n<tool_response>\n/app"
    with open(out["yaml"]) as f:
        header = f.read()
    assert "3 conversation(s) offered tools without a system message" in header


@needs_llamafactory
@pytest.mark.slow
@pytest.mark.parametrize("name", ["tools_thinking", "tools_nothink"])
def test_llamafactory_trains_on_otbuilds_tool_call_tokens(tool_setup, tool_contract, name):
    """LLaMA-Factory's own converter, qwen3 template and tool formatter on the export: its input
    ids and labels are otbuild's, the assistant's text and tool-call blocks trained, tool
    results not (arguments in another JSON layout too: both write them with json.dumps). Its
    layout differs from Qwen3's (otbuild's) in one place, asserted exactly: a conversation offered
    tools without a system message opens its system turn with two newlines before `# Tools`
    (prompt tokens; every token after that turn is otbuild's)."""
    tmp, traces, model, exports = tool_setup
    sft, _ = exports[name]
    run = tool_contract["runs"][name]
    assert run["error"] is None, run["error"]
    tok, theirs = _tokenizer(model), run["rows"]
    build_tokenized_set(traces, model, sft.model.chat_template, sft.cutoff_len, tmp / f"tok-{name}")
    ours = TokenizedSet(tmp / f"tok-{name}")
    convs = tool_conversations()
    assert len(ours) == len(theirs) == len(convs) == 5
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for i, (lf, (conv, has_system)) in enumerate(zip(theirs, convs, strict=True)):
        ids, mask = ours.seq(i)
        want_ids, want_labels = _lf_view(tok, ids, mask)
        supervised = tok.decode([t for t in want_labels if t != IGNORE])
        assert "<tool_call>" in supervised and "<tool_response>" not in supervised
        if has_system:
            assert (lf["input_ids"], lf["labels"]) == (want_ids, want_labels), i
            continue
        ours_text, theirs_text = tok.decode(want_ids), tok.decode(lf["input_ids"])
        assert ours_text.startswith("<|im_start|>system\n# Tools\n")
        assert theirs_text == ours_text.replace("<|im_start|>system\n", "<|im_start|>system\n\n\n", 1), i
        a, b = want_ids.index(end), lf["input_ids"].index(end)  # the end of the system turn
        assert (lf["input_ids"][b:], lf["labels"][b:]) == (want_ids[a:], want_labels[a:]), i
        assert all(t == IGNORE for t in lf["labels"][:b]), i
