{% from "_inputs.sql" import union_inputs %}
{#- trim(x) (DuckDB's: Unicode spaces, a costly per-character pass), skipped where it cannot
    change x: its first byte (a prefix compare) and its last (an end-anchored regex, which RE2
    matches backwards from the end) are printable ASCII other than the space. NULL stays NULL. -#}
{% macro trimmed(x) -%}
CASE WHEN {{ x }} >= '!' AND {{ x }} < chr(127) AND regexp_matches({{ x }}, '[!-~]\z') THEN {{ x }} ELSE trim({{ x }}) END
{%- endmacro %}
-- Task filter. Steps run in this order; a row is rejected by the first step it fails and
-- keeps that step's reason: per-row checks (instruction, length, regexes, overlap with a
-- benchmark from decontaminate.sql, score present),
-- then dedup on the normalised instruction (first occurrence wins), then top-k by score,
-- then a seeded draw by a column's values (`draw`), then a seeded random subsample. Only narrow columns are decided here (task_decided: _ord,
-- reason, score[, weight, n_rollouts]); the wide rows (with task_binary) are streamed once, in
-- input order, by duck.stream_split.
CREATE OR REPLACE TEMP VIEW task_src AS
{{ union_inputs(inputs, '_file', offsets) }};

CREATE OR REPLACE TEMP TABLE {{ 'task_ranked' if draw else 'task_decided' }} AS
WITH base AS (
    SELECT _file, file_row_number, _ord, task_id, instruction,
           {% if score %}TRY_CAST({{ score_expr }} AS DOUBLE){% else %}NULL::DOUBLE{% endif %} AS score
           {%- if draw %}, CAST({{ draw.expr }} AS VARCHAR) AS _draw_value{% endif %}
           {%- if decontaminate %}, contamination{% endif %}
    FROM task_src{% if decontaminate %} LEFT JOIN dc_hits USING (_ord){% endif %}
), checked AS (
    SELECT *, CASE
        WHEN coalesce({{ trimmed('instruction') }}, '') = '' THEN 'empty_instruction'
        {% if chars and chars.min is not none %}
        WHEN length(instruction) < {{ chars.min }} THEN 'too_short: ' || length(instruction) || ' < {{ chars.min }} chars'
        {% endif %}
        {% if chars and chars.max is not none %}
        WHEN length(instruction) > {{ chars.max }} THEN 'too_long: ' || length(instruction) || ' > {{ chars.max }} chars'
        {% endif %}
        {% if include_regex %}
        WHEN NOT regexp_matches(instruction, {{ include_regex | sql }}) THEN 'include_regex: no match'
        {% endif %}
        {% if exclude_regex %}
        WHEN regexp_matches(instruction, {{ exclude_regex | sql }}) THEN 'exclude_regex: matched'
        {% endif %}
        {% if decontaminate %}
        WHEN contamination IS NOT NULL THEN contamination
        {% endif %}
        {% if score %}
        WHEN score IS NULL THEN 'score: no numeric {{ score.column }}'
        {% if score.budget %}WHEN score < 0 THEN 'score: negative, cannot weight rollouts: ' || score{% endif %}
        {% endif %}
    END AS reason
    FROM base
), normed AS (
    -- the dedup key, only for rows still in: md5 of the instruction in lower case with each
    -- whitespace run made one space (the pattern leaves lone spaces alone: same key, cheaper);
    -- md5_number: the same digest as a 128-bit integer, cheaper to partition on than its hex
    SELECT * EXCLUDE (instruction),
           CASE WHEN reason IS NULL THEN md5_number(lower(regexp_replace({{ trimmed('instruction') }}, '[\t\n\f\r]\s*| \s+', ' ', 'g'))) END AS _norm
    FROM checked
), deduped AS (
    SELECT * REPLACE (
        {% if dedup %}
        CASE WHEN reason IS NULL AND _dup > 1 THEN 'duplicate: same instruction as task ' || _first ELSE reason END
        {% else %}reason{% endif %} AS reason)
    FROM (
        SELECT * EXCLUDE (_norm), row_number() OVER w AS _dup, first_value(task_id) OVER w AS _first
        FROM normed
        WINDOW w AS (PARTITION BY reason IS NULL, _norm ORDER BY _ord)
    )
), ranked AS (
    SELECT * REPLACE (
        {% if score and score.top_k %}
        CASE WHEN reason IS NULL AND _rank > {{ score.top_k }}
             THEN 'below_top_k: score rank ' || _rank || ' > {{ score.top_k }}' ELSE reason END
        {% else %}reason{% endif %} AS reason)
    FROM (SELECT *, row_number() OVER (PARTITION BY reason IS NULL ORDER BY score DESC, _ord) AS _rank FROM deduped)
)
{% if draw %}
SELECT * FROM ranked;

-- The draw: each value of the column its quota of `total` (floor of total x share, then one
-- more for the largest fractional parts, ties in shares order: exactly `total` in all), from the
-- rows still in; within a value the rows go in a seeded order. A value short of its quota
-- gives what it has (no spreading: draw_counts reports the shortfall).
CREATE OR REPLACE TEMP TABLE draw_quotas AS
WITH shares AS (
    {% if draw.shares %}
    SELECT * FROM (VALUES {% for value, share in draw.shares %}({{ value | sql }}, {{ share }}::DOUBLE, {{ loop.index0 }}){{ ', ' if not loop.last }}{% endfor %}) AS s(value, share, pos)
    {% else %}
    SELECT value, 1.0 / count(*) OVER () AS share, row_number() OVER (ORDER BY value) AS pos
    FROM (SELECT DISTINCT _draw_value AS value FROM task_ranked WHERE reason IS NULL AND _draw_value IS NOT NULL)
    {% endif %}
), available AS (
    SELECT _draw_value AS value, count(*) AS available FROM task_ranked WHERE reason IS NULL GROUP BY ALL
), floors AS (
    SELECT value, share, pos, coalesce(available, 0) AS available, round({{ draw.total }} * share, 9) AS exact,
           floor(round({{ draw.total }} * share, 9)) AS base
    FROM shares LEFT JOIN available USING (value)
)
SELECT value, share, available, CAST(base + CASE WHEN row_number() OVER (ORDER BY exact - base DESC, pos)
                                           <= {{ draw.total }} - sum(base) OVER () THEN 1 ELSE 0 END AS BIGINT) AS quota
FROM floors;

CREATE OR REPLACE TEMP TABLE task_decided AS
WITH drawn AS (
    SELECT * EXCLUDE (value, share, available, quota, _in_value) REPLACE (
        CASE WHEN reason IS NOT NULL THEN reason
             WHEN _draw_value IS NULL THEN 'draw: {{ draw.column }} is NULL'
             WHEN quota IS NULL THEN 'draw: {{ draw.column }}=' || _draw_value || ' has no share'
             WHEN _in_value > quota THEN 'draw: {{ draw.column }}=' || _draw_value || ' over its share ' || share
                                         || ' (' || quota || ' of {{ draw.total }})'
        END AS reason)
    FROM (
        SELECT *, row_number() OVER (
            PARTITION BY reason IS NULL, _draw_value ORDER BY md5({{ draw.seed | sql }} || ':' || task_id || ':' || _ord)
        ) AS _in_value
        FROM task_ranked
    ) LEFT JOIN draw_quotas ON value = _draw_value
)
{% else %}
, drawn AS (SELECT * FROM ranked)
{% endif %}
, sampled AS (
    SELECT * REPLACE (
        {% if sample %}
        CASE WHEN reason IS NULL AND _pick > {{ sample.n }}
             THEN 'not_sampled: seeded subsample of {{ sample.n }}' ELSE reason END
        {% else %}reason{% endif %} AS reason)
    FROM (
        SELECT *, row_number() OVER (
            PARTITION BY reason IS NULL ORDER BY md5({{ (sample.seed if sample else 0) | sql }} || ':' || task_id || ':' || _ord)
        ) AS _pick
        FROM drawn
    )
)
{% if score and score.budget %}
-- Rollout budget B (planned rollouts: ceil(budget / keep_rate)) over the N kept tasks: every task gets one rollout, and the other B - N
-- go in proportion to score (largest remainder: floors first, then the biggest fractional
-- parts, ties in input order). With all scores 0 the extra rollouts are spread evenly.
, shared AS (
    SELECT *, CASE WHEN reason IS NULL THEN
        ({{ rollouts }} - count(*) FILTER (WHERE reason IS NULL) OVER ())
        * coalesce(score / nullif(sum(score) FILTER (WHERE reason IS NULL) OVER (), 0),
                   1.0 / count(*) FILTER (WHERE reason IS NULL) OVER ())
    END AS _share
    FROM sampled
), allotted AS (
    SELECT *, floor(_share) AS _base,
           row_number() OVER (PARTITION BY reason IS NULL ORDER BY _share - floor(_share) DESC, _ord) AS _by_frac,
           round(sum(_share - floor(_share)) FILTER (WHERE reason IS NULL) OVER ()) AS _left
    FROM shared
)
SELECT _ord, reason, score,
       CASE WHEN reason IS NULL THEN score / nullif(sum(score) FILTER (WHERE reason IS NULL) OVER (), 0) END AS weight,
       CASE WHEN reason IS NULL THEN CAST(1 + _base + CASE WHEN _by_frac <= _left THEN 1 ELSE 0 END AS INTEGER) END AS n_rollouts
FROM allotted;
{% else %}
SELECT _ord, reason, score FROM sampled;
{% endif %}
