-- fencerun fencing guard for MariaDB and MySQL (printed by `fencerun fence sql mysql`).
--
-- Load it with the mariadb (or mysql) client, which understands DELIMITER:
--
--   fencerun fence sql mysql | mariadb mydb
--
-- Call fencerun_admit(resource, token) inside the writer's own transaction, before its writes:
--
--   START TRANSACTION;
--   CALL fencerun_admit('orders', 1718000000000123);  -- the token from $FENCERUN_TOKEN
--   UPDATE orders SET ...;
--   COMMIT;
--
-- The procedure takes a row lock on the resource's fence row (SELECT ... FOR UPDATE), which it holds
-- until the transaction ends, so writers of one resource are serialised. A token older than the
-- greatest one the resource has accepted raises SQLSTATE 45077 ("fencerun: stale token ... rejected
-- for ...: it has accepted ..."); a NULL, non-positive or too large token (2^53 and above) raises
-- SQLSTATE 22023. An equal token is accepted; a greater one is recorded, and it is committed
-- together with the writes.
--
-- An error in MariaDB and MySQL ends the statement, not the transaction: on any error from
-- fencerun_admit, ROLLBACK (and do not commit). The mariadb client does so by itself: without --force
-- it stops at the first error, and the transaction it leaves open rolls back when it disconnects.
-- The fence table is InnoDB; the procedure works at every isolation level (the locking read sees the
-- latest committed token). A deadlock (SQLSTATE 40001, error 1213) rolls the transaction back;
-- retry it as for any deadlock.
-- Running this script again is safe (it replaces the procedure and keeps the table).

CREATE TABLE IF NOT EXISTS fencerun_fence (
  resource   VARCHAR(255) NOT NULL PRIMARY KEY,
  token      BIGINT NOT NULL CHECK (token > 0),
  updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB;

DROP PROCEDURE IF EXISTS fencerun_admit;

DELIMITER //
CREATE PROCEDURE fencerun_admit(IN p_resource VARCHAR(255), IN p_token BIGINT)
  MODIFIES SQL DATA
  COMMENT 'fencerun: admit a fencing token for a resource, or raise SQLSTATE 45077 (stale) / 22023 (malformed)'
BEGIN
  DECLARE accepted BIGINT DEFAULT NULL;
  DECLARE message VARCHAR(512);

  IF p_resource IS NULL OR p_token IS NULL OR p_token <= 0 OR p_token >= 9007199254740992 THEN
    SET message = CONCAT('fencerun: invalid fencing token ', COALESCE(p_token, 'NULL'), ' for ',
                         COALESCE(p_resource, 'NULL'), ' (expected a positive integer below 2^53)');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = message;
  END IF;

  -- Insert if missing; on an existing row this takes its lock as well. Concurrent first writers wait
  -- for the one whose insert went first.
  INSERT INTO fencerun_fence (resource, token) VALUES (p_resource, p_token)
    ON DUPLICATE KEY UPDATE resource = resource;

  -- The row lock serialises writers of this resource until their transactions end.
  SELECT token INTO accepted FROM fencerun_fence WHERE resource = p_resource FOR UPDATE;
  IF accepted IS NULL THEN  -- deleted by a concurrent transaction: never admit without a recorded token
    SET message = CONCAT('fencerun: the fence row of ', p_resource, ' vanished during admission; retry the transaction');
    SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = message;
  END IF;

  IF p_token < accepted THEN
    SET message = CONCAT('fencerun: stale token ', p_token, ' rejected for ', p_resource, ': it has accepted ', accepted);
    SIGNAL SQLSTATE '45077' SET MESSAGE_TEXT = message;
  END IF;

  IF p_token > accepted THEN
    UPDATE fencerun_fence SET token = p_token, updated_at = CURRENT_TIMESTAMP(6) WHERE resource = p_resource;
  END IF;
END //
DELIMITER ;
