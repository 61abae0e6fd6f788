-- fencerun fencing guard for PostgreSQL (printed by `fencerun fence sql postgresql`).
--
-- Call fencerun_admit(resource, token) inside the writer's own transaction, before its writes:
--
--   BEGIN;
--   SELECT fencerun_admit('orders', 1718000000000123);  -- the token from $FENCERUN_TOKEN
--   UPDATE orders SET ...;
--   COMMIT;
--
-- The function takes a row lock on the resource's fence row, which it holds until the transaction
-- ends, so writers of one resource are serialised. A token older than the greatest one the resource
-- has accepted raises SQLSTATE ZF077 ("fencerun: stale token ... rejected for ...: it has accepted
-- ..."), which aborts the transaction: the stale writer's changes roll back. An equal token is
-- accepted; a greater one is recorded, and it is committed together with the writes.
--
-- Under REPEATABLE READ or SERIALIZABLE, a concurrent admit of the same resource may fail with
-- SQLSTATE 40001 instead; retry the transaction as for any serialization failure.
-- Running this script again is safe (it replaces the function and keeps the table).

CREATE TABLE IF NOT EXISTS fencerun_fence (
  resource   text PRIMARY KEY,
  token      bigint NOT NULL CHECK (token > 0),
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION fencerun_admit(resource text, token bigint) RETURNS void
LANGUAGE plpgsql
AS $fencerun$
#variable_conflict use_column
DECLARE
  accepted bigint;
BEGIN
  IF fencerun_admit.resource IS NULL OR fencerun_admit.token IS NULL
     OR fencerun_admit.token <= 0 OR fencerun_admit.token >= 9007199254740992 THEN
    RAISE EXCEPTION USING
      ERRCODE = '22023',
      MESSAGE = format('fencerun: invalid fencing token %s for %s (expected a positive integer below 2^53)',
                       coalesce(fencerun_admit.token::text, 'NULL'), coalesce(fencerun_admit.resource, 'NULL'));
  END IF;

  INSERT INTO fencerun_fence AS f (resource, token)
    VALUES (fencerun_admit.resource, fencerun_admit.token)
    ON CONFLICT (resource) DO NOTHING;

  -- The row lock serialises writers of this resource until their transactions end.
  SELECT f.token INTO accepted
    FROM fencerun_fence AS f
    WHERE f.resource = fencerun_admit.resource
    FOR UPDATE;
  IF NOT FOUND THEN  -- deleted by a concurrent transaction: never admit without a recorded token
    RAISE EXCEPTION USING
      ERRCODE = '40001',
      MESSAGE = format('fencerun: the fence row of %s vanished during admission; retry the transaction',
                       fencerun_admit.resource);
  END IF;

  IF fencerun_admit.token < accepted THEN
    RAISE EXCEPTION USING
      ERRCODE = 'ZF077',
      MESSAGE = format('fencerun: stale token %s rejected for %s: it has accepted %s',
                       fencerun_admit.token, fencerun_admit.resource, accepted),
      HINT = 'The lease of this writer has expired and a newer owner has written; its transaction must not commit.';
  END IF;

  IF fencerun_admit.token > accepted THEN
    UPDATE fencerun_fence AS f
      SET token = fencerun_admit.token, updated_at = now()
      WHERE f.resource = fencerun_admit.resource;
  END IF;
END
$fencerun$;
