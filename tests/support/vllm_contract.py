"""What otbuild sends vLLM, checked by vLLM's own code: run by .venv-vllm's python (vLLM and
the standard library only; tests/contracts/test_vllm.py feeds it and reads its answer).

stdin (JSON): {"commands": [argv, ...], "bodies": [body, ...], "reasoning_parsers": [...],
"tool_call_parsers": [...], "quantizations": [...]}. It writes to the file named by its only
argument (vLLM logs to stdout) {"vllm": version, "problems": [text, ...], "response": a chat
completion as vLLM's response models serialize it, "context_error": vLLM's message for a
prompt over the context window}. No GPU: vLLM's platform is its CPU one (VLLM_TARGET_DEVICE).
"""

import contextlib
import io
import json
import os
import sys

os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # vllm.platforms then resolves CpuPlatform

from importlib.metadata import version  # noqa: E402


def serve_parser():
    """`vllm serve`'s argument parser, built as vLLM's CLI builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser, serve = FlexibleArgumentParser(prog="vllm"), ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    return parser, serve


def check_command(parser, serve, argv: list[str]) -> str | None:
    from vllm.engine.arg_utils import EngineArgs

    if argv[1:2] != ["serve"]:
        return "not a `vllm serve` command line"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        return f"vLLM's argument parser refuses it: {err.getvalue().strip().splitlines()[-1]}"
    try:
        serve.validate(args)  # the checks `vllm serve` makes before loading anything
        args.model = args.model_tag  # as ServeSubcommand.cmd does
        EngineArgs.from_cli_args(args)
    except Exception as e:  # noqa: BLE001  (any refusal is the finding)
        return f"vLLM refuses it: {type(e).__name__}: {e}"
    names = [
        ("--quantization", args.quantization, known_quantizations()),
        ("--reasoning-parser", args.reasoning_parser, known_reasoning_parsers()),
        ("--tool-call-parser", args.tool_call_parser, known_tool_parsers()),
    ]
    return next(
        (
            f"{flag} {name!r} is not in vLLM {version('vllm')}"
            for flag, name, known in names
            if name and name not in known
        ),
        None,
    )


def known_quantizations() -> set[str]:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return set(QUANTIZATION_METHODS)


def known_reasoning_parsers() -> set[str]:
    from vllm.reasoning import ReasoningParserManager

    return set(ReasoningParserManager.list_registered())


def known_tool_parsers() -> set[str]:
    from vllm.tool_parsers import ToolParserManager

    return set(ToolParserManager.list_registered())


def check_body(body: dict) -> str | None:
    """vLLM's request model must accept the body and use every field of it: vLLM ignores
    unknown fields silently (a renamed field would change nothing, loudly or not)."""
    from dataclasses import fields

    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    try:
        request = ChatCompletionRequest.model_validate(body)
    except Exception as e:  # noqa: BLE001  (pydantic's, or vLLM's own VLLMValidationError)
        return f"ChatCompletionRequest refuses it: {type(e).__name__}: {e}"
    ignored = sorted(body.keys() - ChatCompletionRequest.field_names)
    if ignored:
        return f"vLLM would ignore field(s) {', '.join(ignored)}"
    structured = body.get("structured_outputs") or {}
    ignored = sorted(structured.keys() - {f.name for f in fields(StructuredOutputsParams)})
    if ignored:
        return f"vLLM would ignore structured_outputs field(s) {', '.join(ignored)}"
    try:
        params = request.to_sampling_params(body.get("max_tokens") or 16, {})
        if params.structured_outputs is not None:
            validate_xgrammar_grammar(params)  # vLLM's default backend compiles the constraint
    except Exception as e:  # noqa: BLE001
        return f"vLLM refuses its sampling parameters: {type(e).__name__}: {e}"
    return None


def response() -> dict:
    """A chat completion with a reasoning parser's output, as vLLM's server serializes it."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    message = ChatMessage(role="assistant", content='{"analysis": "a"}', reasoning="first, think")
    return json.loads(
        ChatCompletionResponse(
            model="m",
            choices=[ChatCompletionResponseChoice(index=0, message=message, finish_reason="length")],
            usage=UsageInfo(prompt_tokens=12, completion_tokens=7, total_tokens=19),
        ).model_dump_json()
    )


def context_error() -> str:
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    try:
        get_max_tokens(max_model_len=8, max_tokens=None, input_length=9, default_sampling_params={})
    except ValueError as e:
        return str(e)
    return ""


def main(out: str) -> None:
    given = json.load(sys.stdin)
    parser, serve = serve_parser()
    problems = [f"{' '.join(argv)}: {p}" for argv in given["commands"] if (p := check_command(parser, serve, argv))]
    problems += [f"{json.dumps(body)[:300]}: {p}" for body in given["bodies"] if (p := check_body(body))]
    for what, names, known in (
        ("reasoning_parser", given["reasoning_parsers"], known_reasoning_parsers()),
        ("tool_call_parser", given["tool_call_parsers"], known_tool_parsers()),
        ("quantization", given["quantizations"], known_quantizations()),
    ):
        problems += [f"{what} {n!r} is not in vLLM {version('vllm')}" for n in names if n not in known]
    with open(out, "w") as f:
        json.dump(
            {"vllm": version("vllm"), "problems": problems, "response": response(), "context_error": context_error()}, f
        )


if __name__ == "__main__":
    main(sys.argv[1])
