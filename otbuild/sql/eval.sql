-- Eval scores: one row per (benchmark, repeat, task), with the trial's outcome
-- (otbuild/traces/outcome.py, docs/failures.md). An infrastructure failure or a task that was
-- not run has no score (reward NULL, `excluded`): it is left out of the mean and counted apart,
-- never scored 0 (past the recipe's max_infra_failures the eval's shard failed instead). A
-- task failure (context window, disk limit) or a verifier error scores 0, counted apart; any
-- other trial without a reward scores 0.
-- pass@1 of a repeat is the mean reward over the benchmark's scored tasks; a benchmark's score
-- is the mean of its repeats' pass@1 with the standard error of that mean (sample standard
-- deviation over repeats / sqrt(repeats)).
-- partial_credit: the verifier's fraction of checks passed (reward.json's `partial_credit`,
-- as the synthetic verifiers write it), else the reward itself.
{{ outcome.macros }}
CREATE OR REPLACE TEMP VIEW ev_scores AS
SELECT {{ model | sql }} AS model, source AS benchmark, sample_idx AS repeat, task, task_id,
       CASE WHEN excluded THEN NULL ELSE coalesce(reward, 0.0) END AS reward,
       CASE WHEN excluded THEN NULL
            WHEN outcome IN {{ outcome.scored_zero }} THEN 0.0
            ELSE coalesce(TRY_CAST(json_extract(metadata, '$.reward_json.partial_credit') AS DOUBLE),
                          reward, 0.0) END AS partial_credit,
       exception, timed_out, duration_s AS duration, outcome, excluded
FROM (SELECT *, otb_outcome(result, exception, timed_out, reward) AS outcome,
             otb_outcome(result, exception, timed_out, reward) IN {{ outcome.excluded }} AS excluded
      FROM read_parquet({{ traces | sql }}))
WHERE NOT coalesce(is_subagent, false)  -- a subagent's trace is part of its trial, not a trial
ORDER BY benchmark, repeat, task;

{% include "eval_summary.sql" %}
