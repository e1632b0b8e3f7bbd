"""otbuild against the real vLLM package: the pinned release (pyproject's `vllm` extra), in
.venv-vllm (scripts/vllm-env.sh, `make vllm-env`), checks with its own code every `vllm serve`
command line and request body otbuild builds for recipes/, and the reasoning parsers, tool
call parsers and quantizations the recipes name (tests/support/vllm_contract.py). No GPU needed.
A vLLM upgrade that renames a flag, a request field or a parser fails here, not in a 100K run."""

import asyncio
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from otbuild.engines import LLM
from otbuild.engines.openai import CONTEXT_OVERFLOW, OpenAIEngine, request_body
from otbuild.engines.vllm import vllm_command
from otbuild.harness import protocol
from otbuild.harness.agent import make_protocol
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.settings.engines import client_settings
from tests.conftest import REPO, pinned_release

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="vLLM is not installed in .venv-vllm: run scripts/vllm-env.sh (make vllm-env)"
)
NAMED = ("reasoning_parser", "tool_call_parser", "quantization")
WRONG = "not-otbuilds"  # the model of the known-bad items below


def run_in_vllm(script: str, given: dict, out: Path) -> dict:
    """tests/support/SCRIPT run by .venv-vllm's python on `given` (its stdin, JSON); its answer
    (the JSON it wrote to `out`). vLLM under HF_HUB_OFFLINE (which the test session sets) resolves
    each model id to a cached snapshot before checking anything; these checks are of the
    arguments and the tokenizer, not of the weights."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(REPO / "tests" / "support" / script), str(out)],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert proc.returncode == 0 and out.is_file(), (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def test_the_vllm_extra_pins_one_release():
    assert pinned_release("vllm").count(".") == 2  # e.g. 0.33.0: the release the contract test ran against


def _turn(style: str) -> list[dict]:
    """A harness conversation in the recipe's prompt style: the first prompt, an answer, a reply."""
    if style == "tools":  # the tools protocol: a tool call and its tool message
        from otbuild.harness.tools import first_prompt

        call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        return [
            {"role": "user", "content": first_prompt("Do X.", "$ ")},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "a b\n$ ", "tool_call_id": "call_1"},
        ]
    s = protocol.prompt_style(style)
    answer = s.format_answer(
        {"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\n", "duration": 1.0}], "task_complete": False}
    )
    return [
        {"role": "user", "content": s.first_prompt("Do X.", "$ ")},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": s.observation_reply("a b\n$ ")},
    ]


def recipe_requests() -> dict:
    """What otbuild would send vLLM for every recipe (ablation candidates included): each LLM
    stage's `vllm serve` command line and request bodies (a harness turn for rollouts and eval,
    one prompt for the task stages; bodies to other engines too: any of them may be a vLLM
    server), and the parser and quantization names set anywhere in recipes/."""
    commands, bodies, named = [], [], {k: set() for k in NAMED}
    for path in [*sorted((REPO / "recipes").glob("*.yaml")), _tools_recipe()]:
        for node in plan_recipe(load_recipe(path.stem, path.parent.parent)).nodes:
            llm = node.config
            engine = llm.engine if isinstance(llm, LLM) else None
            if engine in (None, "oracle"):
                continue
            if engine == "vllm":
                commands.append(vllm_command(llm, 8000))
            client = client_settings(llm)
            if node.stage in ("rollout", "eval"):
                turns = make_protocol(llm.protocol, llm.prompt)
                bodies.append(request_body(client, _turn(turns.name if turns.tools else llm.prompt), turns.request()))
            else:  # augment (seeded per request), task_score
                bodies.append(request_body(client, [{"role": "user", "content": "Rewrite: do X."}], {"seed": 7}))
        _names(yaml.safe_load(path.read_text()), named)
    return {"commands": _unique(commands), "bodies": _unique(bodies), **{f"{k}s": sorted(v) for k, v in named.items()}}


def _tools_recipe() -> Path:
    """A recipe whose vLLM teacher runs the harness's tools protocol (no shipped recipe does yet):
    its `vllm serve` flags and its requests with `tools` go through the same checks."""
    root = Path(tempfile.mkdtemp(prefix="otbuild-tools-recipe-"))
    (root / "recipes").mkdir()
    path = root / "recipes" / "tools.yaml"
    path.write_text(
        "sources:\n  a: {kind: synthetic, rank: 1, count: 4, seed: 1}\nharness: {protocol: tools}\n"
        "teacher: {engine: vllm, model: Qwen/Qwen3-8B, engine_args: {tool_call_parser: hermes}}\n"
    )
    return path


def _unique(items: list) -> list:
    return list({json.dumps(i, sort_keys=True): i for i in items}.values())


def _names(doc, named: dict) -> None:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in named and isinstance(value, str):
                named[key].add(value)
            _names(value, named)
    elif isinstance(doc, list):
        for value in doc:
            _names(value, named)


def known_bad() -> dict:
    """What the check must refuse (proof that it can fail): a flag vLLM lacks, a renamed request
    field (vLLM would drop it silently), a pattern its grammar backend cannot compile, a parser
    it does not have."""
    body = {"model": WRONG, "messages": [{"role": "user", "content": "x"}]}
    return {
        "commands": [
            ["vllm", "serve", WRONG, "--guided-decoding-backend", "x"],
            ["vllm", "serve", WRONG, "--reasoning-parser", f"{WRONG}-parser"],
        ],
        "bodies": [
            {**body, "guided_regex": "a+"},
            {**body, "structured_outputs": {"regex": "(?<=a)b"}},
            {**body, "temperature": "warm"},
        ],
        "reasoning_parsers": [f"{WRONG}-parser"],
        "tool_call_parsers": [f"{WRONG}-tools"],
        "quantizations": [f"{WRONG}-int3"],
    }


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """One run of tests/support/vllm_contract.py in .venv-vllm over the recipes' requests and the known-bad ones."""
    mine, bad = recipe_requests(), known_bad()
    given = {k: mine[k] + bad[k] for k in mine}
    return mine, bad, run_in_vllm("vllm_contract.py", given, tmp_path_factory.mktemp("vllm") / "answer.json")


@needs_vllm
@pytest.mark.slow
def test_recipes_requests_pass_vllms_own_checks(contract):
    mine, bad, answer = contract
    assert answer["vllm"] == pinned_release("vllm")
    assert len(mine["commands"]) >= 10 and len(mine["bodies"]) >= 20  # every recipe was planned
    assert any("--reasoning-parser" in c for c in mine["commands"]) and "glm45" in mine["reasoning_parsers"]
    assert any("structured_outputs" in b for b in mine["bodies"])  # thesis_smoke's constrained eval
    assert any("tools" in b and b["tool_choice"] == "auto" for b in mine["bodies"])  # the tools protocol's
    assert any("--enable-auto-tool-choice" in c and "hermes" in c for c in mine["commands"])
    assert "hermes" in mine["tool_call_parsers"]
    ours = [p for p in answer["problems"] if WRONG not in p]
    assert ours == [], "\n".join(ours)
    caught = answer["problems"]
    assert len(caught) == sum(len(v) for v in bad.values()), "\n".join(caught)
    assert any("--guided-decoding-backend" in p and "unrecognized arguments" in p for p in caught)
    assert any("would ignore field(s) guided_regex" in p for p in caught)
    assert any("Lookbehind" in p for p in caught)


@needs_vllm
@pytest.mark.slow
def test_vllms_answers_read_as_otbuild_expects(contract, scripted):
    """A chat completion with reasoning, as vLLM's response models serialize it, read by the
    openai engine; vLLM's context-window refusal is recognised as one (a failed task)."""
    *_, answer = contract
    srv = scripted([(200, answer["response"])])

    async def ask():
        async with OpenAIEngine(LLM(engine="openai", model="m", base_url=srv.base_url)) as engine:
            return await engine.complete([{"role": "user", "content": "hi"}])

    c = asyncio.run(ask())
    assert (c.text, c.reasoning, c.finish_reason) == ('{"analysis": "a"}', "first, think", "length")
    assert (c.n_input_tokens, c.n_output_tokens, c.usage_reported) == (12, 7, True)
    assert "context length" in answer["context_error"] and CONTEXT_OVERFLOW.search(answer["context_error"])


# --- the train-serve contract with tools: vLLM's own chat path against otbuild's SFT tokens ---


def tool_conversations() -> list[dict]:
    """Conversations with tools, as a trace holds them: toy tool-calling traces, one with a
    system message, text before two parallel calls and their two results, one whose arguments
    are JSON in another layout than json.dumps', and one whose arguments are not JSON."""
    from otbuild.train.toy import TOY_TOOLS, tool_trace_rows

    def call(i, args):
        return {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}

    system = {"role": "system", "content": "You are an agent in a terminal."}
    user = {"role": "user", "content": "List the files, then say where you are."}
    convs = [row["conversations"] for row in tool_trace_rows(2)]
    convs.append(
        [
            system,
            user,
            {
                "role": "assistant",
                "content": "<think>\nboth at once\n</think>\n\nI'll run two commands — «ls».",
                "tool_calls": [call(1, '{"command": "ls"}'), call(2, '{"command": "pwd"}')],
            },
            {"role": "tool", "content": "a.txt b.txt", "tool_call_id": "c1"},
            {"role": "tool", "content": "/app", "tool_call_id": "c2"},
            {"role": "assistant", "content": "<think>\nseen\n</think>\n\nTwo files, in /app."},
        ]
    )
    for args in ('{"command":"ls",  "n" : 1}', '{"command": "ls"'):
        convs.append(
            [
                user,
                {"role": "assistant", "content": "<think>\nls\n</think>\n\n", "tool_calls": [call(1, args)]},
                {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
                {"role": "assistant", "content": "<think>\ndone\n</think>\n\nDone."},
            ]
        )
    return [{"messages": c, "tools": TOY_TOOLS} for c in convs]


MALFORMED = 4  # the conversation whose arguments are not JSON
# a model's answers, read by vLLM's hermes parser and by otbuild's (otbuild/engines/toolcalls.py)
ANSWERS = [
    "Just text.",
    'I\'ll look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
    '<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "task_complete", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "bash", "arguments": {"command": "écho «ok»"}}',  # left open
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "bash"}\n</tool_call>',  # no arguments
]


@pytest.fixture(scope="module")
def tool_contract(tmp_path_factory):
    """One tiny student (otbuild's qwen3 template), its tokenized SFT set of the conversations,
    and vLLM's answer (tests/support/vllm_chat_tokens.py)."""
    from otbuild.settings.train import TinyModel
    from otbuild.traces.table import TRACE_SCHEMA, write_traces
    from otbuild.train.model import materialise
    from otbuild.train.tokenized import TokenizedSet, build_tokenized_set

    tmp = tmp_path_factory.mktemp("vllm-tools")
    convs = tool_conversations()
    rows = []
    for i, c in enumerate(convs):
        row = dict.fromkeys(TRACE_SCHEMA.names)
        row.update(conversations=c["messages"], tools=json.dumps(c["tools"]), task=f"t{i}", trial_name=f"t-{i}")
        rows.append(row)
    write_traces(tmp / "kept.parquet", rows)
    tiny = {"kind": "tiny", "vocab_size": 600, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    model = materialise(TinyModel(**tiny), tmp / "model", [tmp / "kept.parquet"])
    stats = build_tokenized_set(tmp / "kept.parquet", model, "qwen3_thinking", 4096, tmp / "tok", workers=1)
    given = {"model": str(model), "conversations": convs, "answers": ANSWERS}
    answer = run_in_vllm("vllm_chat_tokens.py", given, tmp / "answer.json")
    return convs, model, stats, TokenizedSet(tmp / "tok"), answer


@needs_vllm
@pytest.mark.slow
def test_vllms_tokens_of_a_conversation_with_tools_are_otbuilds(tool_contract):
    """vLLM's own chat path (its message parsing, the model's chat template with the request's
    tools, its tokenizer) gives, token for token, the ids otbuild's SFT trains on, arguments in
    another JSON layout included (both write the object with json.dumps). Arguments that are not
    JSON: vLLM renders {} in their place; otbuild's SFT drops that conversation."""
    from otbuild.train.model import load_tokenizer

    convs, model, stats, ours, answer = tool_contract
    assert answer["vllm"] == pinned_release("vllm")
    assert stats["dropped"]["template_mismatch"] == 1 and len(ours) == len(convs) - 1
    rows = {int(t): k for k, t in enumerate(ours._column("trace"))}  # trace row -> sequence
    tok = load_tokenizer(model)[0]
    for i, prompt in enumerate(answer["prompts"]):
        assert "error" not in prompt, prompt
        if i == MALFORMED:
            assert '{"name": "bash", "arguments": {}}' in prompt["text"]
            continue
        ids, mask = ours.seq(rows[i])
        assert prompt["ids"] == ids.tolist(), (i, prompt["text"], tok.decode(ids.tolist()))
        assert "<tool_call>" in tok.decode(ids[mask].tolist())
    assert '"arguments": {"command": "ls", "n": 1}' in answer["prompts"][3]["text"]


@needs_vllm
@pytest.mark.slow
def test_otbuilds_tool_call_parser_reads_answers_as_vllms_hermes(tool_contract):
    """otbuild serve's and the RL policy's parser against vLLM's hermes parser, answer by answer:
    the same content, call names and arguments text; ids of the same form."""
    import re

    from otbuild.engines.toolcalls import parse_tool_calls

    *_, answer = tool_contract
    for text, theirs in zip(ANSWERS, answer["parsed"], strict=True):
        content, calls = parse_tool_calls(text)
        assert (content, calls is not None) == (theirs["content"], theirs["tools_called"]), text
        ours = [
            {"type": c["type"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in calls or []
        ]
        assert ours == [{k: c[k] for k in ("type", "name", "arguments")} for c in theirs["tool_calls"]], text
        for c, t in zip(calls or [], theirs["tool_calls"], strict=True):
            assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", c["id"]) and t["id"].startswith("chatcmpl-tool-")
    assert sum(p["tools_called"] for p in answer["parsed"]) == 3  # the cases can fail both ways
