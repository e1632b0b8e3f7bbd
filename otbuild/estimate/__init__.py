"""What a recipe will cost before it runs (`otbuild plan --estimate`), calibrated by pilots.
A figure with its range is a `Span` (otbuild/span.py, where the stages' estimate hooks find it too).

rates.py    the rates an estimate uses and the documented defaults (assumptions)
pilot.py    calibration: the rates a built pilot recipe measured, from its artifacts
profile.py  what a Snakemake profile grants each rule's jobs
model.py    the count model: counts, requests, tokens, cost, GPU-hours and time per stage (each
            stage counts its own work with the model's helpers: `StageDef.estimate`)
check.py    jobs whose estimated time exceeds what the profile grants
run.py      `estimate()`: all of the above for one plan, with how far each assumption moves the total
record.py   where an estimate is saved (.otbuild/estimates/RECIPE.json) and its comparison with
            what a build measured (the report shows both; docs/estimate.md)
show.py     the console tables
"""
