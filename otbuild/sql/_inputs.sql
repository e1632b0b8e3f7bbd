{#- The input parquets as one relation, in input order: `tag` numbers the file (0 = first),
    file_row_number the row within it, and, given each file's row offset, _ord numbers the
    rows across files (from 0). -#}
{% macro union_inputs(inputs, tag, offsets=none) -%}
{% for path in inputs %}
SELECT *, {{ loop.index0 }} AS {{ tag }}{% if offsets %}, file_row_number + {{ offsets[loop.index0] }} AS _ord{% endif %}
FROM read_parquet({{ path | sql }}, file_row_number = true)
{% if not loop.last %}UNION ALL BY NAME{% endif %}
{% endfor %}
{%- endmacro %}
