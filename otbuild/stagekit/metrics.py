"""The scores a ranking compares: `rank_by` -> summary.parquet's score column and its standard error."""

METRICS = {"pass_at_1": ("mean", "stderr"), "partial_credit": ("partial_mean", "partial_stderr")}
