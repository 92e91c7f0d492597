-- Creates the table of Ledger: per recorded (prefix, key) the token that
-- recorded it and when.
CREATE TABLE IF NOT EXISTS :"schema".pglock_ledger (
	ns text NOT NULL,
	key text NOT NULL,
	token numeric(20,0) NOT NULL CHECK (token BETWEEN 0 AND 18446744073709551615),
	done_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, key)
);
