-- A source's seeded sample of {{ n }} tasks{% if stratify %}, stratified by {{ stratify }}{% endif %}.
-- Each stratum (tasks sharing the value of the column or metadata key `stratify`, or of the
-- first group of `pattern` in it; a task without one is in the stratum '') gets
-- floor(n * size / total) tasks; the n left over go one each to the strata with the largest
-- remainders (ties: the larger stratum, then by value). Within a stratum, tasks are taken in
-- the order of md5(seed:task_id:path), so a seed always picks the same tasks. Narrow columns
-- are decided here; the rows themselves are copied in their original order afterwards.
CREATE TEMP TABLE sample_keys AS
SELECT file_row_number AS _row, task_id, path,
       {% if not stratify %}''{% else -%}
       {%- set value = stratify if stratify in columns else "json_extract_string(metadata, " ~ (('$.' ~ stratify) | sql) ~ ")" -%}
       coalesce({% if pattern %}regexp_extract({{ value }}, {{ pattern | sql }}, 1){% else %}{{ value }}{% endif %}, '')
       {%- endif %} AS stratum
FROM read_parquet({{ tasks | sql }}, file_row_number = true);

CREATE TEMP TABLE sample_strata AS
WITH sizes AS (
    SELECT stratum, count(*) AS size FROM sample_keys GROUP BY stratum
), want AS (
    SELECT least({{ n }}, sum(size))::BIGINT AS n, sum(size)::BIGINT AS total FROM sizes
), base AS (
    SELECT stratum, size, (want.n * size) // want.total AS floor_q, (want.n * size) % want.total AS remainder
    FROM sizes, want
), left_over AS (
    SELECT (SELECT n FROM want) - sum(floor_q) AS extra FROM base
)
SELECT stratum, size,
       floor_q + (row_number() OVER (ORDER BY remainder DESC, size DESC, stratum) <= extra)::INT AS quota
FROM base, left_over;

CREATE TEMP TABLE sample_rows AS
SELECT _row FROM (
    SELECT _row, stratum,
           row_number() OVER (PARTITION BY stratum ORDER BY md5({{ seed | sql }} || ':' || task_id || ':' || path), _row) AS _pick
    FROM sample_keys
) JOIN sample_strata USING (stratum)
WHERE _pick <= quota;
