-- Eval scores: one row per (benchmark, repeat, task). A trial that ended in an exception, or
-- without a reward, scores 0 and is counted apart. pass@1 of a repeat is the mean reward over
-- the benchmark's tasks; a benchmark's score is the mean of its repeats' pass@1 with the
-- standard error of that mean (sample standard deviation over repeats / sqrt(repeats)).
CREATE OR REPLACE TEMP VIEW ev_scores AS
SELECT {{ model | sql }} AS model, source AS benchmark, sample_idx AS repeat, task, task_id,
       coalesce(reward, 0.0) AS reward, exception, timed_out, duration_s AS duration
FROM read_parquet({{ traces | sql }})
ORDER BY benchmark, repeat, task;

CREATE OR REPLACE TEMP VIEW ev_summary AS
WITH per_repeat AS (
    SELECT model, benchmark, repeat, avg(reward) AS pass_at_1, count(*) AS n_tasks,
           count(exception) AS n_exceptions, count(*) FILTER (WHERE timed_out) AS n_timed_out
    FROM ev_scores GROUP BY ALL
)
SELECT model, benchmark, avg(pass_at_1) AS mean,
       CASE WHEN count(*) > 1 THEN stddev_samp(pass_at_1) / sqrt(count(*)) END AS stderr,
       count(*) AS repeats, max(n_tasks) AS n_tasks, CAST(sum(n_exceptions) AS BIGINT) AS n_exceptions,
       CAST(sum(n_timed_out) AS BIGINT) AS n_timed_out
FROM per_repeat GROUP BY ALL ORDER BY benchmark;
