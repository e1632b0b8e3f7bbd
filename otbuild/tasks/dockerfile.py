"""A task's `environment/Dockerfile`: one reader (`parse`) and one policy (`local_problems`)
of what a local sandbox can run without building the image. The sandbox's layout, Harbor's
`otbuild` environment, `runnable_locally` and the base-image reader all use these two.

Reading follows Docker's rules: parser directives (`# escape=`, `# syntax=`, `# check=`) only
before anything else; the escape character (`\\`, or `` ` `` by directive) at the end of a line
continues the instruction, and comment or blank lines inside a continuation are dropped; a line
whose first non-blank character is `#` is a comment (a `#` later in a line is an argument);
keywords are case-insensitive; arguments are a JSON array when they parse as one, else shell
words; leading `--name[=value]` flags of FROM, COPY, ADD, RUN and HEALTHCHECK are split off; a
BuildKit here-document (`RUN <<EOF` ... `EOF`) is part of its instruction.

The policy. A local sandbox gives a task no image: the host's /usr stands in for the `FROM`
image (whether it can is `base_image.host_compatible`'s question) and the task's files are
placed where the Dockerfile's COPY and WORKDIR lines say, with its ENV. So a Dockerfile runs
locally only when every instruction is one the sandbox lays out or may ignore: FROM (one stage),
ARG, LABEL, USER (every command runs as the trial's one user), WORKDIR, ENV, COPY. Each other
instruction is a problem, with the reason as a short string:

- RUN, CMD, ENTRYPOINT, SHELL, EXPOSE, ... ("RUN at line 3"): a build or run step the sandbox
  does not perform. These are `skippable`: a sandbox forced onto the host's tools (Harbor's
  `--ek allow_run=true`) leaves them out and lays out the rest.
- ADD, always ("ADD of a URL at line 4", "ADD at line 4"): Docker fetches a URL and unpacks a
  local tar archive (known by its content, not its name), so ADD is never a plain COPY. Even a
  plain local-file ADD is refused, which keeps `runnable_locally` what it has always been (ADD
  was never allowed there); a task that means COPY can say COPY.
- What would put files where Docker would not: `COPY --from` (another stage or image), COPY
  flags other than --chown/--link/an octal --chmod, a COPY here-document, a second FROM (a
  multi-stage build), a WORKDIR or COPY destination under a system dir (/usr, /etc, ...: the
  host's, read-only), a `$VARIABLE` in a WORKDIR or COPY path (Docker substitutes it, the
  layout would make a dir named `$VARIABLE`). These are never skipped: the sandbox's layout
  refuses them (`LayoutError`).

ENV values are taken as written, `$VARIABLE`s included (as they always were): refusing them
would take tasks off the local sandbox that run there today.

Standard library only: Harbor's environment class imports this in its own Python.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import cast

# Top-level dirs a local sandbox takes from the host (read-only) or makes itself.
SYSTEM_TOPS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys"})
# Instructions a local sandbox lays out (WORKDIR, ENV, COPY) or may ignore.
LOCAL_KEYWORDS = frozenset({"FROM", "ARG", "LABEL", "USER", "WORKDIR", "ENV", "COPY"})
LOCAL_COPY_FLAGS = frozenset({"chown", "chmod", "link"})
DIRECTIVES = frozenset({"syntax", "escape", "check"})
FLAGGED = frozenset({"FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"})
HEREDOC_KEYWORDS = frozenset({"RUN", "COPY", "ADD"})

_DIRECTIVE = re.compile(r"#\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*?)\s*$")
_KEYWORD = re.compile(r"(\S+)\s*(.*)", re.DOTALL)
_FLAG = re.compile(r"--([A-Za-z][\w-]*)(?:=(\S*))?(?:\s+|$)")
_HEREDOC = re.compile(r"\d*<<(-?)(.+)")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://|git@", re.IGNORECASE)
_VARIABLE = re.compile(r"(?<!\\)\$(?:\{|[A-Za-z_])")


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines folded."""

    keyword: str  # upper-cased: RUN, COPY, ...
    line: int  # 1-based line it starts on
    value: str  # the text after the keyword and its flags
    flags: dict[str, str | None] = field(default_factory=dict)  # --from=x -> {"from": "x"}
    json_form: bool = False  # the value is a JSON array (`args` are its strings)
    heredocs: tuple[str, ...] = ()  # bodies of its here-documents, in order

    @property
    def args(self) -> list[str]:
        """The JSON array's strings, or the value's shell words (whitespace words when its
        quotes do not balance)."""
        if self.json_form:
            return json.loads(self.value)
        try:
            return shlex.split(self.value)
        except ValueError:
            return self.value.split()

    def at(self) -> str:
        return f"at line {self.line}"


@dataclass(frozen=True)
class Problem:
    """Why a Dockerfile cannot run in a local sandbox as it is; `str()` is the reason."""

    line: int
    reason: str  # e.g. "RUN at line 3"
    skippable: bool  # a build or run step a sandbox on the host's tools may leave out

    def __str__(self) -> str:
        return self.reason


def parse(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, in order (see the module docstring for the rules)."""
    lines = text.removeprefix("\ufeff").splitlines()
    escape, i = "\\", 0
    while i < len(lines) and (m := _DIRECTIVE.match(lines[i])) and m[1].lower() in DIRECTIVES:
        if m[1].lower() == "escape" and m[2] in ("\\", "`"):
            escape = m[2]
        i += 1
    out = []
    while i < len(lines):
        start, text_parts = i + 1, []
        line, i = lines[i], i + 1
        if _ignorable(line):
            continue
        while True:
            body = line.rstrip(" \t\r")
            if not body.endswith(escape):
                text_parts.append(line)
                break
            text_parts.append(body[:-1])
            while i < len(lines) and _ignorable(lines[i]):
                i += 1
            if i == len(lines):
                break
            line, i = lines[i], i + 1
        instruction, i = _instruction("".join(text_parts).strip(), start, lines, i)
        out.append(instruction)
    return out


def _ignorable(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _instruction(logical: str, line: int, lines: list[str], i: int) -> tuple[Instruction, int]:
    """One logical line as an Instruction, and the index after its here-documents."""
    keyword, rest = cast(re.Match[str], _KEYWORD.match(logical)).groups()  # (\S+) matches: logical lines are non-blank
    keyword = keyword.upper()
    flags: dict[str, str | None] = {}
    while keyword in FLAGGED and (m := _FLAG.match(rest)):
        flags[m[1].lower()] = m[2]
        rest = rest[m.end() :]
    heredocs = []
    if keyword in HEREDOC_KEYWORDS:
        for word in rest.split():
            if m := _HEREDOC.fullmatch(word):
                end, body = m[2].strip("\"'"), []
                while i < len(lines) and (lines[i].lstrip("\t") if m[1] else lines[i]) != end:
                    body.append(lines[i])
                    i += 1
                heredocs.append("\n".join(body) + "\n")
                i += 1  # the terminator
    return Instruction(keyword, line, rest, flags, _is_json_array(rest), tuple(heredocs)), i


def _is_json_array(value: str) -> bool:
    if not value.startswith("["):
        return False
    try:
        items = json.loads(value)
    except ValueError:
        return False
    return isinstance(items, list) and all(isinstance(x, str) for x in items)


def resolve(workdir: str, path: str) -> str:
    """`path` made absolute against `workdir`, `.` and `..` resolved (never above /)."""
    parts: list[str] = []
    for part in (PurePosixPath(workdir) / path).parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def system_path(path: str) -> bool:
    """True for / itself and paths under a dir the sandbox takes from the host."""
    parts = PurePosixPath(path).parts
    return len(parts) < 2 or parts[1] in SYSTEM_TOPS


def env_pairs(instruction: Instruction) -> dict[str, str]:
    """An ENV instruction's variables: `KEY=value ...`, or the legacy `KEY value with spaces`."""
    words = instruction.args
    if words and "=" not in words[0]:
        return {words[0]: instruction.value.split(None, 1)[1].strip() if len(words) > 1 else ""}
    return dict(w.split("=", 1) for w in words if "=" in w)


def copy_mode_executable(instruction: Instruction) -> bool | None:
    """COPY --chmod's executable bit (any x), or None without an octal --chmod."""
    mode = instruction.flags.get("chmod")
    return bool(int(mode, 8) & 0o111) if mode and re.fullmatch(r"[0-7]{3,4}", mode) else None


def local_problems(dockerfile: str | list[Instruction]) -> list[Problem]:
    """Why the Dockerfile (text or parsed) cannot run locally without building its image, in
    line order; [] when it can. See the module docstring for the policy."""
    instructions = parse(dockerfile) if isinstance(dockerfile, str) else dockerfile
    problems: list[Problem] = []
    workdir, stages = "/", 0

    def refuse(ins: Instruction, what: str, why: str = "", skippable: bool = False) -> None:
        problems.append(Problem(ins.line, f"{what} {ins.at()}" + (f" ({why})" if why else ""), skippable))

    for ins in instructions:
        key = ins.keyword
        if key == "FROM":
            stages += 1
            if stages == 2:
                refuse(ins, "a second FROM", "a multi-stage build")
        elif key == "ADD":
            url = any(_URL.match(a) for a in ins.args[:-1])
            refuse(ins, "ADD of a URL" if url else "ADD", "" if url else "Docker unpacks archives; use COPY")
        elif key not in LOCAL_KEYWORDS:
            refuse(ins, key, skippable=True)
        elif key in ("WORKDIR", "COPY") and _VARIABLE.search(ins.value):
            refuse(ins, f"a variable in {key}", "Docker substitutes it, a local sandbox cannot")
        elif key == "WORKDIR":
            workdir = resolve(workdir, ins.value)
            if workdir != "/" and system_path(workdir):
                refuse(ins, f"WORKDIR {workdir}", "a system dir")
        elif key == "COPY":
            _copy_problems(ins, workdir, refuse)
    return problems


def _copy_problems(ins: Instruction, workdir: str, refuse) -> None:
    for name, value in ins.flags.items():
        if name not in LOCAL_COPY_FLAGS:
            refuse(ins, f"COPY --{name}")
        elif name == "chmod" and copy_mode_executable(ins) is None:
            refuse(ins, f"COPY --chmod={value}", "only an octal mode is laid out")
    if ins.heredocs:
        refuse(ins, "COPY of a here-document")
    elif len(ins.args) < 2:
        refuse(ins, "COPY without a source and a destination")
    elif system_path(dest := resolve(workdir, ins.args[-1])):
        refuse(ins, f"COPY into {dest}", "the root" if dest == "/" else "a system dir")
