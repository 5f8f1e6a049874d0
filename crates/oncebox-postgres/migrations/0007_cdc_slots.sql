-- oncebox: what the log-tailing relay (CDC) remembers of its replication slots, so that
-- a slot that vanished (a failover to a standby, which carries no logical slot before
-- PostgreSQL 17; a slot dropped while a relay stood by) is noticed instead of being
-- created again silently over the messages it held. One row per slot this schema's
-- relays have read: the slot's confirmed position, as last reported by its reader.
-- Idempotent.

CREATE TABLE IF NOT EXISTS :"schema".cdc_slots (
    slot          text        PRIMARY KEY,
    confirmed_lsn pg_lsn      NOT NULL,  -- the slot's confirmed position, at least
    updated_at    timestamptz NOT NULL DEFAULT now()
);
