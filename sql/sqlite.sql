-- fencerun fencing guard for SQLite (printed by `fencerun fence sql sqlite`).
--
-- Load it once into the database (sqlite3 app.db < sqlite.sql, or any binding's exec()). A writer
-- admits its token by inserting it into the view fencerun_admit, inside its own transaction, before
-- its writes; the transaction must be BEGIN IMMEDIATE, and the connection needs a busy timeout so
-- that writers wait for each other instead of failing with SQLITE_BUSY:
--
--   sqlite3 -bail -cmd '.timeout 30000' app.db <<'SQL'
--   BEGIN IMMEDIATE;
--   INSERT INTO fencerun_admit (resource, token) VALUES ('orders', 1718000000000123);
--   UPDATE orders SET ...;
--   COMMIT;
--   SQL
--
-- BEGIN IMMEDIATE takes the database's write lock, held until COMMIT or ROLLBACK, so writers are
-- serialised, reads included. A token older than the greatest one the resource has accepted fails
-- the INSERT with SQLITE_CONSTRAINT_TRIGGER and the message "fencerun: stale token rejected: the
-- resource has accepted a greater token"; a token that is not an integer, not positive, or 2^53 or
-- above fails it with "fencerun: invalid fencing token (expected a positive integer below 2^53)".
-- (SQLite before 3.47 takes only a literal message in RAISE(), so the tokens are not in it: the
-- resource's accepted token is in fencerun_fence.) An equal token is accepted; a greater one is
-- recorded, and it is committed together with the writes.
--
-- RAISE(ABORT) undoes the INSERT, not the transaction: on any error, ROLLBACK and do not commit.
-- sqlite3 -bail does so by itself: it stops at the first error, and closing the connection rolls
-- back the open transaction.
-- Running this script again is safe (it keeps the table, the view and the trigger).

CREATE TABLE IF NOT EXISTS fencerun_fence (
  resource   TEXT NOT NULL PRIMARY KEY,
  token      INTEGER NOT NULL CHECK (typeof(token) = 'integer' AND token > 0),
  updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE VIEW IF NOT EXISTS fencerun_admit (resource, token) AS
  SELECT resource, token FROM fencerun_fence;

CREATE TRIGGER IF NOT EXISTS fencerun_admit_token INSTEAD OF INSERT ON fencerun_admit
BEGIN
  SELECT RAISE(ABORT, 'fencerun: invalid fencing token (expected a positive integer below 2^53)')
    WHERE NEW.resource IS NULL OR typeof(NEW.token) <> 'integer'
       OR NEW.token <= 0 OR NEW.token >= 9007199254740992;
  INSERT INTO fencerun_fence (resource, token) VALUES (NEW.resource, NEW.token)
    ON CONFLICT (resource) DO NOTHING;
  SELECT RAISE(ABORT, 'fencerun: stale token rejected: the resource has accepted a greater token')
    FROM fencerun_fence WHERE resource = NEW.resource AND token > NEW.token;
  UPDATE fencerun_fence SET token = NEW.token, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    WHERE resource = NEW.resource AND token < NEW.token;
END;
