-- oncebox MySQL / MariaDB schema, version 2: leases held by a table of claims.
--
-- A claim used to write its lease (token and end) into every row it took, and that
-- update was a sixth of a relay's time per batch. Now a claim is one row of
-- `oncebox_claims`, naming the rows it holds; a pending row is leased while a claim whose
-- lease has not ended names it. The spool tables lose their lease columns.
--
-- Leases held while this runs are dropped: their rows are claimed again and delivered
-- once more, which the at-least-once contract allows. Stop the relays first if that
-- matters. Every statement is idempotent, as in version 1, so a run that stopped half way
-- is finished by running the file again.

-- The live claims of every spool table. `spool` is the name of the table's row in
-- `oncebox_claim_locks` (`oncebox_outbox`, or `oncebox_durable_inbox:<consumer>`);
-- `seqs` is a JSON array of the `seq`s the claim holds. Claims of a table are written
-- only under its claim lock, and each claim first deletes the claims whose lease ended,
-- so the claims of a table never hold the same row.
CREATE TABLE IF NOT EXISTS oncebox_claims (
    spool       VARBINARY(300) NOT NULL,
    token       BINARY(16)     NOT NULL,
    lease_until BIGINT         NOT NULL,               -- the lease ends (ms, database clock)
    seqs        LONGTEXT       NOT NULL,               -- JSON array of the rows held
    PRIMARY KEY (spool, token)
) ENGINE = InnoDB;

-- The lease columns go. MySQL has no `DROP COLUMN IF EXISTS` (MariaDB has), so each drop
-- is prepared only while the column is there.
SET @oncebox_drop = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = 'oncebox_outbox'
          AND column_name = 'lease_token'),
    'ALTER TABLE oncebox_outbox DROP COLUMN lease_token, DROP COLUMN lease_until',
    'DO 0');
PREPARE oncebox_drop FROM @oncebox_drop;
EXECUTE oncebox_drop;
DEALLOCATE PREPARE oncebox_drop;

SET @oncebox_drop = IF(EXISTS (
        SELECT 1 FROM information_schema.columns
        WHERE table_schema = DATABASE() AND table_name = 'oncebox_durable_inbox'
          AND column_name = 'lease_token'),
    'ALTER TABLE oncebox_durable_inbox DROP COLUMN lease_token, DROP COLUMN lease_until',
    'DO 0');
PREPARE oncebox_drop FROM @oncebox_drop;
EXECUTE oncebox_drop;
DEALLOCATE PREPARE oncebox_drop;
SET @oncebox_drop = NULL;
