{% from "_inputs.sql" import union_inputs %}
-- Trace filter. A trace is rejected by the first rule it fails, in this order, and keeps that
-- rule's reason: an error without a trajectory or verdict worth keeping (outcome not_run,
-- infrastructure or verifier_error: otbuild/traces/outcome.py), timeout, subagent trace, fewer than min_turns
-- turns, reward below min_reward (success-only), duplicate conversation (first one wins: tool-call
-- ids do not count, a server draws them at random; which call each tool message answers does), then
-- a seeded subsample of exactly sample.n of what is left (the n smallest md5(seed:name:ord)).
-- Only narrow columns and a hash of each conversation are decided on here (trace_decided: _ord,
-- reason); the wide rows are streamed once, in input order, by duck.stream_split.
{{ outcome.macros }}
{#- A conversation with its tool calls' ids left out and each tool message's `tool_call_id` as
    the number of the call it answers (`ids`: the conversation's call ids, in call order). -#}
{% macro without_call_ids(conv, ids) -%}
list_transform({{ conv }}, lambda m: {
    'role': m.role, 'content': m.content,
    'tool_calls': list_transform(m.tool_calls, lambda c: {'type': c.type, 'function': c.function}),
    'answers': coalesce('call ' || list_position({{ ids }}, m.tool_call_id), m.tool_call_id)})
{%- endmacro %}
CREATE OR REPLACE TEMP VIEW trace_src AS
{{ union_inputs(inputs, '_file', offsets) }};

CREATE OR REPLACE TEMP TABLE trace_decided AS
WITH checked AS (
    SELECT _ord, CASE
        {% if drop_exceptions %}WHEN otb_outcome(result, exception, timed_out, reward) IN {{ outcome.dropped }}
             THEN 'exception: ' || otb_error(result, exception){% endif %}
        {% if drop_timed_out %}WHEN coalesce(timed_out, false) THEN 'timed_out'{% endif %}
        {% if drop_subagent %}WHEN coalesce(is_subagent, false) THEN 'subagent'{% endif %}
        {% if min_turns %}WHEN coalesce(n_turns, 0) < {{ min_turns }} THEN 'min_turns: ' || coalesce(n_turns, 0) || ' < {{ min_turns }}'{% endif %}
        {% if min_reward is not none %}
        WHEN reward IS NULL THEN 'no_reward'
        WHEN reward < {{ min_reward }} THEN 'min_reward: ' || reward || ' < {{ min_reward }}'
        {% endif %}
    END AS reason,
    {% if dedup %}md5(CAST({% if tool_calls %}{{ without_call_ids('conversations', '_call_ids') }}{% else %}conversations{% endif %} AS VARCHAR)){% else %}NULL{% endif %} AS _key,
    coalesce(trial_name, 'row ' || _ord) AS _name
    FROM {% if dedup and tool_calls %}(SELECT *, flatten(list_transform(conversations, lambda m:
        coalesce(list_transform(m.tool_calls, lambda c: c.id), []))) AS _call_ids FROM trace_src){% else %}trace_src{% endif %}
)
, deduped AS (
    SELECT _ord, _name, {% if dedup %}CASE WHEN reason IS NULL AND _dup > 1 THEN 'duplicate: same conversation as ' || _first ELSE reason END{% else %}reason{% endif %} AS reason
    FROM (
        SELECT *, row_number() OVER w AS _dup, first_value(_name) OVER w AS _first
        FROM checked
        WINDOW w AS (PARTITION BY reason IS NULL, _key ORDER BY _ord)
    )
)
{% if sample %}
SELECT _ord, CASE WHEN reason IS NULL AND _pick > {{ sample.n }}
                  THEN 'not_sampled: seeded subsample of {{ sample.n }}' ELSE reason END AS reason
FROM (SELECT *, row_number() OVER (PARTITION BY reason IS NULL
                                   ORDER BY md5({{ sample.seed | sql }} || ':' || _name || ':' || _ord)) AS _pick
      FROM deduped);
{% else %}
SELECT _ord, reason FROM deduped;
{% endif %}
