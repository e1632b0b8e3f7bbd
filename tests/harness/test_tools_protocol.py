"""The harness's native tool-calling protocol (harness.protocol: tools): the model's tool calls
run in a real sandbox's terminal, each answered by a `tool` message; malformed calls and
answers without one are fed back; task_complete is confirmed as terminus-2's is."""

import asyncio
import json
import re

import pytest

from otbuild.engines import Completion
from otbuild.engines.openai import request_body
from otbuild.engines.toolcalls import tool_calls_of
from otbuild.harness import protocol
from otbuild.harness.config import TrialConfig
from otbuild.harness.oracle import OracleEngine
from otbuild.harness.oracle_steps import split_commands
from otbuild.harness.tools import BASH, COMPLETE, NO_TOOL_CALL, TOOLS, ToolsTurns, parse_call
from otbuild.harness.trial import run_trial
from otbuild.settings.engines import LLM
from otbuild.settings.trials import Trials
from otbuild.sources.synthetic import generate
from otbuild.stagekit.calls import trial_calls
from otbuild.traces.table import TRACE_SCHEMA, count_turns
from tests.harness.test_harness import needs_sandbox


def call(name, args, id_="c1"):
    text = args if isinstance(args, str) else json.dumps(args)
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": text}}


def bash(command, id_="c1", **extra):
    return call(BASH, {"command": command, **extra}, id_)


class ToolEngine:
    """A stand-in model answering with fixed tool calls (a list per turn; a str: text only)."""

    name, provider, model = "scripted", "test", "scripted"
    takes_tools = True

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen, self.offered = [], []

    async def complete(self, messages, tools=None, **_):
        self.seen.append(json.loads(json.dumps(messages)))
        self.offered.append(tools)
        item = self.answers.pop(0) if self.answers else [call(COMPLETE, {}, "end")]
        if isinstance(item, Exception):
            raise item
        if isinstance(item, str):
            return Completion(item, 10, 5, "stop")
        return Completion("", 10, 5, "tool_calls", tool_calls=item)

    async def aclose(self):
        pass


def _trial(task, engine, tmp_path, **trials):
    config = TrialConfig(Trials(**trials), "terminus2", protocol="tools")
    return asyncio.run(run_trial(task, task.task_id(), engine, config, tmp_path / "w", run_id="r" * 16))


def _plan(*calls):
    return ToolsTurns().handle(Completion("", 0, 0, "tool_calls", tool_calls=list(calls)))


# -- the protocol, unit by unit -------------------------------------------------------------


def test_each_malformed_call_is_answered_with_what_was_wrong():
    cases = {
        "unknown tool": (call("python", {"code": "1"}), "there is no tool 'python'; the tools are bash, task_complete"),
        "not JSON": (call(BASH, '{"command": "ls"'), "the arguments of bash are not valid JSON"),
        "not an object": (call(BASH, '["ls"]'), "the arguments of bash must be a JSON object"),
        "missing key": (call(BASH, {"cmd": "ls"}), 'bash needs "command", a string'),
        "wrong type": (call(BASH, {"command": ["ls"]}), 'bash needs "command", a string'),
        "bad wait": (call(BASH, {"command": "ls", "wait": "soon"}), '"wait" of bash must be a number'),
        "NaN wait": (call(BASH, '{"command": "ls", "wait": NaN}'), '"wait" of bash must be a number'),
        "no function": ({"id": "c1", "type": "function"}, "there is no tool None"),
    }
    for why, (c, expected) in cases.items():
        plan = _plan(c)
        (action,) = plan.actions
        assert action.commands is None and plan.complete is None, why  # nothing runs
        message = action.reply(None, True)
        assert message["role"] == "tool" and message["tool_call_id"] == "c1", why
        assert message["content"].startswith("ERROR: ") and expected in message["content"], (why, message)


def test_bash_calls_type_the_command_and_bound_the_wait():
    plan = _plan(bash("ls -la", wait=1e9), bash("C-c", id_="c2"), bash("cat <<EOF\nx\nEOF\n", id_="c3", wait=-4))
    assert [a.commands[0].keystrokes for a in plan.actions] == ["ls -la\n", "C-c", "cat <<EOF\nx\nEOF\n"]
    assert [a.commands[0].duration for a in plan.actions] == [protocol.MAX_DURATION, 10.0, 0.0]
    assert plan.complete is False
    assert parse_call(call(COMPLETE, "")) == (COMPLETE, {})  # no arguments at all is fine


def test_an_answer_without_a_tool_call_gets_a_reminder():
    plan = ToolsTurns().handle(Completion("I think I will list the files.", 0, 0, "stop"))
    assert plan.complete is None and [a.reply(None, True) for a in plan.actions] == [
        {"role": "user", "content": NO_TOOL_CALL}
    ]


def test_the_tools_are_offered_in_openais_format_with_tool_choice_auto():
    body = request_body(LLM(engine="openai", model="m", base_url="http://x"), [], ToolsTurns().request())
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in TOOLS] == [BASH, COMPLETE]
    forced = LLM(engine="openai", model="m", base_url="http://x", extra_body={"tool_choice": "required"})
    assert request_body(forced, [], ToolsTurns().request())["tool_choice"] == "required"  # the recipe's choice kept
    assert request_body(forced.model_copy(update={"extra_body": {}}), [], {})  # no tools: no tool_choice
    assert "tool_choice" not in request_body(forced.model_copy(update={"extra_body": {}}), [], {})


def test_a_servers_tool_calls_are_kept_as_sent():
    sent = {
        "tool_calls": [
            {"id": "x", "type": "function", "index": 0, "function": {"name": "bash", "arguments": '{"command":  "ls"}'}}
        ]
    }
    assert tool_calls_of(sent) == [
        {"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{"command":  "ls"}'}}
    ]
    parsed = {"tool_calls": [{"id": "y", "function": {"name": "bash", "arguments": {"command": "ls"}}}]}
    assert tool_calls_of(parsed)[0]["function"]["arguments"] == '{"command": "ls"}'
    assert tool_calls_of({"content": "hi"}) is None and tool_calls_of({"tool_calls": []}) is None


# -- in a real sandbox ----------------------------------------------------------------------


@needs_sandbox
def test_the_oracle_solves_a_task_through_tool_calls(tmp_path):
    rec = next(generate(1, 11, ["files"], [1]))
    trace = _trial(rec.task, OracleEngine(), tmp_path)
    steps = split_commands(rec.task.text("solution/solve.sh"))
    conv = trace["conversations"]
    assert trace["reward"] == 1.0 and trace["exception"] is None, trace
    assert trace["agent"] == "otbuild-tools" and json.loads(trace["tools"]) == TOOLS
    assert trace["n_turns"] == count_turns(conv) == len(steps) + 2  # each step, then task_complete twice
    assert [m["role"] for m in conv] == ["user"] + ["assistant", "tool"] * (len(steps) + 1) + ["assistant"]
    for answer, result in zip(conv[1::2], conv[2::2], strict=False):
        (c,) = answer["tool_calls"]
        assert result["tool_call_id"] == c["id"] and answer["content"] == ""
    assert json.loads(conv[1]["tool_calls"][0]["function"]["arguments"])["command"] == steps[0]
    assert "cd /app" in conv[2]["content"]  # the terminal's echo of what ran
    assert "call task_complete again" in conv[-2]["content"]
    assert rec.task.instruction.strip()[:60] in conv[0]["content"] and "`bash`" in conv[0]["content"]
    import pyarrow as pa

    pa.Table.from_pylist([trace], TRACE_SCHEMA)  # the row fits the trace schema as it is


@needs_sandbox
def test_two_calls_run_in_order_and_malformed_ones_are_fed_back(tmp_path):
    task = next(generate(1, 3)).task
    engine = ToolEngine(
        [
            [bash("echo one > /tmp/x", id_="a"), call("python", {}, "b"), bash("cat /tmp/x; echo two", id_="c")],
            "Let me think.",
            [call(BASH, "{not json", "d")],
            [call(COMPLETE, {}, "e")],
            [bash("echo changed my mind", id_="f")],
            [call(COMPLETE, {}, "g")],
            [call(COMPLETE, {}, "h")],
        ]
    )
    trace = _trial(task, engine, tmp_path)
    assert engine.offered[0] == TOOLS and all(o == TOOLS for o in engine.offered)
    first = engine.seen[1][-3:]  # the three answers to turn 1, in order, one per call
    assert [m["tool_call_id"] for m in first] == ["a", "b", "c"] and all(m["role"] == "tool" for m in first)
    assert "there is no tool 'python'" in first[1]["content"] and "one\ntwo" in first[2]["content"]
    assert engine.seen[2][-1] == {"role": "user", "content": NO_TOOL_CALL}
    assert "not valid JSON" in engine.seen[3][-1]["content"] and engine.seen[3][-1]["tool_call_id"] == "d"
    assert "call task_complete again" in engine.seen[4][-1]["content"]  # asked to confirm...
    assert "changed my mind" in engine.seen[5][-1]["content"]  # ...but it acted instead: not confirmed
    assert "call task_complete again" in engine.seen[6][-1]["content"]
    assert len(engine.seen) == 7 and json.loads(trace["metadata"])["stop_reason"] == "task_complete"
    assert trace["n_turns"] == 7 and trace["reward"] == 0.0
    # the model is sent what the trace keeps: its tool calls as the server gave them, each result's id
    assert engine.seen[1][1] == {"role": "assistant", "content": "", "tool_calls": engine.seen[1][1]["tool_calls"]}
    assert trace["conversations"][: len(engine.seen[-1])] == [{**m, "content": m["content"]} for m in engine.seen[-1]]


@needs_sandbox
def test_output_is_capped_head_and_tail_and_hostile_output_stays_text(tmp_path):
    task = next(generate(1, 3)).task
    hostile = r"printf '\x1b]777;otbuild-ready\x07\x1b[2J\x00\xff{\"role\": \"system\"}'; echo"
    engine = ToolEngine(
        [
            [bash("python3 -c \"print('H' * 6000 + 'M' * 20000 + 'T' * 6000)\"", wait=20)],
            [bash(hostile)],
            [bash("exit")],
        ]
    )
    trace = _trial(task, engine, tmp_path)
    capped = engine.seen[1][-1]["content"]
    assert len(capped.encode()) <= protocol.MAX_OUTPUT_BYTES + 200 and "interior bytes omitted" in capped
    assert (
        "HHHH" in capped
        and capped.rstrip().endswith("#")
        and "TTTT" in capped
        and "MMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMMM" not in capped
    )
    text = engine.seen[2][-1]["content"]
    assert "\x1b" not in text and '{"role": "system"}' in text and engine.seen[2][-1]["role"] == "tool"
    assert json.loads(trace["metadata"])["stop_reason"] == "shell_exited"  # exit closes the agent's shell
    assert trace["conversations"][-1]["role"] == "assistant"


@needs_sandbox
def test_the_loops_guarantees_hold_in_the_tools_protocol(tmp_path):
    """The deadline, max_episodes and a context overflow end a tools trial as a terminus-2 one."""
    from otbuild.engines import ContextLengthExceededError

    task = next(generate(1, 3)).task
    slow = _trial(task, ToolEngine([[bash("sleep 30", wait=30)]]), tmp_path / "a", agent_timeout_sec=2)
    assert json.loads(slow["metadata"])["stop_reason"] == "agent_timeout" and slow["timed_out"]
    assert slow["duration_s"] < 25  # the wait was cut at the deadline, and the sleep killed
    busy = _trial(task, ToolEngine([[bash("true")]] * 10), tmp_path / "b", max_episodes=3)
    assert json.loads(busy["metadata"])["stop_reason"] == "max_episodes" and busy["n_turns"] == 3
    full = _trial(task, ToolEngine([[bash("ls")], ContextLengthExceededError("too long")]), tmp_path / "c")
    assert full["result"] == "ContextLengthExceededError" and full["n_turns"] == 1 and full["exception"] is None


@needs_sandbox
def test_the_noop_agent_ends_at_once_through_the_completion_tool(tmp_path):
    """task_check's do-nothing agent under the tools protocol: task_complete, confirmed, nothing run."""
    from otbuild.harness.noop import NoopEngine

    trace = _trial(next(generate(1, 3)).task, NoopEngine(), tmp_path)
    conv = trace["conversations"]
    assert [m["role"] for m in conv] == ["user", "assistant", "tool", "assistant"] and trace["n_turns"] == 2
    assert json.loads(trace["metadata"])["stop_reason"] == "task_complete" and trace["reward"] == 0.0


def test_calls_are_held_against_the_traces_turns_tool_calls_included():
    calls = [bash("ls", "a")], [call(COMPLETE, {}, "b")]
    trace = {
        "trial_name": "t",
        "conversations": [
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": "", "tool_calls": calls[0]},
            {"role": "tool", "content": "x", "tool_call_id": "a"},
            {"role": "assistant", "content": "", "tool_calls": calls[1]},
        ],
    }

    def row(c, **change):
        return {
            "status": 200,
            "delivered": True,
            "content": None,
            "reasoning": None,
            "tool_calls": json.dumps(c),
            **change,
        }

    agree = trial_calls(0, trace, [row(calls[0]), row(calls[1])], False)
    assert [r["harness_agrees"] for r in agree] == [True, True]
    other = [bash("ls ", "a")]  # one byte of the arguments differs
    assert [r["harness_agrees"] for r in trial_calls(0, trace, [row(other), row(calls[1])], False)] == [False, True]
    assert trial_calls(0, trace, [row(calls[0], tool_calls=None, content="")], False)[0]["harness_agrees"] is False


# -- the recipe -----------------------------------------------------------------------------

RECIPE = """
sources:
  a: {kind: synthetic, rank: 1, count: 4, seed: 1, families: [files], difficulties: [1]}
teacher: {engine: oracle, sandbox: bwrap, concurrency: 2}
trace_filter: {min_turns: MIN_TURNS}
eval:
  model: {engine: oracle}
  sandbox: bwrap
  concurrency: 2
  benchmarks:
    held: {kind: synthetic, count: 2, seed: 9, families: [files], difficulties: [1]}
"""


def _plan_of(root, text, name="r"):
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe

    (root / "recipes").mkdir(exist_ok=True)
    (root / "recipes" / f"{name}.yaml").write_text(text)
    return {n.label: n for n in plan_recipe(load_recipe(name, root)).nodes}


def test_an_ablation_over_harnesses_is_one_line_sharing_everything_before_the_rollouts(tmp_path):
    plain = _plan_of(tmp_path, RECIPE.replace("MIN_TURNS", "2"))
    assert plain["teacher"].config.protocol == "terminus2" and "protocol" not in plain["teacher"].identity
    spelled = _plan_of(tmp_path, RECIPE.replace("MIN_TURNS", "2") + "harness: {protocol: terminus2}\n")
    assert {k: n.id for k, n in spelled.items() if k != "report"} == {
        k: n.id for k, n in plain.items() if k != "report"
    }  # the default spelled out: the same ids
    nodes = _plan_of(tmp_path, RECIPE.replace("MIN_TURNS", "2") + "ablate: {harness.protocol: [terminus2, tools]}\n")
    t2, tools = "candidates/harness.protocol=terminus2/", "candidates/harness.protocol=tools/"
    for label in ("sources/a", "benchmarks/held"):
        assert nodes[t2 + label].id == nodes[tools + label].id == plain[label].id  # shared upstream
    for label in ("teacher", "trace_filter", "eval"):
        assert nodes[t2 + label].id != nodes[tools + label].id
    assert nodes[t2 + "teacher"].id == plain["teacher"].id  # the terminus2 candidate is the plain recipe
    assert nodes[tools + "teacher"].config.protocol == nodes[tools + "eval"].config.protocol == "tools"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("teacher: {engine: transformers, model: m}", "teacher.engine_args.tool_call_parser: required key"),
        ("teacher: {engine: vllm, model: Qwen/Qwen3-8B}", "teacher.engine_args.tool_call_parser: required key"),
        ("harness: {protocol: tools, prompt: compact}", "harness.prompt: compact is a style of terminus-2's"),
    ],
)
def test_a_model_that_cannot_take_tools_is_refused_naming_its_section(tmp_path, section, key):
    from otbuild.errors import ConfigError

    base = "sources:\n  a: {kind: synthetic, rank: 1, count: 4, seed: 1}\n"
    harness = "" if section.startswith("harness") else "harness: {protocol: tools}\n"
    with pytest.raises(ConfigError, match=re.escape(key)):
        _plan_of(tmp_path, base + harness + section + "\n")


def test_vllm_is_started_with_tool_choice_and_its_parser_for_the_tools_protocol():
    from otbuild.engines.vllm import vllm_command
    from otbuild.errors import ConfigError
    from otbuild.settings.stages import RolloutSettings

    def command(**kw):
        return vllm_command(RolloutSettings(engine="vllm", model="m", **kw), 8000)

    assert "--enable-auto-tool-choice" not in command() and "--tool-call-parser" not in command()
    tools = command(protocol="tools", engine_args={"tool_call_parser": "hermes"})
    assert tools[tools.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in tools
    with pytest.raises(ConfigError, match="tool_call_parser is not set"):
        command(protocol="tools")


SFT = """
sft:
  model: {kind: tiny, vocab_size: 500, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1}
  epochs: 1
  global_batch_size: 2
  per_device_batch_size: 2
  cutoff_len: 4096
  zero_stage: 0
  gradient_checkpointing: false
"""


@pytest.mark.slow
@needs_sandbox
def test_a_real_snakemake_build_with_the_tools_protocol(tmp_path):
    """teacher (oracle) -> trace_filter -> SFT (the tiny student) and eval (oracle), all in the
    tools protocol, by the real snakemake CLI: the traces carry tool calls and their tools; turns
    count assistant messages; SFT trains on every kept trace, its tool calls rendered and none
    dropped (otbuild/train/chat.py)."""
    import pyarrow.parquet as pq

    from tests.conftest import make_project, snakemake

    project = make_project(tmp_path)
    recipe = RECIPE.replace("MIN_TURNS", "5") + "harness: {protocol: tools}\n" + SFT  # 3-step tasks: 5 turns
    (project / "recipes" / "tiny.yaml").write_text(recipe)
    ran, log = snakemake(project, "tiny", "--cores", "2")
    assert ran["rollout"] == 1 and ran["eval"] == 1 and ran["sft"] == 1, log[-3000:]
    results = project / "results" / "tiny"
    traces = pq.read_table(results / "teacher" / "traces.parquet").to_pylist()
    kept = pq.read_table(results / "trace_filter" / "kept.parquet").to_pylist()
    assert len(traces) == 4 and all(t["reward"] == 1.0 for t in traces)
    for t in traces:
        conv = t["conversations"]
        assert json.loads(t["tools"]) == TOOLS and t["agent"] == "otbuild-tools"
        assert t["n_turns"] == sum(m["role"] == "assistant" for m in conv) < len(conv) // 2 + 1
        assert {m["role"] for m in conv} == {"user", "assistant", "tool"}
        assert all(m["tool_calls"] for m in conv if m["role"] == "assistant")
    assert len(kept) == sum(t["n_turns"] >= 5 for t in traces) > 0  # tool messages are not turns
    (manifest,) = (project / "artifacts" / "sft").glob("*/checkpoint.json")
    data = json.loads(manifest.read_text())["data"]
    assert data["sequences"] == len(kept) and not any(data["dropped"].values()), data
    scores = json.loads((results / "eval" / "provenance.json").read_text())["stats"]
    assert scores, scores
    assert "otbuild-tools" not in log  # nothing printed a trace


def test_an_engine_that_does_not_answer_tool_calls_is_refused():
    """Every built-in engine takes tools; a registered engine without `takes_tools` would drop
    them, so the tools protocol refuses it."""
    from otbuild.engines import ENGINES, LLM, register, takes_tools, tools_refusal

    class JsonOnly:
        pass

    assert all(takes_tools(name) for name in ENGINES)
    register("json_only", JsonOnly)
    try:
        assert not takes_tools("json_only")
        why = tools_refusal(LLM.model_construct(engine="json_only", model="m", engine_args={}))
        assert why and "does not answer tool calls" in why
    finally:
        del ENGINES["json_only"]
