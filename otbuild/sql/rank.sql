-- Cross-benchmark z-score ranking of one stage's candidates (the paper's ablation ranking):
-- z(c, b) = (a(c, b) - mu_b) / sigma_b with mu_b, sigma_b over the candidates that have b,
-- and a candidate's score is the mean of its z over benchmarks.
-- sigma is the POPULATION standard deviation: the candidates are the whole set being
-- compared, not a sample of a larger one (and with every candidate scored on every benchmark
-- the ranking is the same under either choice, since it only rescales each benchmark's z
-- by one common factor). A benchmark whose candidates all score the same contributes 0.
-- A candidate missing a benchmark is flagged (complete = false, missing lists it) and gets
-- no rank; its mean z over the benchmarks it has is shown, not averaged in silently.
-- `column` is the summary's score compared: mean (pass@1) or partial_mean (partial credit);
-- its standard error over repeats (`errors`, NULL for a summary without one) is carried along.
CREATE OR REPLACE TEMP VIEW rk_scores AS
{% for path in inputs %}
SELECT {{ candidates[loop.index0] | sql }} AS candidate, benchmark, {{ column }} AS mean,
       CAST({{ errors[loop.index0] }} AS DOUBLE) AS stderr FROM read_parquet({{ path | sql }})
{% if not loop.last %}UNION ALL{% endif %}
{% endfor %};

CREATE OR REPLACE TEMP VIEW rk_z AS
WITH cands AS (SELECT DISTINCT candidate FROM rk_scores),
     benches AS (SELECT DISTINCT benchmark FROM rk_scores),
     grid AS (
         SELECT c.candidate, b.benchmark, s.mean, s.stderr
         FROM cands c CROSS JOIN benches b LEFT JOIN rk_scores s USING (candidate, benchmark)
     ),
     stats AS (SELECT benchmark, avg(mean) AS mu, stddev_pop(mean) AS sigma FROM grid GROUP BY benchmark)
SELECT g.candidate, g.benchmark, g.mean, g.stderr, st.mu, st.sigma,
       CASE WHEN g.mean IS NULL THEN NULL
            WHEN st.sigma IS NULL OR st.sigma = 0 THEN 0.0
            ELSE (g.mean - st.mu) / st.sigma END AS z
FROM grid g JOIN stats st USING (benchmark)
ORDER BY g.candidate, g.benchmark;

CREATE OR REPLACE TEMP VIEW rk_ranking AS
WITH per AS (
    SELECT candidate, avg(z) AS mean_z, count(z) AS n_benchmarks,
           list(benchmark ORDER BY benchmark) FILTER (WHERE mean IS NULL) AS missing,
           count(*) FILTER (WHERE mean IS NULL) = 0 AS complete
    FROM rk_z GROUP BY candidate
)
SELECT CASE WHEN complete THEN rank() OVER (PARTITION BY complete ORDER BY mean_z DESC) END AS rank,
       candidate, mean_z, n_benchmarks, complete, coalesce(missing, []) AS missing
FROM per
ORDER BY complete DESC, mean_z DESC NULLS LAST, candidate;
