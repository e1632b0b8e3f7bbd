-- The summary of a scores view `ev_scores` (model, benchmark, repeat, task, reward,
-- partial_credit, exception, timed_out, outcome, excluded): per benchmark, the mean of its
-- repeats' pass@1 over the scored tasks and the standard error of that mean, the same for
-- partial credit (`partial_mean`, `partial_stderr`); counted apart: verifier errors
-- (`n_exceptions`) and task failures (`n_task_failures`: context window, disk limit), which
-- score 0, timeouts (`n_timed_out`: scored by the verifier) and the trials left out of the
-- mean (`n_excluded`: infrastructure failures and tasks not run).
CREATE OR REPLACE TEMP VIEW ev_summary AS
WITH per_repeat AS (
    SELECT model, benchmark, repeat, avg(reward) AS pass_at_1, avg(partial_credit) AS partial,
           count(*) AS n_tasks, count(*) FILTER (WHERE outcome = 'verifier_error') AS n_exceptions,
           count(*) FILTER (WHERE outcome = 'task_failure') AS n_task_failures,
           count(*) FILTER (WHERE timed_out) AS n_timed_out, count(*) FILTER (WHERE excluded) AS n_excluded
    FROM ev_scores GROUP BY ALL
)
SELECT model, benchmark, avg(pass_at_1) AS mean,
       CASE WHEN count(pass_at_1) > 1 THEN stddev_samp(pass_at_1) / sqrt(count(pass_at_1)) END AS stderr,
       avg(partial) AS partial_mean,
       CASE WHEN count(partial) > 1 THEN stddev_samp(partial) / sqrt(count(partial)) END AS partial_stderr,
       count(*) AS repeats, max(n_tasks) AS n_tasks, CAST(sum(n_exceptions) AS BIGINT) AS n_exceptions,
       CAST(sum(n_task_failures) AS BIGINT) AS n_task_failures, CAST(sum(n_timed_out) AS BIGINT) AS n_timed_out,
       CAST(sum(n_excluded) AS BIGINT) AS n_excluded
FROM per_repeat GROUP BY ALL ORDER BY benchmark;
