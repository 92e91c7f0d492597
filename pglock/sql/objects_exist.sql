-- Whether every object of setup.sql is in the schema $1 (text).
-- Result: one boolean.
SELECT to_regclass(format('%I.pglock_limits', $1::text)) IS NOT NULL
	AND to_regclass(format('%I.pglock_holders', $1::text)) IS NOT NULL
	AND to_regclass(format('%I.pglock_token_counter', $1::text)) IS NOT NULL
	AND to_regclass(format('%I.pglock_epoch', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_token_v1()', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_rebase_v1()', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_key(text,text,text,integer)', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_sem_acquire_v3(bigint[],integer[],bigint,boolean,bigint,bigint,integer,text,text,boolean,text,jsonb)', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_sem_release_v1(bigint,bigint,boolean,bigint,text,bigint)', $1::text)) IS NOT NULL
	AND to_regprocedure(format('%I.pglock_relimit_v1(bigint[],bigint,integer,text,text)', $1::text)) IS NOT NULL
