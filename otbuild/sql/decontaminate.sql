{% from "_inputs.sql" import union_inputs %}
-- Decontamination: the training instructions against the instructions of the benchmarks in
-- `refs` (named by `against`, in that order). Both sides are normalised alike: lower case,
-- every run of characters other than a-z and 0-9 made one space, split into words. A text
-- of at least n words gives its word n-grams; a shorter one gives one gram of all its words.
-- Each gram is hashed to 64 bits, so only integers are joined: the benchmarks' grams are the
-- (small) build side and the training rows stream through the join.
-- A row is contaminated by a benchmark task when their normalised texts are equal, or when
-- they share at least `min_shared` distinct grams. It names one task: an equal text first,
-- then the most shared grams, then the benchmark's place in `against`, then the task path.
-- The reason starts `contaminated by BENCHMARK:`, so the counts per reason are per benchmark.
CREATE OR REPLACE TEMP MACRO dc_words(t) AS
    list_filter(string_split(regexp_replace(lower(coalesce(t, '')), '[^a-z0-9]+', ' ', 'g'), ' '), lambda x: x <> '');
-- the distinct gram hashes of a word list: hash(w[i], ..., w[i+n-1]) (past the end: NULLs)
CREATE OR REPLACE TEMP MACRO dc_grams(w) AS
    list_distinct(list_transform(range(1, greatest(len(w) - {{ ngram }} + 1, 1) + 1),
                                 lambda i: hash({% for j in range(ngram) %}w[i + {{ j }}]{{ ', ' if not loop.last }}{% endfor %})));

CREATE OR REPLACE TEMP TABLE dc_ref AS
SELECT _ref, [{{ against | map('sql') | join(', ') }}][_ref + 1] AS benchmark, path, hash(w) AS _text, dc_grams(w) AS _grams
FROM (SELECT _ref, path, dc_words(instruction) AS w FROM ({{ union_inputs(refs, '_ref') }}) WHERE len(w) > 0);

CREATE OR REPLACE TEMP TABLE dc_ref_grams AS
SELECT DISTINCT _ref, benchmark, path, unnest(_grams) AS h FROM dc_ref;

-- the training side, as hashes only (a table DuckDB spills beyond its memory limit)
CREATE OR REPLACE TEMP TABLE dc_train AS
SELECT _ord, hash(w) AS _text, dc_grams(w) AS _grams
FROM (SELECT _ord, dc_words(instruction) AS w FROM ({{ union_inputs(inputs, '_file', offsets) }}) WHERE len(w) > 0);

CREATE OR REPLACE TEMP TABLE dc_hits AS
WITH exact AS (
    SELECT t._ord, r._ref, r.benchmark, r.path, NULL::BIGINT AS shared
    FROM dc_train t JOIN dc_ref r USING (_text)
), overlap AS (
    SELECT g._ord, r._ref, r.benchmark, r.path, count(*) AS shared
    FROM (SELECT _ord, unnest(_grams) AS h FROM dc_train) g JOIN dc_ref_grams r USING (h)
    GROUP BY ALL HAVING count(*) >= {{ min_shared }}
)
SELECT _ord, benchmark, CASE
    WHEN shared IS NULL THEN 'contaminated by ' || benchmark || ': same instruction as task ' || path
    ELSE 'contaminated by ' || benchmark || ': ' || shared || ' shared {{ ngram }}-grams with task ' || path
END AS contamination
FROM (SELECT * FROM exact UNION ALL SELECT * FROM overlap)
QUALIFY row_number() OVER (PARTITION BY _ord ORDER BY shared DESC NULLS FIRST, _ref, path) = 1;
