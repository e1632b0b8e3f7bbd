"""Experiment tracking (otbuild/train/tracking.py): SFT and RL write TensorBoard event files
beside their checkpoints, read back with TensorBoard's own reader; wandb in offline mode writes
its run under the configured dir, read back from its transaction log; the settings are
execution-only (no content id changes)."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from otbuild.settings.stages import SftSettings
from otbuild.settings.train import Tracking
from otbuild.train.toy import write_toy_traces
from otbuild.train.tracking import Tracker, tag
from tests.train.test_sft import FAST

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    return write_toy_traces(tmp_path_factory.mktemp("traces") / "kept.parquet", 12, full_prompt=False)


def _log(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "train_log.jsonl").read_text().splitlines()]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows for `logdir`: tag -> [(step, value)] (its own reader)."""
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_sft_writes_event_files_that_tensorboard_reads_and_the_manifest_lists(tmp_path, traces):
    from otbuild.hashing import file_sha256
    from otbuild.stages.sft import run

    out = tmp_path / "ck"
    run(SftSettings(**FAST), [traces], out)
    log = _log(out)
    shown = scalars(out)
    for key in ("loss", "lr", "grad_norm", "tokens_per_second", "tokens_seen"):
        assert shown[tag(key)] == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in log], key
    # the Hugging Face Trainer's tag names: curves from both tools line up
    assert {"train/loss", "train/learning_rate", "train/grad_norm"} <= set(shown) and "train/lr" not in shown
    assert all(r["tokens_per_second"] > 0 for r in log)
    manifest = json.loads((out / "checkpoint.json").read_text())
    events = sorted(p.name for p in out.glob("events.out.tfevents.*"))
    assert len(events) == 1 and manifest["tracking"]["tensorboard"]["files"] == events
    assert manifest["files"][events[0]] == file_sha256(out / events[0])  # part of the artifact
    assert "wandb" not in manifest["tracking"] and not (out / "wandb").exists()


def test_event_files_are_in_the_provenance_record_and_verify(tmp_path, traces):
    """Through the stage runner (as a rule runs it): the record covers the event files and
    `otbuild audit --verify` (provenance.check, rehashing) proves the artifact; a changed
    event file is drift."""
    from otbuild.provenance import check
    from otbuild.runner import run_spec

    out = tmp_path / "sft" / ("0a" * 8)
    spec = {
        "stage": "sft",
        "id": "0a" * 8,
        "outdir": str(out),
        "settings": {**FAST, "max_steps": 2},
        "inputs": [{"path": str(traces), "id": "1b" * 8, "stage": "trace_filter"}],
    }
    record = run_spec(spec)
    (event,) = out.glob("events.out.tfevents.*")
    assert str(event) in {o["path"] for o in record["outputs"]}
    assert check(out, "sft", verify=True).status == "ok"
    with open(event, "ab") as f:
        f.write(b"x")
    res = check(out, "sft", verify=True)
    assert res.status == "drifted" and event.name in res.detail


def test_tensorboard_off_writes_no_event_files(tmp_path, traces):
    from otbuild.train.sft import train

    manifest = train(
        SftSettings(**{**FAST, "max_steps": 1, "tracking": {"tensorboard": False}}), [traces], tmp_path / "ck"
    )
    assert manifest["tracking"] == {} and not list((tmp_path / "ck").glob("events.*"))


def test_a_resumed_run_shows_each_step_once_with_the_new_values(tmp_path):
    first = Tracker(Tracking(), stage="sft", outdir=tmp_path, first_step=1, config={})
    for s in range(1, 8):  # killed after step 7; its last checkpoint was step 4
        first.log({"step": s, "loss": 10.0 + s})
    first.writer.flush()  # what a kill -9 leaves: the events written so far
    # a resumed run starts later: its event file's name (whole seconds first, then the host, the
    # pid and a per-process counter, compared as text) sorts after; in one process within one
    # second the counters decide, and "…10" sorts before "…9"
    time.sleep(1.01 - time.time() % 1)
    again = Tracker(Tracking(), stage="sft", outdir=tmp_path, first_step=5, config={})
    for s in range(5, 10):
        again.log({"step": s, "loss": 20.0 + s, "note": "text is not a scalar", "ok": True})
    summary = again.close()
    assert len(summary["tensorboard"]["files"]) == 2 and len(summary["tensorboard"]["this_run"]) == 1
    first.close()
    assert scalars(tmp_path) == {
        "train/loss": [
            (1, 11.0),
            (2, 12.0),
            (3, 13.0),
            (4, 14.0),
            (5, 25.0),
            (6, 26.0),
            (7, 27.0),
            (8, 28.0),
            (9, 29.0),
        ]
    }


# --- wandb, offline -----------------------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a wandb transaction log (`run-ID.wandb`): a ':W&B' header, then LevelDB
    log blocks of 32 KiB (7-byte record headers: crc, length, type) holding Record protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if room < 7 or (n == 0 and kind == 0):  # a block's zero-padded tail
            pos += room
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def wandb_history(run_dir: Path) -> list[dict]:
    (log,) = run_dir.glob("run-*.wandb")
    rows = []
    for rec in wandb_records(log):
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_offline_run_holds_every_step(tmp_path, traces, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for k in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(k, raising=False)
    from otbuild.train.sft import train

    out, runs = tmp_path / "ck", tmp_path / "runs"
    wb = {"project": "otbuild-test", "dir": str(runs), "tags": ["smoke"]}
    manifest = train(SftSettings(**{**FAST, "tracking": {"wandb": wb}}), [traces], out)
    (run_dir,) = (runs / "wandb").glob("offline-run-*-sft-ck")
    assert manifest["tracking"]["wandb"] == {
        "project": "otbuild-test",
        "id": "sft-ck",
        "dir": str(run_dir),
        "offline": True,
    }
    history, log = wandb_history(run_dir), _log(out)
    assert [h["_step"] for h in history] == [r["step"] for r in log]
    for key in ("loss", "lr", "grad_norm", "tokens_per_second"):
        assert [h[tag(key)] for h in history] == pytest.approx([r[key] for r in log], rel=1e-9), key
    assert not (out / "wandb").exists()  # the configured dir, not the artifact


def test_wandb_configured_but_missing_is_a_config_error(tmp_path, monkeypatch):
    from otbuild.errors import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"sft\.tracking\.wandb .*pip install wandb"):
        Tracker(
            Tracking(tensorboard=False, wandb={"project": "p"}), stage="sft", outdir=tmp_path, first_step=1, config={}
        )


def test_tracking_settings_change_no_content_id():
    from otbuild.settings.identity import identity
    from otbuild.settings.train import Rl, Sft

    base = {"model": {"kind": "tiny"}}
    tracked = {"tracking": {"tensorboard": False, "wandb": {"project": "p", "mode": "offline"}}}
    assert identity(Sft.model_validate({**base, **tracked})) == identity(Sft.model_validate(base))
    assert identity(Rl.model_validate({"steps": 2, **tracked})) == identity(Rl.model_validate({"steps": 2}))
    with pytest.raises(ValueError, match="project"):
        Sft.model_validate({**base, "tracking": {"wandb": {"entity": "e"}}})
