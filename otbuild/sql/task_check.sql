{% from "_inputs.sql" import union_inputs %}
-- Task validation's verdicts (otbuild/stages/task_check.py): each task row with its oracle trial
-- (the reference solution) and its noop trial (nothing done), matched by trial number. Trials
-- are numbered in task order over the tasks that get one: the oracle's over the tasks with a
-- solution; the noop's over the same tasks, or over every task (`noop_all`). A trace file holds
-- its trials in that order (subagent rows apart).
{{ outcome.macros }}
CREATE OR REPLACE TEMP TABLE v_decided AS
WITH tasks AS (
    SELECT _ord, task_id, source, coalesce(has_solution, false) AS sol
    FROM ({{ union_inputs(inputs, '_file', offsets) }})
), numbered AS (
    SELECT *,
           CASE WHEN sol THEN count(*) FILTER (WHERE sol) OVER (ORDER BY _ord ROWS UNBOUNDED PRECEDING) - 1 END AS k_oracle,
           {% if noop_all %}_ord{% else %}CASE WHEN sol THEN count(*) FILTER (WHERE sol) OVER (ORDER BY _ord ROWS UNBOUNDED PRECEDING) - 1 END{% endif %} AS k_noop
    FROM tasks
){% for engine in ('oracle', 'noop') %}, {{ engine }} AS (
    SELECT row_number() OVER (ORDER BY file_row_number) - 1 AS k, file_row_number AS pos, task_id,
           otb_outcome(result, exception, timed_out, reward) AS outcome, otb_error(result, exception) AS error,
           reward
    FROM read_parquet({{ traces[engine] | sql }}, file_row_number = true)
    WHERE NOT coalesce(is_subagent, false)
){% endfor %}, joined AS (
    SELECT t._ord, t.source, t.sol, t.task_id,
           o.task_id AS oracle_task, o.outcome AS oracle_outcome, o.error AS oracle_error, o.reward AS oracle_reward,
           o.pos AS oracle_at,
           n.task_id AS noop_task, n.outcome AS noop_outcome, n.error AS noop_error, n.reward AS noop_reward,
           n.pos AS noop_at
    FROM numbered t
    LEFT JOIN oracle o ON o.k = t.k_oracle
    LEFT JOIN noop n ON n.k = t.k_noop
)
SELECT *,
    CASE
        WHEN NOT sol AND {{ 'true' if drop_unsolved else 'false' }} THEN 'no_solution: the task has no solution/solve.sh'
        WHEN oracle_outcome IN ('not_run', 'infrastructure') THEN
            'environment_fails: the reference solution''s trial ended in ' || oracle_error || ' (' || oracle_outcome || ')'
        WHEN noop_outcome IN ('not_run', 'infrastructure') THEN
            'environment_fails: the no-op trial ended in ' || noop_error || ' (' || noop_outcome || ')'
        WHEN sol AND oracle_outcome <> 'passed' THEN
            'solution_fails: the reference solution ' || CASE oracle_outcome
                WHEN 'failed' THEN 'gets reward ' || oracle_reward
                ELSE 'ends in ' || coalesce(oracle_error, oracle_outcome) || ' (' || oracle_outcome || ')' END
        WHEN noop_outcome = 'passed' THEN
            'noop_passes: the verifier gives the untouched environment reward ' || noop_reward
    END AS reason
FROM joined;

-- the trial whose verifier's words a rejected row keeps (none for no_solution)
CREATE OR REPLACE TEMP TABLE v_decider AS
SELECT _ord, CASE WHEN starts_with(reason, 'noop_passes') OR starts_with(reason, 'environment_fails: the no-op')
                  THEN 'noop' ELSE 'oracle' END AS engine,
       CASE WHEN starts_with(reason, 'noop_passes') OR starts_with(reason, 'environment_fails: the no-op')
            THEN noop_at ELSE oracle_at END AS pos
FROM v_decided WHERE reason IS NOT NULL AND NOT starts_with(reason, 'no_solution');

-- the tail of what the deciding trial's verifier (else its error) said: the task's text, as
-- data; read for the rejected rows only, so the kept rows' outputs are never held
CREATE OR REPLACE TEMP TABLE v_out AS
WITH said AS ({% for engine in ('oracle', 'noop') %}
    SELECT {{ engine | sql }} AS engine, file_row_number AS pos,
           right(coalesce(json_extract_string(metadata, '$.verifier_output'),
                          json_extract_string(metadata, '$.exception_message'),
                          json_extract_string(metadata, '$.stop_message')), {{ chars }}) AS verifier_output
    FROM read_parquet({{ traces[engine] | sql }}, file_row_number = true)
    WHERE file_row_number IN (SELECT pos FROM v_decider WHERE engine = {{ engine | sql }})
    {% if not loop.last %}UNION ALL{% endif %}{% endfor %}
)
SELECT d._ord, d.reason, d.oracle_outcome, d.oracle_reward, d.noop_outcome, d.noop_reward, s.verifier_output
FROM v_decided d LEFT JOIN v_decider w USING (_ord) LEFT JOIN said s ON s.engine = w.engine AND s.pos = w.pos;
