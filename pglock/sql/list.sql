-- One page of the names that have holder rows, in byte order.
-- $1 the factory's key prefix, $2 the prefix of the names, $3 the last name
-- of the previous page ('' at first), $4 the page size.
-- Result: name.
SELECT DISTINCT name COLLATE "C" FROM :"schema".pglock_holders
	WHERE ns = $1::text AND starts_with(name, $2::text) AND name COLLATE "C" > $3::text
	ORDER BY 1 LIMIT $4::int8
