"""Conversations with tools through vLLM's own chat path, offline: run by .venv-vllm's python
(tests/contracts/test_vllm.py feeds it and reads its answer). No GPU, no server, no weights.

stdin (JSON): {"model": a model dir (its tokenizer and chat template), "conversations":
[{"messages", "tools", "add_generation_prompt" (default false: a request's prompt has it)}, ...],
"answers": [a model's text, ...]}. Each conversation is parsed as
vLLM's chat endpoints parse a request's messages (renderers/chat_utils.parse_chat_messages:
tool-call arguments to objects) and rendered and tokenized by its safe_apply_chat_template with
the request's tools, as its /tokenize and chat completions do; each answer is read by vLLM's
`hermes` tool parser as a chat completion with those tools would be. Writes to the file named by
its only argument {"vllm": version, "prompts": [{"ids", "text"} or {"error"}], "parsed":
[{"tools_called", "content", "tool_calls": [{"type", "name", "arguments"}]}]}.
"""

import json
import os
import sys

os.environ["VLLM_TARGET_DEVICE"] = "cpu"

from importlib.metadata import version  # noqa: E402


def main(out: str) -> None:
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    given = json.load(sys.stdin)
    model = given["model"]
    config, tok = ModelConfig(model=model, tokenizer=model), get_tokenizer(model)
    prompts = []
    for conv in given["conversations"]:
        tools = conv.get("tools")
        try:
            fmt = resolve_chat_template_content_format(
                chat_template=None, tools=tools, given_format="auto", tokenizer=tok, model_config=config
            )
            parsed, _, _ = parse_chat_messages(conv["messages"], config, content_format=fmt)
            ids = safe_apply_chat_template(
                config,
                tok,
                parsed,
                tools=tools,
                tokenize=True,
                add_generation_prompt=bool(conv.get("add_generation_prompt")),
            )
            prompts.append({"ids": list(ids), "text": tok.decode(ids)})
        except Exception as e:  # noqa: BLE001  (a refusal is the finding)
            prompts.append({"error": f"{type(e).__name__}: {e}"})
    tools = given["conversations"][0].get("tools") if given["conversations"] else None
    request = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": "x"}], tools=tools)
    parser = Hermes2ProToolParser(tok, request.tools)
    parsed_answers = []
    for text in given["answers"]:
        info = parser.extract_tool_calls(text, request)
        parsed_answers.append(
            {
                "tools_called": info.tools_called,
                "content": info.content,
                "tool_calls": [
                    {"type": c.type, "name": c.function.name, "arguments": c.function.arguments, "id": c.id}
                    for c in info.tool_calls
                ],
            }
        )
    with open(out, "w") as f:
        json.dump({"vllm": version("vllm"), "prompts": prompts, "parsed": parsed_answers}, f)


if __name__ == "__main__":
    main(sys.argv[1])
