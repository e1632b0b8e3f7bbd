{% from "_inputs.sql" import union_inputs %}
-- Near-duplicate removal (otbuild/stages/near_dedup.py), in steps the stage runs in turn.
-- Rows are keyed by `_key`: a task by its _ord (0, 1, ... in input order), a benchmark task by a
-- negative number (the benchmarks in `against` order, before every task), so "earlier" is
-- "smaller key" and a benchmark task is earlier than every task.
{% if step == 'setup' %}
-- the texts (instructions) and the names a dropped row's reason gives its kept twin
CREATE OR REPLACE TEMP VIEW nd_text AS
SELECT _ord AS _key, instruction, 'task ' || coalesce(path, task_id, '?') || ' of ' || coalesce(source, '?') AS who
FROM ({{ union_inputs(inputs, '_file', offsets) }})
{% for ref in refs %}
UNION ALL
SELECT file_row_number + {{ ref_offsets[loop.index0] }} AS _key, instruction,
       {{ against[loop.index0] | sql }} || ' task ' || coalesce(path, task_id, '?') AS who
FROM read_parquet({{ ref | sql }}, file_row_number = true)
{% endfor %};
-- one row per (task, band): the band's hash of the task's MinHash signature (the stage inserts
-- them batch by batch, through a second connection while it reads: hence not TEMP tables)
CREATE OR REPLACE TABLE nd_bands (_key BIGINT, band SMALLINT, h UBIGINT);
-- the candidate pairs found similar: exact Jaccard of the shingle sets >= threshold (a < b)
CREATE OR REPLACE TABLE nd_edges (a BIGINT, b BIGINT, sim DOUBLE);

{% elif step == 'candidates' %}
-- LSH candidates: two rows that share a band's hash. Each row is paired with the first
-- `leaders` rows (by key) of each bucket it falls in, so a bucket of k rows makes at most
-- k * leaders pairs, not k^2. Pairs of two benchmark tasks are not wanted.
CREATE OR REPLACE TEMP TABLE nd_pairs AS
WITH shared AS (
    SELECT band, h FROM nd_bands GROUP BY band, h HAVING count(*) > 1
), ranked AS (
    SELECT _key, band, h, row_number() OVER (PARTITION BY band, h ORDER BY _key) AS _rank
    FROM nd_bands SEMI JOIN shared USING (band, h)
)
SELECT DISTINCT a._key AS a, b._key AS b
FROM ranked b JOIN ranked a ON a.band = b.band AND a.h = b.h AND a._rank < b._rank AND a._rank <= {{ leaders }}
WHERE b._key >= 0;

{% elif step == 'pairs' %}
-- the candidates with both texts, for the exact check (in `a` order, so a row's set is reused)
SELECT p.a, p.b, ta.instruction AS text_a, tb.instruction AS text_b
FROM nd_pairs p JOIN nd_text ta ON ta._key = p.a JOIN nd_text tb ON tb._key = p.b
ORDER BY p.a, p.b

{% elif step == 'start' %}
-- each row's fate: kept, or dropped naming its twin. Kept from the start: the rows with no
-- earlier similar row, that is benchmark tasks and the rows that are only ever a pair's `a`.
CREATE OR REPLACE TEMP TABLE nd_fate AS
SELECT DISTINCT e.a AS _key, true AS kept, NULL::BIGINT AS twin, NULL::DOUBLE AS sim
FROM nd_edges e ANTI JOIN nd_edges later ON later.b = e.a;

{% elif step == 'round' %}
-- one round of the greedy rule, in key order: a row is dropped when an earlier similar row
-- is kept (its twin: a benchmark task first, then the most similar, then the earliest); it
-- is kept when every earlier similar row is dropped. The rows whose earlier similar rows are
-- not all decided wait for the next round; the earliest undecided row never waits.
INSERT INTO nd_fate
SELECT b AS _key,
       NOT bool_or(coalesce(f.kept, false)) AS kept,
       arg_min(e.a, (CASE WHEN e.a < 0 THEN 0 ELSE 1 END, -e.sim, e.a)) FILTER (WHERE f.kept) AS twin,
       arg_min(e.sim, (CASE WHEN e.a < 0 THEN 0 ELSE 1 END, -e.sim, e.a)) FILTER (WHERE f.kept) AS sim
FROM nd_edges e ANTI JOIN nd_fate d ON d._key = e.b
LEFT JOIN nd_fate f ON f._key = e.a
GROUP BY b
HAVING bool_or(coalesce(f.kept, false)) OR bool_and(f.kept IS NOT NULL);

{% elif step == 'decided' %}
-- one row per task (_ord, reason): duck.stream_split's `decided`
CREATE OR REPLACE TEMP TABLE nd_decided AS
SELECT t._ord, CASE
    WHEN f.twin < 0 THEN 'near_benchmark: jaccard ' || printf('%.3f', f.sim) || ' with ' || w.who
    WHEN f.twin >= 0 THEN 'near_duplicate: jaccard ' || printf('%.3f', f.sim) || ' with ' || w.who
END AS reason, f.twin
FROM (SELECT _key AS _ord FROM nd_text WHERE _key >= 0) t
LEFT JOIN nd_fate f ON f._key = t._ord AND NOT f.kept
LEFT JOIN nd_text w ON w._key = f.twin;
{% endif %}
