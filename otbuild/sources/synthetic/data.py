"""CSV and JSON wrangling with awk, sort and small python3 snippets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._common import CITIES, PEOPLE, PRODUCTS, Ctx, Family, Op, heredoc, text_of

COLUMN_NAMES = {
    "id": ("id", "order_id", "ref", "ticket"),
    "who": ("customer", "client", "buyer", "account"),
    "place": ("city", "region", "site", "branch"),
    "amount": ("amount", "total", "price", "units"),
}


@dataclass
class Csv:
    """A random CSV table: `col[role]` is the column name, `pos[role]` its 1-based index."""

    file: str
    col: dict[str, str]
    pos: dict[str, int]
    rows: list[dict[str, Any]]  # role -> value: id and amount ints, who and place strs

    @property
    def order(self) -> list[str]:
        return sorted(self.pos, key=self.pos.__getitem__)

    def text(self, rows=None) -> str:
        lines = [",".join(self.col[r] for r in self.order)]
        for row in self.rows if rows is None else rows:
            lines.append(",".join(str(row[r]) for r in self.order))
        return text_of(lines)


def _csv(ctx: Ctx, distinct_amounts: bool = False) -> Csv:
    roles = list(COLUMN_NAMES)
    ctx.rng.shuffle(roles)
    col = {r: ctx.rng.choice(COLUMN_NAMES[r]) for r in COLUMN_NAMES}
    n = ctx.rng.randint(8, 16)
    amounts = ctx.rng.sample(range(1, 999), n) if distinct_amounts else [ctx.rng.randint(1, 500) for _ in range(n)]
    places = ctx.rng.sample(CITIES, 4)
    start = ctx.rng.randint(100, 900)
    rows = [
        {"id": start + k, "who": ctx.rng.choice(PEOPLE), "place": ctx.rng.choice(places), "amount": amounts[k]}
        for k in range(n)
    ]
    return Csv(f"{ctx.name()}.csv", col, {r: k + 1 for k, r in enumerate(roles)}, rows)


def csv_filter(ctx: Ctx) -> Op:
    t, out = _csv(ctx), f"{ctx.name()}.csv"
    place, p = t.rows[0]["place"], t.pos
    cond = f'${p["place"]} == "{place}"'
    text = f"whose `{t.col['place']}` is `{place}`"
    keep = [r for r in t.rows if r["place"] == place]
    if ctx.level >= 3:  # a second condition on the numeric column
        limit = sorted(r["amount"] for r in keep)[len(keep) // 2] - 1
        cond += f" && ${p['amount']} > {limit}"
        text += f" and whose `{t.col['amount']}` is greater than {limit}"
        keep = [r for r in keep if r["amount"] > limit]
    op = Op(
        "csv_filter",
        f"`/app/{t.file}` is a CSV file with a header row. Write the header plus every row "
        f"{text} to `/app/{out}`, keeping the original row order.",
    )
    op.files = {t.file: t.text()}
    op.steps = [f"head -n 1 {t.file} > {out}", f"awk -F, 'NR > 1 && {cond}' {t.file} >> {out}"]
    op.check("expect_lines", out, t.text(keep).splitlines())
    return op


def csv_group_sum(ctx: Ctx) -> Op:
    t, out = _csv(ctx), f"{ctx.name()}.csv"
    place, amount = t.col["place"], t.col["amount"]
    totals: dict[str, int] = {}
    for r in t.rows:
        totals[r["place"]] = totals.get(r["place"], 0) + r["amount"]
    op = Op(
        "csv_group_sum",
        f"Using `/app/{t.file}` (CSV with a header row), compute the total `{amount}` for "
        f"each `{place}` and write the result to `/app/{out}` as lines `<{place}>,<total>` "
        f"without a header, sorted by `{place}`.",
    )
    op.files = {t.file: t.text()}
    awk = (
        f"awk -F, 'NR > 1 {{ s[${t.pos['place']}] += ${t.pos['amount']} }} "
        f'END {{ for (k in s) print k "," s[k] }}\' {t.file}'
    )
    op.steps = [f"head -n 3 {t.file}", f"{awk} | LC_ALL=C sort > {out}"]
    op.check("expect_lines", out, [f"{k},{v}" for k, v in sorted(totals.items())])
    return op


def csv_sort(ctx: Ctx) -> Op:
    t, out = _csv(ctx, distinct_amounts=True), f"{ctx.name()}.csv"
    rows = sorted(t.rows, key=lambda r: -r["amount"])
    op = Op(
        "csv_sort",
        f"Write `/app/{out}`: the rows of `/app/{t.file}` sorted by `{t.col['amount']}` "
        "from highest to lowest, with the header line kept first.",
    )
    op.files = {t.file: t.text()}
    k = t.pos["amount"]
    op.steps = [f"head -n 1 {t.file} > {out}", f"tail -n +2 {t.file} | sort -t, -k{k},{k}nr >> {out}"]
    op.check("expect_lines", out, t.text(rows).splitlines())
    return op


def json_filter(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.json", f"{ctx.name()}.txt"
    users: list[dict[str, Any]] = [
        {"name": n, "age": ctx.rng.randint(18, 70), "active": ctx.rng.random() < 0.6}
        for n in ctx.rng.sample(PEOPLE, ctx.rng.randint(6, 12))
    ]
    users[0]["active"] = True
    age = max(17, min(u["age"] for u in users if u["active"]) - 1 + ctx.rng.randint(0, 5))
    users[0]["age"] = max(users[0]["age"], age + 1)
    picked = sorted(u["name"] for u in users if u["active"] and u["age"] > age)
    op = Op(
        "json_filter",
        f"`/app/{f}` holds a JSON array of user records. Write the names of the active users "
        f'(`"active": true`) older than {age} to `/app/{out}`, sorted alphabetically, one '
        "per line.",
    )
    op.files = {f: json.dumps(users, indent=2) + "\n"}
    code = (
        f"import json; users = json.load(open('{f}')); print('\\n'.join(sorted("
        f"u['name'] for u in users if u['active'] and u['age'] > {age})))"
    )
    op.steps = [f"head -n 12 {f}", f'python3 -c "{code}" > {out}']
    op.check("expect_lines", out, picked)
    return op


def csv_to_json(ctx: Ctx) -> Op:
    t, out = _csv(ctx), f"{ctx.name()}.json"
    num = t.col["amount"], t.col["id"]
    records = [{t.col[r]: v for r, v in row.items()} for row in t.rows]
    expected = [{k: (v if k in num else str(v)) for k, v in rec.items()} for rec in records]
    script = f"{ctx.name(sep='')}.py"
    op = Op(
        "csv_to_json",
        f"Convert `/app/{t.file}` (CSV with a header row) to `/app/{out}`: a JSON array with "
        f"one object per row, using the header names as keys; `{num[0]}` and `{num[1]}` must "
        "be JSON integers, the other values strings.",
    )
    op.files = {t.file: t.text()}
    body = (
        f"import csv, json\nwith open('{t.file}', newline='') as f:\n"
        f"    rows = list(csv.DictReader(f))\nfor row in rows:\n"
        f"    for key in {list(num)!r}:\n        row[key] = int(row[key])\n"
        f"with open('{out}', 'w') as f:\n    json.dump(rows, f, indent=2)\n"
    )
    op.steps = [heredoc(f"cat > {script}", body), f"python3 {script}"]
    op.check("expect_json", out, expected)
    return op


def json_group(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.json", f"{ctx.name()}.json"
    products = ctx.rng.sample(PRODUCTS, ctx.rng.randint(3, 5))
    orders: list[dict[str, Any]] = [
        {"order": 1000 + k, "product": ctx.rng.choice(products), "qty": ctx.rng.randint(1, 20)}
        for k in range(ctx.rng.randint(6, 14))
    ]
    totals: dict[str, int] = {}
    for o in orders:
        totals[o["product"]] = totals.get(o["product"], 0) + o["qty"]
    op = Op(
        "json_group",
        f"`/app/{f}` is a JSON array of orders with `product` and `qty` fields. Write the "
        f"total `qty` per product to `/app/{out}` as a JSON object mapping each product name "
        "to its total.",
    )
    op.files = {f: json.dumps(orders) + "\n"}
    body = (
        f"import json\ntotals = {{}}\nfor o in json.load(open('{f}')):\n"
        f"    totals[o['product']] = totals.get(o['product'], 0) + o['qty']\n"
        f"json.dump(totals, open('{out}', 'w'), indent=2)\n"
    )
    op.steps = [f"python3 -m json.tool {f} | head -n 15", heredoc("python3 -", body)]
    op.check("expect_json", out, totals)
    return op


FAMILY = Family(
    name="data",
    title="CSV and JSON wrangling",
    intro=(
        "A few data files need to be filtered, aggregated or converted.",
        "You are preparing some tabular and JSON data for a report.",
        "Some exported data needs cleaning up before it can be used.",
    ),
    ops=(csv_filter, csv_group_sum, csv_sort, json_filter, csv_to_json, json_group),
)
