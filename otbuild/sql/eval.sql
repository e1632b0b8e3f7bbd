-- Eval scores: one row per (benchmark, repeat, task). A trial that ended in an exception, or
-- without a reward, scores 0 and is counted apart. pass@1 of a repeat is the mean reward over
-- the benchmark's tasks; a benchmark's score is the mean of its repeats' pass@1 with the
-- standard error of that mean (sample standard deviation over repeats / sqrt(repeats)).
-- partial_credit: the verifier's fraction of checks passed (reward.json's `partial_credit`,
-- as the synthetic verifiers write it), else the reward itself.
CREATE OR REPLACE TEMP VIEW ev_scores AS
SELECT {{ model | sql }} AS model, source AS benchmark, sample_idx AS repeat, task, task_id,
       coalesce(reward, 0.0) AS reward,
       CASE WHEN exception IS NOT NULL THEN 0.0
            ELSE coalesce(TRY_CAST(json_extract(metadata, '$.reward_json.partial_credit') AS DOUBLE),
                          reward, 0.0) END AS partial_credit,
       exception, timed_out, duration_s AS duration
FROM read_parquet({{ traces | sql }})
WHERE NOT coalesce(is_subagent, false)  -- a subagent's trace is part of its trial, not a trial
ORDER BY benchmark, repeat, task;

{% include "eval_summary.sql" %}
