-- The summary of a scores view `ev_scores` (model, benchmark, repeat, task, reward,
-- partial_credit, exception, timed_out): per benchmark, the mean of its repeats' pass@1 and
-- the standard error of that mean, the same for partial credit (`partial_mean`,
-- `partial_stderr`); exceptions and timeouts counted apart (they score 0).
CREATE OR REPLACE TEMP VIEW ev_summary AS
WITH per_repeat AS (
    SELECT model, benchmark, repeat, avg(reward) AS pass_at_1, avg(partial_credit) AS partial,
           count(*) AS n_tasks, count(exception) AS n_exceptions,
           count(*) FILTER (WHERE timed_out) AS n_timed_out
    FROM ev_scores GROUP BY ALL
)
SELECT model, benchmark, avg(pass_at_1) AS mean,
       CASE WHEN count(*) > 1 THEN stddev_samp(pass_at_1) / sqrt(count(*)) END AS stderr,
       avg(partial) AS partial_mean,
       CASE WHEN count(*) > 1 THEN stddev_samp(partial) / sqrt(count(*)) END AS partial_stderr,
       count(*) AS repeats, max(n_tasks) AS n_tasks, CAST(sum(n_exceptions) AS BIGINT) AS n_exceptions,
       CAST(sum(n_timed_out) AS BIGINT) AS n_timed_out
FROM per_repeat GROUP BY ALL ORDER BY benchmark;
