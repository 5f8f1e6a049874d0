-- oncebox: dead letters of the log-tailing relay (CDC) that a replay publishes again.
-- Neither of its sources reads an UPDATE of the outbox, so a replay cannot put such a
-- dead row back to pending as it does for the polling relay: it deletes the row and
-- hands the message to the relay again the way it first came.
--
-- cdc_source: which source of the log-tailing relay wrote the dead row ('messages': the
-- relay inserted it for a logical decoding message it could not publish; 'table': it
-- marked a producer's row dead). NULL for the rows of the polling relay. Dead rows
-- written before this migration are NULL too, and replay as the polling relay's: set
-- their cdc_source with SQL to replay them through the log-tailing relay. Adding the
-- column rewrites nothing, but its check reads the table once under an exclusive lock.
--
-- emit_message: writes one logical decoding message of the message source with the
-- given id and creation time (for a NULL created_at the relay takes the transaction's
-- commit time); emit() calls it, so the encoding is written in one place.
-- A replay of a message-source dead letter calls it with the dead row's message.
--
-- Idempotent: ADD COLUMN IF NOT EXISTS, CREATE OR REPLACE.

ALTER TABLE :"schema".outbox ADD COLUMN IF NOT EXISTS cdc_source text
    CHECK (cdc_source IN ('messages', 'table'));

CREATE OR REPLACE FUNCTION :"schema".emit_message(
    id         uuid,
    topic      text,
    key        text,
    kind       text,
    headers    jsonb,
    payload    bytea,
    created_at timestamptz
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
-- The function's schema is its search path, so the body knows which outbox it writes for.
SET search_path = :"schema", pg_catalog
AS $emit_message$
DECLARE
    meta bytea;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'oncebox emit: the id is NULL' USING ERRCODE = '22023';
    END IF;
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'oncebox emit: the topic is empty' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(coalesce(headers, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'oncebox emit: headers must be a JSON object of strings'
            USING ERRCODE = '22023';
    END IF;
    meta := convert_to(jsonb_build_object(
        'id', id, 'topic', topic, 'key', key, 'kind', coalesce(kind, ''),
        'headers', coalesce(headers, '{}'),
        'created_at', to_char(created_at AT TIME ZONE 'UTC',
                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
    )::text, 'UTF8');
    PERFORM pg_logical_emit_message(
        true,
        current_schema() || '.outbox',
        '\x01'::bytea || int4send(length(meta)) || meta || coalesce(payload, ''));
    RETURN id;
END
$emit_message$;

CREATE OR REPLACE FUNCTION :"schema".emit(
    topic   text,
    key     text  DEFAULT NULL,
    kind    text  DEFAULT '',
    headers jsonb DEFAULT '{}',
    payload bytea DEFAULT ''
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = :"schema", pg_catalog
AS $emit$
BEGIN
    RETURN emit_message(gen_random_uuid(), topic, key, kind, headers, payload,
                        clock_timestamp());
END
$emit$;
