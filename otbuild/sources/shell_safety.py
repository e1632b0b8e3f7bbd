"""Is a shell command safe and deterministic to run in a scratch copy of a file tree?

`check_command(cmd)` is None when it is, else the reason it is not. nl2bash asks it which
reference commands get a verifier (the tree: its fixture, the current directory). Safe means,
for the whole command line:
- no expansions or substitutions (`$`, backticks, `$(..)`, `<(..)`, `~`, heredocs), no
  background `&`, subshells or assignments; only `|`, `||`, `&&`, `;` between commands;
- redirections only to /dev/null or between fds (`2>&1`); input only from relative paths;
- every program is on a read-only allowlist (`SAFE`: cat, grep, find, ls, sort, wc, head,
  sed, awk, ...), called by name, with write/exec/random options refused (sort -o/-R,
  sed -i or w/e commands, awk system/getline/redirects, uniq OUTFILE, xargs -P, find
  -delete/-fprint/-ok and time-relative tests); find -exec/-execdir and xargs are allowed
  when the command they run passes the same check;
- no absolute paths (except /dev/null) or `..` in path arguments, so it stays in the tree.
"""

from __future__ import annotations

import re

SAFE = {
    "cat", "head", "tail", "wc", "sort", "uniq", "cut", "tr", "grep", "egrep", "fgrep", "ls", "find",
    "basename", "dirname", "echo", "printf", "rev", "nl", "comm", "paste", "tac", "seq", "expr",
    "md5sum", "sha1sum", "sha256sum", "cksum", "fold", "expand", "unexpand", "join", "fmt", "diff",
    "cmp", "true", "false", "pwd", "readlink", "realpath", "du", "xargs", "sed", "awk", "cd", "test",
}  # fmt: skip
STRING_ARGS = {"echo", "printf", "expr", "tr", "test"}  # arguments are strings, not paths
PATTERN_FIRST = {"grep", "egrep", "fgrep", "sed", "awk"}  # first operand is a pattern/script
FIND_REFUSED = {"-delete", "-fprint", "-fprint0", "-fprintf", "-fls", "-ok", "-okdir", "-mtime", "-mmin",
                "-atime", "-amin", "-ctime", "-cmin", "-newer", "-anewer", "-cnewer", "-used", "-newermt",
                "-neweraa", "-newerat", "-newerct", "-newermm", "-inum", "-samefile"}  # fmt: skip
OPS = ("&&", "||", ">>", ">&", "<<", "&>", "|", ";", "&", "<", ">", "(", ")")


class Unsafe(Exception):
    pass


def _lex(cmd: str) -> list[tuple[str, str]]:
    """Shell-ish tokens: ("w", word) or ("op", operator). Raises Unsafe for expansions."""
    toks: list[tuple[str, str]] = []
    word: list[str] = []
    i, n, in_word = 0, len(cmd), False

    def end_word():
        nonlocal word, in_word
        if in_word:
            toks.append(("w", "".join(word)))
        word, in_word = [], False

    while i < n:
        c = cmd[i]
        if c in " \t":
            end_word()
            i += 1
        elif c == "\n":
            raise Unsafe("multi-line command")
        elif c == "\\":
            if i + 1 >= n:
                raise Unsafe("trailing backslash")
            word.append(cmd[i + 1])
            in_word = True
            i += 2
        elif c == "'":
            j = cmd.find("'", i + 1)
            if j < 0:
                raise Unsafe("unbalanced quote")
            word.append(cmd[i + 1 : j])
            in_word, i = True, j + 1
        elif c == '"':
            j = i + 1
            buf = []
            while j < n and cmd[j] != '"':
                if cmd[j] in "$`":
                    raise Unsafe("expansion inside double quotes")
                if cmd[j] == "\\" and j + 1 < n and cmd[j + 1] in '"\\$`':
                    j += 1
                buf.append(cmd[j])
                j += 1
            if j >= n:
                raise Unsafe("unbalanced quote")
            word.append("".join(buf))
            in_word, i = True, j + 1
        elif c in "$`":
            raise Unsafe("variable, command or arithmetic expansion")
        elif c == "~" and not in_word:
            raise Unsafe("home directory expansion")
        elif c in "|&;<>()":
            if c in "<>" and in_word and "".join(word).isdigit():  # 2>/dev/null: fd prefix
                word, in_word = [], False
            else:
                end_word()
            op = next(o for o in OPS if cmd.startswith(o, i))
            toks.append(("op", op))
            i += len(op)
        else:
            word.append(c)
            in_word = True
            i += 1
    end_word()
    return toks


def check_command(cmd: str) -> str | None:
    """None when `cmd` is safe and deterministic to run in the fixture (see module doc),
    else the reason it is not."""
    try:
        toks = _lex(cmd.strip())
        segments: list[list[str]] = [[]]
        k = 0
        while k < len(toks):
            kind, val = toks[k]
            if kind == "w":
                segments[-1].append(val)
            elif val in ("|", "||", "&&", ";"):
                segments.append([])
            elif val in (">", ">>", "&>"):
                if k + 1 >= len(toks) or toks[k + 1] != ("w", "/dev/null"):
                    raise Unsafe("output redirection to a file")
                k += 1
            elif val == ">&":
                if k + 1 >= len(toks) or toks[k + 1][1] not in ("1", "2"):
                    raise Unsafe("redirection to a file")
                k += 1
            elif val == "<":
                if k + 1 >= len(toks) or toks[k + 1][0] != "w":
                    raise Unsafe("bad input redirection")
                _check_path(toks[k + 1][1])
                k += 1
            else:
                raise Unsafe(f"operator {val!r}")
            k += 1
        if not any(segments) or any(not s for s in segments):
            raise Unsafe("empty command")
        for seg in segments:
            _check_simple(seg)
    except Unsafe as e:
        return str(e)
    return None


def _check_path(arg: str) -> None:
    if arg.startswith("/") and arg != "/dev/null":
        raise Unsafe(f"absolute path {arg!r}")
    if ".." in arg.split("/") or arg.startswith("~"):
        raise Unsafe(f"path outside the fixture {arg!r}")


def _check_simple(argv: list[str]) -> None:
    prog, args = argv[0], argv[1:]
    if "=" in prog:
        raise Unsafe("variable assignment")
    if prog not in SAFE:
        raise Unsafe(f"program {prog!r} is not on the read-only allowlist")
    if prog == "find":
        _check_find(args)
        return
    if prog == "xargs":
        rest = list(args)
        while rest and rest[0].startswith("-"):
            opt = rest.pop(0)
            if opt.startswith("-P") or opt == "--max-procs":
                raise Unsafe("xargs -P (parallel, unordered output)")
            if opt in ("-I", "-n", "-L", "-d", "-s", "-E", "-a") and rest:
                rest.pop(0)
        _check_simple(rest or ["echo"])
        return
    opts = [a for a in args if a.startswith("-") and a != "-"]
    operands = [a for a in args if not (a.startswith("-") and a != "-")]
    if prog == "sort" and any(o.startswith(("-o", "--output", "-R", "--random")) or
                              (o[1:2] != "-" and ("o" in o[1:] or "R" in o[1:])) for o in opts):  # fmt: skip
        raise Unsafe("sort -o / -R")
    if prog == "sed":
        if any(o.startswith(("-i", "--in-place")) or (o[1:2] != "-" and "i" in o[1:]) for o in opts):
            raise Unsafe("sed -i")
        scripts = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-e", "--expression")]
        scripts = scripts or operands[:1]
        for s in scripts:
            if re.search(r"(^|[;}\n])\s*(\d+|/[^/]*/|\$)?\s*[wWeRr]\b", s) or re.search(
                r"s(.).*\1.*\1[gpiImM0-9]*[we]", s
            ):
                raise Unsafe("sed script reads/writes files or runs commands")
        operands = operands[1:] if not any(a in ("-e", "--expression") for a in args) else operands
    elif prog == "awk":
        prog_text = operands[0] if operands else ""
        if re.search(r"system|getline|[|>]|-f\b", prog_text) or "-f" in opts:
            raise Unsafe("awk program with system/getline/redirection")
        operands = operands[1:]
    elif prog in PATTERN_FIRST:
        operands = operands[1:] if not any(a in ("-e", "-f") for a in args) else operands
    if prog == "uniq" and len(operands) > 1:
        raise Unsafe("uniq OUTPUT file")
    if prog not in STRING_ARGS:
        for a in operands:
            _check_path(a)


def _check_find(args: list[str]) -> None:
    i = 0
    while i < len(args):
        a = args[i]
        if a in FIND_REFUSED or a.startswith("-newer"):
            raise Unsafe(f"find {a}")
        if a in ("-exec", "-execdir"):
            j = i + 1
            while j < len(args) and args[j] not in (";", "+"):
                j += 1
            if j >= len(args):
                raise Unsafe("find -exec without ; or +")
            _check_simple([x for x in args[i + 1 : j] if x != "{}"] or ["true"])
            i = j + 1
            continue
        if a in ("-printf",) and i + 1 < len(args) and re.search(r"%[aActTi]", args[i + 1]):
            raise Unsafe("find -printf with times or inodes")
        if not a.startswith("-") and i == 0 or (not a.startswith(("-", "(", ")", "!")) and _is_start(args, i)):
            _check_path(a)
        i += 1


def _is_start(args: list[str], i: int) -> bool:
    """Is args[i] a starting point (before the first expression token)?"""
    return all(not x.startswith(("-", "(", "!")) for x in args[:i])
