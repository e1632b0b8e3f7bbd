{% from "_inputs.sql" import union_inputs %}
-- Top-N mix. Inputs arrive in rank order (index 0 = best source), with their quotas (`quotas`,
-- computed by otbuild/stages/mix.py: `total // n` each, the first `total % n` sources one more).
-- Within a source tasks are put in a seeded order (md5, stable across DuckDB versions); a
-- source with c tasks and quota q contributes copies 0..ceil(q/c)-1 of that order and keeps
-- positions < q, so a short source repeats every task floor(q/c) times and a seeded q mod c of
-- them once more (balanced upsampling with replacement; the copy index is recorded per row).
-- The choice is made on narrow columns (mix_pick); the wide rows are read once, at the end.
CREATE OR REPLACE TEMP VIEW mix_src AS
{{ union_inputs(inputs, '_src') }};

CREATE OR REPLACE TEMP TABLE mix_quota AS
SELECT _src, count(*) AS c,
       {{ quotas }}[_src + 1] AS q
FROM mix_src GROUP BY _src;

CREATE OR REPLACE TEMP TABLE mix_pick AS
WITH ordered AS (
    SELECT _src, file_row_number, row_number() OVER (
        PARTITION BY _src ORDER BY md5({{ seed | sql }} || ':' || task_id || ':' || path), file_row_number
    ) - 1 AS _r
    FROM mix_src
), copies AS (
    SELECT o._src, o.file_row_number, o._r, q.c, q.q,
           unnest(range(0, CAST(ceil(q.q / q.c) AS BIGINT))) AS mix_copy
    FROM ordered o JOIN mix_quota q USING (_src)
)
SELECT _src, file_row_number, mix_copy, mix_copy * c + _r AS _pos,
       {% if order == "round_robin" %}NULL{% else %}md5({{ seed | sql }} || ':' || _src || ':' || (mix_copy * c + _r)){% endif %} AS _key
FROM copies
WHERE mix_copy * c + _r < q;

CREATE OR REPLACE TEMP VIEW mix_out AS
SELECT s.* EXCLUDE (_src, file_row_number), p.mix_copy, p._src + 1 AS mix_rank, p.mix_copy > 0 AS mix_upsampled
FROM mix_src s JOIN mix_pick p USING (_src, file_row_number)
ORDER BY {% if order == "round_robin" %}p._pos, p._src{% else %}p._key{% endif %};
