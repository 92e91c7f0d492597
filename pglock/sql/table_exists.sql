-- Whether the table $2 (text) is in the schema $1 (text).
-- Result: one boolean.
SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL
