-- Creates the table of Fence: per (prefix, key) the highest accepted token,
-- numeric(20,0) to hold every uint64.
CREATE TABLE IF NOT EXISTS :"schema".pglock_fences (
	ns text NOT NULL,
	key text NOT NULL,
	token numeric(20,0) NOT NULL CHECK (token BETWEEN 1 AND 18446744073709551615),
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, key)
);
