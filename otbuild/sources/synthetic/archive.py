"""Archives and checksums: tar, gzip and sha256sum."""

from __future__ import annotations

import gzip
import hashlib
from typing import cast

from otbuild.tasks.taskdir import TaskDir

from ._common import EXTS, WORDS, Ctx, Family, Op, text_of

EVENTS = ("timeout", "refused", "retry", "denied", "dropped", "reset")
HOSTS = ("web1", "web2", "db1", "cache1", "edge3", "batch2")
TREE_EXTS = tuple(e for e in EXTS if e != "log")  # tar_create may exclude *.log


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(ctx: Ctx, d: str, n: int) -> dict[str, str]:
    """`n` files under `d/`, some in a subdirectory, each with a few lines of words."""
    sub = ctx.pick(WORDS)
    return {
        f"{d}/{ctx.rng.choice(('', sub + '/'))}{w}.{ctx.rng.choice(TREE_EXTS)}": ctx.lines(ctx.rng.randint(1, 4))
        for w in ctx.pick(WORDS, n)
    }


def tar_create(ctx: Ctx) -> Op:
    d = ctx.name()
    name = f"{d}-{ctx.rng.randint(2020, 2025)}.tar.gz"
    files = _tree(ctx, d, ctx.rng.randint(3, 5))
    text = (
        f"Pack the directory `/app/{d}` into the gzip-compressed tar archive `/app/{name}`; "
        f"paths inside the archive must start with `{d}/`"
    )
    logs = [f"{d}/{w}.log" for w in ctx.pick(WORDS, ctx.rng.randint(1, 2))]
    exclude = ""
    if ctx.level >= 2 and ctx.rng.random() < 0.5:
        files.update({p: ctx.lines(2) for p in logs})
        text += ". Leave the `.log` files out of the archive"
        exclude = " --exclude='*.log'"
    else:
        logs = []
    op = Op("tar_create", text + ". Keep the directory itself in place.")
    op.files = cast(dict[str, str | bytes], files)  # text contents: a files map as it is
    op.steps = [f"find {d} -type f", f"tar -czf {name}{exclude} {d}"]
    op.check("expect_tar", name, {p: c for p, c in files.items() if p not in logs}, logs)
    for p, c in files.items():
        op.check("expect_file", p, c)
    return op


def tar_extract(ctx: Ctx) -> Op:
    bundle, dest, out = f"{ctx.name()}.tar.gz", ctx.name(), f"{ctx.name()}.sha256"
    top = ctx.name()
    members = _tree(ctx, top, ctx.rng.randint(2, 4))
    target = ctx.rng.choice(sorted(members))
    packed = TaskDir("bundle")
    for p, c in members.items():
        packed.add(p, c)
    op = Op(
        "tar_extract",
        f"Extract the archive `/app/{bundle}` into a new directory `/app/{dest}/` (so its "
        f"files end up under `/app/{dest}/{top}/`). Then write the SHA-256 digest of the "
        f"extracted file `/app/{dest}/{target}` (just the 64 hex characters) to `/app/{out}`.",
    )
    op.files = {bundle: packed.pack()}
    op.steps = [
        f"mkdir -p {dest}",
        f"tar -xzf {bundle} -C {dest}",
        f"sha256sum {dest}/{target} | cut -d ' ' -f 1 > {out}",
    ]
    for p, c in members.items():
        op.check("expect_file", f"{dest}/{p}", c)
    op.check("expect_lines", out, [_sha(members[target])])
    return op


def make_manifest(ctx: Ctx) -> Op:
    d = ctx.name()
    manifest = f"{d}.sha256"
    files = {
        f"{d}/{w}.{ctx.rng.choice(EXTS)}": ctx.lines(ctx.rng.randint(1, 3))
        for w in ctx.pick(WORDS, ctx.rng.randint(3, 6))
    }
    op = Op(
        "make_manifest",
        f"Write a SHA-256 manifest of every file in `/app/{d}/` to `/app/{manifest}`, in the "
        f"format printed by `sha256sum` when run from `/app` (`<hash>  {d}/<name>`, two "
        "spaces), one line per file.",
    )
    op.files = cast(dict[str, str | bytes], files)  # text contents: a files map as it is
    op.steps = [f"ls -l {d}", f"sha256sum {d}/* > {manifest}"]
    op.check("expect_lines", manifest, [f"{_sha(c)}  {p}" for p, c in files.items()], False)
    return op


def find_corrupt(ctx: Ctx) -> Op:
    d, out = ctx.name(), f"{ctx.name()}.txt"
    manifest = f"{ctx.pick(('SHA256SUMS', 'checksums', 'MANIFEST'))}-{ctx.rng.randint(1, 9)}"
    names = [f"{d}/{w}.{ctx.rng.choice(EXTS)}" for w in ctx.pick(WORDS, ctx.rng.randint(4, 7))]
    originals = {p: ctx.lines(ctx.rng.randint(1, 3)) for p in names}
    bad = sorted(ctx.rng.sample(names, ctx.rng.randint(1, 2)))
    op = Op(
        "find_corrupt",
        f"`/app/{manifest}` lists SHA-256 checksums (in `sha256sum` format) of the files in "
        f"`/app/{d}/`, but some files have changed since. Write the paths of the files that "
        f"no longer match, exactly as listed in the manifest, sorted, one per line, to "
        f"`/app/{out}`. Do not change the files.",
    )
    op.files = {manifest: text_of(f"{_sha(c)}  {p}" for p, c in originals.items())}
    op.files.update({p: c + ctx.sentence(2) + "\n" if p in bad else c for p, c in originals.items()})
    failed = f"sha256sum -c {manifest} 2>/dev/null | grep -v ': OK$' | cut -d: -f1"
    op.steps = [f"sha256sum -c {manifest}", f"{failed} | LC_ALL=C sort > {out}"]
    op.check("expect_lines", out, bad)
    for p in names:
        op.check("expect_file", p, op.files[p])
    return op


def gzip_keep(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.{ctx.rng.choice(('txt', 'log', 'csv'))}", f"{ctx.name()}.txt"
    content = ctx.lines(ctx.rng.randint(5, 20))
    op = Op(
        "gzip_keep",
        f"Compress `/app/{f}` with gzip into `/app/{f}.gz`, keeping the original file, and "
        f"write the size of the original in bytes (just the number) to `/app/{out}`.",
    )
    op.files = {f: content}
    op.steps = [f"gzip -k {f}", f"wc -c < {f} > {out}"]
    op.check("expect_gzip", f"{f}.gz", content)
    op.check("expect_file", f, content)
    op.check("expect_lines", out, [str(len(content.encode()))])
    return op


def gz_count(ctx: Ctx) -> Op:
    f, out = f"{ctx.name()}.log.gz", f"{ctx.name()}.txt"
    event = ctx.rng.choice(EVENTS)
    lines = [
        f"2024-05-{ctx.rng.randint(1, 28):02d} {ctx.rng.choice(HOSTS)} "
        f"{ctx.rng.choice(EVENTS + ('ok', 'ok', 'ok'))} {ctx.sentence(2)}"
        for _ in range(ctx.rng.randint(15, 40))
    ]
    lines.append(f"2024-05-29 {ctx.rng.choice(HOSTS)} {event} {ctx.sentence(2)}")
    op = Op(
        "gz_count",
        f"`/app/{f}` is a gzip-compressed log. Without deleting or unpacking it on disk, count "
        f"the lines that contain the word `{event}` and write the number to `/app/{out}`.",
    )
    op.files = {f: gzip.compress(text_of(lines).encode(), mtime=0)}
    op.steps = [f"gzip -dc {f} | head -n 5", f"gzip -dc {f} | grep -c '{event}' > {out}"]
    op.check("expect_lines", out, [str(sum(event in x for x in lines))])
    op.check("expect_gzip", f, text_of(lines))
    return op


FAMILY = Family(
    name="archive",
    title="Archives and checksums",
    intro=(
        "Some files need to be packed, unpacked or verified.",
        "You are handling backups and their integrity checks.",
        "A release directory needs archiving and checksum work.",
    ),
    ops=(tar_create, tar_extract, make_manifest, find_corrupt, gzip_keep, gz_count),
)
