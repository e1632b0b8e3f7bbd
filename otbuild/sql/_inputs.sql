{#- The input parquets as one relation, in input order: `tag` numbers the file (0 = first),
    file_row_number the row within it; together they give every row a stable position. -#}
{% macro union_inputs(inputs, tag) -%}
{% for path in inputs %}
SELECT *, {{ loop.index0 }} AS {{ tag }} FROM read_parquet({{ path | sql }}, file_row_number = true)
{% if not loop.last %}UNION ALL BY NAME{% endif %}
{% endfor %}
{%- endmacro %}
