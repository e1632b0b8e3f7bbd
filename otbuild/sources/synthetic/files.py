"""File and directory manipulation: moving, deleting, renaming, copying, permissions."""

from __future__ import annotations

from ._common import EXTS, WORDS, Ctx, Family, Op


def _seed_files(ctx: Ctx, d: str, names: list[str]) -> dict[str, str | bytes]:
    """`{d}/{name}: content` with a line or two of random words each."""
    return {f"{d}/{n}": ctx.lines(ctx.rng.randint(1, 3)) for n in names}


def move_by_ext(ctx: Ctx) -> Op:
    src, dst = ctx.name(), ctx.name()
    ext, *other = ctx.rng.sample(EXTS, 3)
    moved = [f"{w}.{ext}" for w in ctx.pick(WORDS, ctx.rng.randint(2, 4))]
    kept = [f"{w}.{ctx.rng.choice(other)}" for w in ctx.pick(WORDS, ctx.rng.randint(2, 4))]
    op = Op(
        "move_by_ext",
        f"Move every `.{ext}` file from `/app/{src}/` into a new directory `/app/{dst}/`, "
        f"keeping the file names. The other files stay in `/app/{src}/`.",
    )
    op.files = _seed_files(ctx, src, moved + kept)
    op.steps = [f"mkdir -p {dst}", f"mv {src}/*.{ext} {dst}/"]
    for n in moved:
        op.check("expect_file", f"{dst}/{n}", op.files[f"{src}/{n}"])
        op.check("expect_absent", f"{src}/{n}")
    for n in kept:
        op.check("expect_file", f"{src}/{n}", op.files[f"{src}/{n}"])
    return op


def delete_nested(ctx: Ctx) -> Op:
    d, listing = ctx.name(), f"{ctx.name()}.txt"
    junk = ctx.rng.choice(("bak", "tmp", "swp", "orig", "old"))
    subdirs = ["", *(f"{w}/" for w in ctx.pick(WORDS, 2))]
    junk_paths, keep_paths = [], []
    for sub in subdirs:
        junk_paths += [f"{d}/{sub}{w}.{junk}" for w in ctx.pick(WORDS, ctx.rng.randint(1, 2))]
        keep_paths += [f"{d}/{sub}{w}.txt" for w in ctx.pick(WORDS, ctx.rng.randint(1, 2))]
    op = Op(
        "delete_nested",
        f"Delete every file whose name ends in `.{junk}` anywhere under `/app/{d}/` "
        f"(subdirectories included). Then write the sorted list of the files that remain "
        f"under it, as paths relative to `/app` (like `{keep_paths[0]}`), one per line, to "
        f"`/app/{listing}`.",
    )
    op.files = {p: ctx.lines(1) for p in junk_paths + keep_paths}
    op.steps = [f"find {d} -type f -name '*.{junk}' -delete", f"find {d} -type f | LC_ALL=C sort > {listing}"]
    for p in junk_paths:
        op.check("expect_absent", p)
    op.check("expect_lines", listing, sorted(keep_paths))
    return op


def rename_ext(ctx: Ctx) -> Op:
    d, count = ctx.name(), f"{ctx.name()}.txt"
    old, new = ctx.rng.sample(EXTS, 2)
    renamed = ctx.pick(WORDS, ctx.rng.randint(2, 4))
    already = ctx.pick(WORDS, ctx.rng.randint(0, 2))
    op = Op(
        "rename_ext",
        f"In `/app/{d}/`, rename every `.{old}` file to the same name with the extension "
        f"`.{new}` (so `{renamed[0]}.{old}` becomes `{renamed[0]}.{new}`). Then write the "
        f"number of `.{new}` files now in `/app/{d}/` to `/app/{count}`.",
    )
    op.files = _seed_files(ctx, d, [f"{w}.{old}" for w in renamed] + [f"{w}.{new}" for w in already])
    op.steps = [f'for f in {d}/*.{old}; do mv "$f" "${{f%.{old}}}.{new}"; done', f"ls {d}/*.{new} | wc -l > {count}"]
    for w in renamed:
        op.check("expect_file", f"{d}/{w}.{new}", op.files[f"{d}/{w}.{old}"])
        op.check("expect_absent", f"{d}/{w}.{old}")
    op.check("expect_lines", count, [str(len(renamed) + len(already))])
    return op


def backup_and_chmod(ctx: Ctx) -> Op:
    d = ctx.name()
    backup = f"{d}_backup"
    scripts = [f"{w}.sh" for w in ctx.pick(WORDS, ctx.rng.randint(1, 3))]
    others = [f"{w}.{ctx.rng.choice(EXTS)}" for w in ctx.pick(WORDS, ctx.rng.randint(1, 3))]
    op = Op(
        "backup_and_chmod",
        f"Make a complete copy of the directory `/app/{d}` at `/app/{backup}` (same file "
        f"names and contents), then make every `.sh` file in the original `/app/{d}/` "
        "executable.",
    )
    op.files = {f"{d}/{s}": f"#!/bin/sh\necho {ctx.sentence(3)}\n" for s in scripts}
    op.files.update(_seed_files(ctx, d, others))
    op.steps = [f"cp -r {d} {backup}", f"chmod +x {d}/*.sh"]
    for rel, content in op.files.items():
        op.check("expect_file", backup + rel[len(d) :], content)
    for s in scripts:
        op.check("expect_exec", f"{d}/{s}")
    return op


def drop_empty(ctx: Ctx) -> Op:
    d, out = ctx.name(), f"{ctx.name()}.txt"
    empty = [f"{w}.{ctx.rng.choice(EXTS)}" for w in ctx.pick(WORDS, ctx.rng.randint(1, 3))]
    full = [f"{w}.{ctx.rng.choice(EXTS)}" for w in ctx.pick(WORDS, ctx.rng.randint(2, 4))]
    op = Op(
        "drop_empty",
        f"Remove the empty (zero-byte) files from `/app/{d}/`. Then write the names of the "
        f"files that remain there (just the names, sorted, one per line) to `/app/{out}`.",
    )
    op.files = {**{f"{d}/{n}": "" for n in empty}, **_seed_files(ctx, d, full)}
    op.steps = [f"find {d} -type f -empty -delete", f"ls {d} | LC_ALL=C sort > {out}"]
    for n in empty:
        op.check("expect_absent", f"{d}/{n}")
    op.check("expect_lines", out, sorted(full))
    return op


def by_year(ctx: Ctx) -> Op:
    d = ctx.name()
    years = sorted(ctx.rng.sample(range(2015, 2025), ctx.rng.randint(2, 3)))
    names = []
    for w in ctx.pick(WORDS, ctx.rng.randint(4, 6)):
        y, m, day = ctx.rng.choice(years), ctx.rng.randint(1, 12), ctx.rng.randint(1, 28)
        names.append(f"{y}-{m:02d}-{day:02d}_{w}.{ctx.rng.choice(('txt', 'md', 'csv'))}")
    names += [f"{years[0]}-01-01_{ctx.pick(WORDS)}.txt"]  # every year used at least once
    op = Op(
        "by_year",
        f"The files in `/app/{d}/` are named `YYYY-MM-DD_<name>`, from the years "
        f"{', '.join(map(str, years))}. Move each one into a subdirectory of `/app/{d}/` named "
        f"after its year (for example `/app/{d}/{years[0]}/`), keeping the file name.",
    )
    op.files = _seed_files(ctx, d, names)
    ys = " ".join(str(y) for y in years)
    op.steps = [f"for y in {ys}; do mkdir -p {d}/$y; done", f"for y in {ys}; do mv {d}/$y-* {d}/$y/; done"]
    for n in names:
        op.check("expect_file", f"{d}/{n[:4]}/{n}", op.files[f"{d}/{n}"])
        op.check("expect_absent", f"{d}/{n}")
    return op


FAMILY = Family(
    name="files",
    title="File housekeeping",
    intro=(
        "A few directories on this machine need tidying up.",
        "You are cleaning up a shared workspace.",
        "Some files need to be reorganised.",
    ),
    ops=(move_by_ext, delete_nested, rename_ext, backup_and_chmod, drop_empty, by_year),
)
