"""Text processing with grep, sed, awk, tr and friends."""

from __future__ import annotations

from collections import Counter

from ._common import PEOPLE, WORDS, Ctx, Family, Op, text_of

LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
COMPONENTS = ("auth", "db", "cache", "api", "worker", "scheduler", "mailer", "proxy")
SPELLINGS = (
    ("colour", "color"),
    ("centre", "center"),
    ("grey", "gray"),
    ("licence", "license"),
    ("catalogue", "catalog"),
    ("theatre", "theater"),
    ("organise", "organize"),
    ("defence", "defense"),
    ("programme", "program"),
    ("travelling", "traveling"),
)
PATHS = ("index.html", "login", "api/items", "static/app.js", "favicon.ico", "search", "about")


def _stamp(ctx: Ctx) -> str:
    r = ctx.rng.randint
    return f"2024-{r(1, 12):02d}-{r(1, 28):02d} {r(0, 23):02d}:{r(0, 59):02d}:{r(0, 59):02d}"


def log_level(ctx: Ctx) -> Op:
    log, out, count = f"{ctx.name(COMPONENTS)}.log", f"{ctx.name()}.log", f"{ctx.name()}.txt"
    level = ctx.rng.choice(("ERROR", "WARN"))
    lines = [
        f"{_stamp(ctx)} {ctx.rng.choice(LEVELS)} {ctx.rng.choice(COMPONENTS)}: {ctx.sentence()}"
        for _ in range(ctx.rng.randint(12, 30))
    ]
    lines.insert(ctx.rng.randrange(len(lines)), f"{_stamp(ctx)} {level} db: {ctx.sentence()}")
    picked = [x for x in lines if f" {level} " in x]
    op = Op(
        "log_level",
        f"Copy every line of the log `/app/{log}` whose level is `{level}` to `/app/{out}`, "
        f"keeping their order, and write how many such lines there are to `/app/{count}`.",
    )
    op.files = {log: text_of(lines)}
    op.steps = [f"grep ' {level} ' {log} > {out}", f"grep -c ' {level} ' {log} > {count}"]
    op.check("expect_lines", out, picked)
    op.check("expect_lines", count, [str(len(picked))])
    return op


def sed_edit(ctx: Ctx) -> Op:
    f = f"{ctx.name()}.txt"
    old, new = ctx.rng.choice(SPELLINGS)
    lines = [ctx.sentence() for _ in range(ctx.rng.randint(6, 12))]
    for _ in range(ctx.rng.randint(2, 4)):
        k = ctx.rng.randrange(len(lines))
        words = lines[k].split()
        words.insert(ctx.rng.randrange(len(words) + 1), old)
        lines[k] = " ".join(words)
    lines.insert(0, f"# {ctx.sentence(3)}")
    lines.insert(ctx.rng.randrange(1, len(lines)), f"# {old} {ctx.sentence(2)}")
    lines.insert(ctx.rng.randrange(1, len(lines)), f"{old} {ctx.sentence(4)}")  # kept, edited
    expected = [x.replace(old, new) for x in lines if not x.startswith("#")]
    op = Op(
        "sed_edit",
        f"Edit `/app/{f}` in place: replace every occurrence of `{old}` with `{new}`, and "
        "delete the comment lines (the lines that start with `#`).",
    )
    op.files = {f: text_of(lines)}
    op.steps = [f"sed -i 's/{old}/{new}/g' {f}", f"sed -i '/^#/d' {f}"]
    op.check("expect_lines", f, expected)
    return op


def awk_sum(ctx: Ctx) -> Op:
    f, total, names = f"{ctx.name()}.txt", f"{ctx.name()}.txt", f"{ctx.name()}.txt"
    teams = ctx.pick(("red", "blue", "green", "amber", "teal", "coral", "indigo"), 3)
    people = ctx.rng.sample(PEOPLE, 6)
    rows = [
        (ctx.rng.choice(people), ctx.rng.choice(teams), ctx.rng.randint(1, 40)) for _ in range(ctx.rng.randint(10, 20))
    ]
    team = rows[0][1]
    op = Op(
        "awk_sum",
        f"`/app/{f}` has three whitespace-separated columns: person, team and hours. Write "
        f"the total hours of team `{team}` to `/app/{total}`, and the distinct person names "
        f"that appear in the file, sorted, one per line, to `/app/{names}`.",
    )
    op.files = {f: text_of(f"{p} {t} {h}" for p, t, h in rows)}
    op.steps = [
        f"awk '$2 == \"{team}\" {{ s += $3 }} END {{ print s }}' {f} > {total}",
        f"awk '{{ print $1 }}' {f} | LC_ALL=C sort -u > {names}",
    ]
    op.check("expect_lines", total, [str(sum(h for _, t, h in rows if t == team))])
    op.check("expect_lines", names, sorted({p for p, _, _ in rows}))
    return op


def top_words(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.txt", f"{ctx.name()}.txt"
    n = ctx.rng.randint(2, 4)
    vocab = ctx.rng.sample(WORDS, 8)
    counts = dict(zip(vocab, ctx.rng.sample(range(1, 16), len(vocab))))  # no ties
    tokens = [w for w, c in counts.items() for _ in range(c)]
    ctx.rng.shuffle(tokens)
    lines = [" ".join(tokens[k : k + 7]) for k in range(0, len(tokens), 7)]
    top = Counter(counts).most_common(n)
    op = Op(
        "top_words",
        f"Find the {n} most frequent words in `/app/{f}` (words are separated by single "
        f"spaces and newlines) and write them to `/app/{out}`, most frequent first, one per "
        "line in the form `word count`.",
    )
    op.files = {f: text_of(lines)}
    counted = f"tr ' ' '\\n' < {f} | sort | uniq -c | sort -rn | head -n {n}"
    op.steps = [f"head -n 3 {f}", f"{counted} | awk '{{ print $2, $1 }}' > {out}"]
    op.check("expect_lines", out, [f"{w} {c}" for w, c in top])
    return op


def access_log(ctx: Ctx) -> Op:
    log, ips, total = f"{ctx.name()}.log", f"{ctx.name()}.txt", f"{ctx.name()}.txt"
    status = ctx.rng.choice((404, 500, 403))
    clients = [f"10.{ctx.rng.randint(0, 9)}.{ctx.rng.randint(0, 255)}.{ctx.rng.randint(1, 254)}" for _ in range(6)]
    rows = [(ctx.rng.choice(clients), ctx.rng.choice((200, 200, 304, status))) for _ in range(ctx.rng.randint(10, 25))]
    rows.append((clients[0], status))
    lines = [
        f'{ip} - - [12/Mar/2024:10:{k % 60:02d}:00 +0000] "GET /{ctx.rng.choice(PATHS)} '
        f'HTTP/1.1" {code} {ctx.rng.randint(100, 9000)}'
        for k, (ip, code) in enumerate(rows)
    ]
    op = Op(
        "access_log",
        f"`/app/{log}` is a web server access log (common log format). Write the distinct "
        f"client IP addresses that received a `{status}` response, sorted, one per line, to "
        f"`/app/{ips}`, and the total number of requests in the log to `/app/{total}`.",
    )
    op.files = {log: text_of(lines)}
    op.steps = [f"awk '$9 == {status} {{ print $1 }}' {log} | LC_ALL=C sort -u > {ips}", f"wc -l < {log} > {total}"]
    op.check("expect_lines", ips, sorted({ip for ip, code in rows if code == status}))
    op.check("expect_lines", total, [str(len(rows))])
    return op


def line_range(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.txt", f"{ctx.name()}.txt"
    lines = [ctx.sentence() for _ in range(ctx.rng.randint(12, 25))]
    a = ctx.rng.randint(2, 6)
    b = ctx.rng.randint(a + 2, len(lines) - 1)
    op = Op(
        "line_range",
        f"Write lines {a} to {b} (inclusive, counting from 1) of `/app/{f}` to `/app/{out}`, converted to upper case.",
    )
    op.files = {f: text_of(lines)}
    op.steps = [f"wc -l {f}", f"sed -n '{a},{b}p' {f} | tr 'a-z' 'A-Z' > {out}"]
    op.check("expect_lines", out, [x.upper() for x in lines[a - 1 : b]])
    return op


FAMILY = Family(
    name="text",
    title="Text processing",
    intro=(
        "Some logs and text files need processing on the command line.",
        "You have a handful of text files to analyse and edit.",
        "A colleague asked for a few quick text-processing jobs.",
    ),
    ops=(log_level, sed_edit, awk_sum, top_words, access_log, line_range),
)
