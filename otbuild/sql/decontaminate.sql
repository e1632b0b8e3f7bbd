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
CREATE OR REPLACE TEMP MACRO dc_words(t) AS
    list_filter(string_split(regexp_replace(lower(coalesce(t, '')), '[^a-z0-9]+', ' ', 'g'), ' '), lambda x: x <> '');
CREATE OR REPLACE TEMP MACRO dc_grams(w) AS
    list_distinct(list_transform(range(1, greatest(len(w) - {{ ngram }} + 1, 1) + 1),
                                 lambda i: hash(list_slice(w, i, i + {{ ngram }} - 1))));

CREATE OR REPLACE TEMP TABLE dc_ref AS
SELECT _ref, [{{ against | map('sql') | join(', ') }}][_ref + 1] AS benchmark, path, hash(w) AS _text, dc_grams(w) AS _grams
FROM (SELECT _ref, path, dc_words(instruction) AS w FROM ({{ union_inputs(refs, '_ref') }}))
WHERE len(w) > 0;

CREATE OR REPLACE TEMP TABLE dc_ref_grams AS
SELECT DISTINCT _ref, benchmark, path, unnest(_grams) AS h FROM dc_ref;

CREATE OR REPLACE TEMP TABLE dc_hits AS
WITH train AS (
    SELECT _ord, dc_words(instruction) AS w
    FROM ({{ union_inputs(inputs, '_file', offsets) }})
), exact AS (
    SELECT t._ord, r._ref, r.benchmark, r.path, NULL::BIGINT AS shared
    FROM (SELECT _ord, hash(w) AS _text FROM train WHERE len(w) > 0) t JOIN dc_ref r USING (_text)
), grams AS (
    SELECT _ord, unnest(dc_grams(w)) AS h FROM train WHERE len(w) > 0
), overlap AS (
    SELECT g._ord, r._ref, r.benchmark, r.path, count(*) AS shared
    FROM grams g JOIN dc_ref_grams r USING (h)
    GROUP BY ALL HAVING count(*) >= {{ min_shared }}
)
SELECT _ord, benchmark, CASE
    WHEN shared IS NULL THEN 'contaminated: same instruction as ' || benchmark || '/' || path
    ELSE 'contaminated: ' || shared || ' shared {{ ngram }}-grams with ' || benchmark || '/' || path
END AS contamination
FROM (SELECT * FROM exact UNION ALL SELECT * FROM overlap)
QUALIFY row_number() OVER (PARTITION BY _ord ORDER BY shared DESC NULLS FIRST, _ref, path) = 1;
