{% from "_inputs.sql" import union_inputs %}
-- Difficulty: each task's pilot trials (the trace rows of its task_id, subagents apart) by how
-- they ended. Scored: passed, failed, timed out, a task failure, a verifier error (as eval
-- scores them); infrastructure failures and trials never run are counted apart and score
-- nothing. A task's band is its pass rate's (passes / scored trials), compared in integers:
-- impossible 0, very_hard (0, 1/4], hard (1/4, 1/2], medium (1/2, 3/4], easy (3/4, 1),
-- trivial 1; no scored trial: no band, and a reason naming how its trials ended.
{{ outcome.macros }}
CREATE OR REPLACE TEMP TABLE dif_outcomes AS
SELECT task_id, otb_outcome(result, exception, timed_out, reward) AS outcome,
       min(otb_error(result, exception)) AS error, count(*) AS n
FROM read_parquet({{ traces | sql }})
WHERE NOT coalesce(is_subagent, false)
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE dif_trials AS
SELECT task_id,
       sum(n) AS trials,
       coalesce(sum(n) FILTER (WHERE outcome NOT IN {{ unscored }}), 0) AS scored,
       coalesce(sum(n) FILTER (WHERE outcome = 'passed'), 0) AS passed,
       coalesce(sum(n) FILTER (WHERE outcome = 'infrastructure'), 0) AS errors,
       string_agg(outcome || ' x' || n || coalesce(' (' || error || ')', ''), ', ' ORDER BY outcome) AS ended
FROM dif_outcomes
GROUP BY task_id;

CREATE OR REPLACE TEMP VIEW dif_src AS
{{ union_inputs(inputs, '_file', offsets) }};

CREATE OR REPLACE TEMP TABLE dif_decided AS
SELECT _ord, NULL::VARCHAR AS reason,
       CASE WHEN scored > 0 THEN passed / scored END::DOUBLE AS pass_rate,
       coalesce(scored, 0)::INTEGER AS pilot_trials,
       coalesce(errors, 0)::INTEGER AS pilot_errors,
       CASE WHEN coalesce(scored, 0) = 0 THEN NULL
            WHEN passed = 0 THEN 'impossible'
            WHEN 4 * passed <= scored THEN 'very_hard'
            WHEN 2 * passed <= scored THEN 'hard'
            WHEN 4 * passed <= 3 * scored THEN 'medium'
            WHEN passed < scored THEN 'easy'
            ELSE 'trivial' END AS band,
       CASE WHEN coalesce(scored, 0) = 0
            THEN 'unscored: none of its ' || coalesce(trials, 0) || ' pilot trials scored'
                 || coalesce(' (' || ended || ')', '') END AS band_reason
FROM (SELECT _ord, task_id FROM dif_src) LEFT JOIN dif_trials USING (task_id);
