"""Small Python scripts; the verifier runs them on inputs the agent has not seen."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ._common import PEOPLE, WORDS, Ctx, Family, Op, heredoc, text_of

# A case is (text, args): the text goes to a file (via="file", its path is the first argument),
# to stdin (via="stdin") or is the sole argument (via="arg").
Case = tuple[str, list[str]]
PAIRS = (("Fizz", "Buzz"), ("Ping", "Pong"), ("Zip", "Zap"), ("Tick", "Tock"), ("Foo", "Bar"))


def _script_op(
    ctx: Ctx,
    name: str,
    stems: tuple[str, ...],
    spec: str,
    body: str,
    ref: Callable[[str, list[str]], object],
    case: Callable[[], Case],
    via: str,
    as_json: bool = False,
    ext: str = "txt",
) -> Op:
    script = f"{ctx.name(stems)}.py"
    data = f"{ctx.name()}.{ext}"
    out = f"{ctx.name()}.{'json' if as_json else 'txt'}"
    text, args = case()
    run = f"python3 {script} {' '.join(args)}".rstrip()
    if via == "file":
        run, where = f"python3 {script} {data} {' '.join(args)}".rstrip(), f"on `/app/{data}`"
    elif via == "stdin":
        run, where = f"{run} < {data}", f"with `/app/{data}` as its standard input"
    else:
        run, where = f'{run} "$(cat {data})"', f"with the number stored in `/app/{data}`"
    if args:
        where += f" and the argument{'s' if len(args) > 1 else ''} `{' '.join(args)}`"
    op = Op(
        name,
        f"Write a Python script `/app/{script}` that {spec}. Then run it {where} and save its output to `/app/{out}`.",
    )
    op.files = {data: text}
    op.steps = [heredoc(f"cat > {script}", f"#!/usr/bin/env python3\n{body}")]
    if ctx.level >= 2 and ctx.rng.random() < 0.5:
        op.text += " Make the script executable (it starts with `#!/usr/bin/env python3`)."
        op.steps.append(f"chmod +x {script}")
        op.check("expect_exec", script)
    op.steps.append(f"{run} > {out}")
    expected = ref(text, args)
    op.check("expect_json" if as_json else "expect_lines", out, expected if as_json else str(expected).splitlines())
    for _ in range(2):  # hidden cases
        text, args = case()
        files, stdin, argv = {}, "", list(args)
        if via == "file":
            files, argv = {"input.txt": text}, ["{tmp}/input.txt", *args]
        elif via == "stdin":
            stdin = text
        else:
            argv = [text.strip()]
        op.check("expect_output", script, argv, ref(text, args), stdin, files, as_json)
    return op


def stats(ctx: Ctx) -> Op:
    def ref(text, _args):
        nums = [int(x) for x in text.split()]
        return f"{sum(nums)} {min(nums)} {max(nums)}"

    return _script_op(
        ctx,
        "stats",
        ("stats", "numstat", "summary"),
        "takes the path of a text file with one integer per line as its only argument and "
        "prints `<sum> <min> <max>` (separated by single spaces) on one line",
        "import sys\nnums = [int(line) for line in open(sys.argv[1]) if line.strip()]\n"
        "print(sum(nums), min(nums), max(nums))\n",
        ref,
        lambda: (text_of(ctx.rng.randint(-99, 500) for _ in range(ctx.rng.randint(4, 15))), []),
        via="file",
    )


def fizz(ctx: Ctx) -> Op:
    a, b = ctx.rng.sample(range(2, 8), 2)
    wa, wb = ctx.rng.choice(PAIRS)

    def ref(text, _args):
        return "\n".join((wa * (i % a == 0) + wb * (i % b == 0)) or str(i) for i in range(1, int(text) + 1))

    return _script_op(
        ctx,
        "fizz",
        ("fizz", "counter", "sequence"),
        f"takes a positive integer N as its only argument and prints the numbers 1 to N, one "
        f"per line, except that multiples of {a} print `{wa}`, multiples of {b} print `{wb}`, "
        f"and multiples of both print `{wa}{wb}`",
        f"import sys\nfor i in range(1, int(sys.argv[1]) + 1):\n"
        f"    word = ({wa!r} if i % {a} == 0 else '') + ({wb!r} if i % {b} == 0 else '')\n"
        f"    print(word or i)\n",
        ref,
        lambda: (f"{ctx.rng.randint(10, 60)}\n", []),
        via="arg",
    )


def caesar(ctx: Ctx) -> Op:
    k = ctx.rng.randint(1, 25)

    def shift(c):
        return chr((ord(c) - 97 + k) % 26 + 97) if "a" <= c <= "z" else c

    def ref(text, _args):
        return "".join(shift(c) for c in text)

    def case():
        return text_of(
            f"{ctx.sentence().capitalize()}, {ctx.rng.randint(0, 99)}!" for _ in range(ctx.rng.randint(2, 5))
        ), []

    return _script_op(
        ctx,
        "caesar",
        ("shift", "rot", "cipher"),
        f"reads text from standard input and prints it with every lowercase letter `a`-`z` "
        f"shifted forward by {k} places in the alphabet (wrapping around from `z` to `a`); all "
        "other characters stay unchanged",
        f"import sys\nfor line in sys.stdin:\n    print(''.join(chr((ord(c) - 97 + {k}) % 26 + 97)"
        " if 'a' <= c <= 'z' else c for c in line), end='')\n",
        ref,
        case,
        via="stdin",
    )


def word_count(ctx: Ctx) -> Op:
    def ref(text, _args):
        return dict(Counter(text.lower().split()))

    def case():
        words = ctx.rng.sample(WORDS, 5)
        return text_of(
            " ".join(
                ctx.rng.choice(words).capitalize() if ctx.rng.random() < 0.3 else ctx.rng.choice(words)
                for _ in range(6)
            )
            for _ in range(ctx.rng.randint(2, 5))
        ), []

    return _script_op(
        ctx,
        "word_count",
        ("wordcount", "counts", "freq"),
        "takes a text file path as its only argument and prints a JSON object that maps each "
        "word (split on whitespace, lower-cased) to the number of times it occurs",
        "import json, sys\nfrom collections import Counter\n"
        "print(json.dumps(Counter(open(sys.argv[1]).read().lower().split())))\n",
        ref,
        case,
        via="file",
        as_json=True,
    )


def column_sum(ctx: Ctx) -> Op:
    def ref(text, args):
        header, *rows = [line.split(",") for line in text.split()]
        k = header.index(args[0])
        return str(sum(int(r[k]) for r in rows))

    def case():
        cols = ctx.rng.sample(("qty", "price", "score", "weight", "hours", "points"), 3)
        rows = [
            [ctx.rng.choice(PEOPLE)] + [str(ctx.rng.randint(0, 300)) for _ in cols]
            for _ in range(ctx.rng.randint(3, 9))
        ]
        return text_of(",".join(r) for r in [["name", *cols], *rows]), [ctx.rng.choice(cols)]

    return _script_op(
        ctx,
        "column_sum",
        ("colsum", "total", "sumcol"),
        "takes two arguments, the path of a CSV file with a header row and a column name, and "
        "prints the sum of the integer values in that column",
        "import csv, sys\nwith open(sys.argv[1], newline='') as f:\n"
        "    print(sum(int(row[sys.argv[2]]) for row in csv.DictReader(f)))\n",
        ref,
        case,
        via="file",
        ext="csv",
    )


def dedupe(ctx: Ctx) -> Op:
    def ref(text, _args):
        return "".join(dict.fromkeys(text.splitlines(keepends=True)))

    def case():
        pool = [ctx.sentence(2) for _ in range(4)]
        return text_of(ctx.rng.choice(pool) for _ in range(ctx.rng.randint(6, 12))), []

    return _script_op(
        ctx,
        "dedupe",
        ("dedupe", "uniq", "distinct"),
        "reads lines from standard input and prints each distinct line once, in the order in which they first appear",
        "import sys\nseen = set()\nfor line in sys.stdin:\n    if line not in seen:\n"
        "        seen.add(line)\n        print(line, end='')\n",
        ref,
        case,
        via="stdin",
    )


FAMILY = Family(
    name="python",
    title="Small Python utilities",
    intro=(
        "You need a few small command-line utilities written in Python.",
        "Write some small Python helper scripts and try them on the sample data.",
        "The team needs a couple of quick Python tools.",
    ),
    ops=(stats, fizz, caesar, word_count, column_sum, dedupe),
)
