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
-- With `fuzzy`, the rows neither rule caught get candidates (dc_fuzzy_candidates): benchmark
-- tasks they share at least `fuzzy_min_shared` distinct word `fuzzy_ngram`-grams with; the
-- stage scores those pairs with rapidfuzz (otbuild/stages/task_filter.py) and adds its hits.
CREATE OR REPLACE TEMP MACRO dc_words(t) AS
    list_filter(string_split(regexp_replace(lower(coalesce(t, '')), '[^a-z0-9]+', ' ', 'g'), ' '), lambda x: x <> '');
-- the distinct gram hashes of a word list: hash(w[i], ..., w[i+n-1]) (past the end: NULLs)
{% macro grams_macro(name, n) %}
CREATE OR REPLACE TEMP MACRO {{ name }}(w) AS
    list_distinct(list_transform(range(1, greatest(len(w) - {{ n }} + 1, 1) + 1),
                                 lambda i: hash({% for j in range(n) %}w[i + {{ j }}]{{ ', ' if not loop.last }}{% endfor %})));
{% endmacro %}
{{ grams_macro('dc_grams', ngram) }}
{% if fuzzy %}{{ grams_macro('dc_fuzzy_grams', fuzzy_ngram) }}{% endif %}

CREATE OR REPLACE TEMP TABLE dc_ref AS
SELECT _ref, [{{ against | map('sql') | join(', ') }}][_ref + 1] AS benchmark, path, hash(w) AS _text, dc_grams(w) AS _grams
       {%- if fuzzy %}, array_to_string(w, ' ') AS _words, dc_fuzzy_grams(w) AS _fuzzy_grams{% endif %}
FROM (SELECT _ref, path, dc_words(instruction) AS w FROM ({{ union_inputs(refs, '_ref') }}) WHERE len(w) > 0);

CREATE OR REPLACE TEMP TABLE dc_ref_grams AS
SELECT DISTINCT _ref, benchmark, path, unnest(_grams) AS h FROM dc_ref;

-- the training side, as hashes only (a table DuckDB spills beyond its memory limit)
CREATE OR REPLACE TEMP TABLE dc_train AS
SELECT _ord, hash(w) AS _text, dc_grams(w) AS _grams{% if fuzzy %}, dc_fuzzy_grams(w) AS _fuzzy_grams{% endif %}
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

{% if fuzzy %}
-- the fuzzy pass's candidate pairs, in (_ord, benchmark place, path) order; both texts as
-- normalised words joined by one space
CREATE OR REPLACE TEMP TABLE dc_fuzzy_candidates AS
WITH ref_grams AS (SELECT DISTINCT _ref, path, unnest(_fuzzy_grams) AS h FROM dc_ref),
pairs AS (
    SELECT g._ord, r._ref, r.path
    FROM (SELECT _ord, unnest(_fuzzy_grams) AS h FROM dc_train ANTI JOIN dc_hits USING (_ord)) g JOIN ref_grams r USING (h)
    GROUP BY ALL HAVING count(*) >= {{ fuzzy_min_shared }}
)
SELECT p._ord, p._ref, r.benchmark, p.path, r._words AS ref_words
FROM pairs p JOIN dc_ref r USING (_ref, path);

CREATE OR REPLACE TEMP VIEW dc_fuzzy_pairs AS
SELECT c._ord, c._ref, c.benchmark, c.path, array_to_string(dc_words(t.instruction), ' ') AS words, c.ref_words
FROM dc_fuzzy_candidates c JOIN ({{ union_inputs(inputs, '_file', offsets) }}) t USING (_ord)
ORDER BY c._ord, c._ref, c.path;
{% endif %}
