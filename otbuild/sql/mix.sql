{% from "_inputs.sql" import union_inputs %}
-- Top-N mix. Inputs arrive in rank order (index 0 = best source). Each source gets
-- `total // n` tasks, the first `total % n` sources one more. Within a source tasks are put
-- in a seeded order (md5, stable across DuckDB versions); a source with c tasks and quota q
-- contributes copies 0..ceil(q/c)-1 of that order and keeps positions < q, so a short source
-- repeats every task floor(q/c) times and a seeded q mod c of them once more (balanced
-- upsampling with replacement; the copy index is recorded per row).
CREATE OR REPLACE TEMP VIEW mix_src AS
{{ union_inputs(inputs, '_src') }};

CREATE OR REPLACE TEMP VIEW mix_quota AS
SELECT _src, count(*) AS c,
       {{ total // inputs | length }} + CASE WHEN _src < {{ total % inputs | length }} THEN 1 ELSE 0 END AS q
FROM mix_src GROUP BY _src;

CREATE OR REPLACE TEMP VIEW mix_rows AS
WITH ordered AS (
    SELECT s.*, row_number() OVER (
        PARTITION BY s._src ORDER BY md5({{ seed | sql }} || ':' || s.task_id || ':' || s.path), s.file_row_number
    ) - 1 AS _r
    FROM mix_src s
), copies AS (
    SELECT o.*, q.c, q.q, unnest(range(0, CAST(ceil(q.q / q.c) AS BIGINT))) AS mix_copy
    FROM ordered o JOIN mix_quota q USING (_src)
)
SELECT * EXCLUDE (_r, c, q, file_row_number), mix_copy * c + _r AS _pos
FROM copies
WHERE mix_copy * c + _r < q;

CREATE OR REPLACE TEMP VIEW mix_out AS
SELECT * EXCLUDE (_src, _pos), _src + 1 AS mix_rank, mix_copy > 0 AS mix_upsampled
FROM mix_rows
{% if order == "round_robin" %}
ORDER BY _pos, _src
{% else %}
ORDER BY md5({{ seed | sql }} || ':' || _src || ':' || _pos)
{% endif %};
