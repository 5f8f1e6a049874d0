-- oncebox SQLite schema, version 2: leases are held by claims, not written into rows.
--
-- A relay used to lease a batch by writing a token and an end time into every claimed
-- row, which rewrote each row (and its two pending-index entries) once more on its way
-- out. A claim is now one row here: its token, the end of its lease, and the `seq`s it
-- holds as a JSON array. A pending row is leased while a claim whose lease has not
-- ended holds it.
--
-- Claims never overlap: a claim takes only rows that no live claim holds, and inserting
-- it deletes every claim whose lease had ended by then (the triggers below), in the
-- same statement. So a row is in at most one claim, and a relay whose lease ended and
-- whose rows were claimed again finds its claim gone: its settlements change nothing.
--
-- Apply after version 1, once: unlike version 1, this file is not idempotent (it drops
-- the lease columns). Leases held while it runs are dropped, and their rows delivered
-- again: stop the relays first.

CREATE TABLE oncebox_outbox_claims (
    token      TEXT    PRIMARY KEY,  -- the claim's lease token
    claimed_at INTEGER NOT NULL,
    until      INTEGER NOT NULL,     -- the lease ends
    seqs       TEXT    NOT NULL      -- JSON array of the `seq`s of the rows it holds
);

CREATE TRIGGER oncebox_outbox_claims_supersede
AFTER INSERT ON oncebox_outbox_claims
BEGIN
    DELETE FROM oncebox_outbox_claims WHERE until <= NEW.claimed_at;
END;

DROP INDEX oncebox_outbox_pending;
DROP INDEX oncebox_outbox_pending_key;
ALTER TABLE oncebox_outbox DROP COLUMN lease_token;
ALTER TABLE oncebox_outbox DROP COLUMN lease_until;

-- Claim: pending rows in commit order (covering the claimability test).
CREATE INDEX oncebox_outbox_pending
    ON oncebox_outbox (seq, available_at, key)
    WHERE status = 'pending';

-- Claim: earlier pending rows of the same key (per-key order).
CREATE INDEX oncebox_outbox_pending_key
    ON oncebox_outbox (key, seq, available_at)
    WHERE status = 'pending' AND key IS NOT NULL;

-- The durable inbox's claims, one consumer's each.
CREATE TABLE oncebox_durable_inbox_claims (
    token      TEXT    PRIMARY KEY,
    consumer   TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL,
    until      INTEGER NOT NULL,
    seqs       TEXT    NOT NULL
);

CREATE TRIGGER oncebox_durable_inbox_claims_supersede
AFTER INSERT ON oncebox_durable_inbox_claims
BEGIN
    DELETE FROM oncebox_durable_inbox_claims
    WHERE consumer = NEW.consumer AND until <= NEW.claimed_at;
END;

DROP INDEX oncebox_durable_inbox_pending;
DROP INDEX oncebox_durable_inbox_pending_key;
ALTER TABLE oncebox_durable_inbox DROP COLUMN lease_token;
ALTER TABLE oncebox_durable_inbox DROP COLUMN lease_until;

CREATE INDEX oncebox_durable_inbox_pending
    ON oncebox_durable_inbox (consumer, seq, available_at, key)
    WHERE status = 'pending';

CREATE INDEX oncebox_durable_inbox_pending_key
    ON oncebox_durable_inbox (consumer, key, seq, available_at)
    WHERE status = 'pending' AND key IS NOT NULL;
