-- oncebox: the message mode of the log-tailing relay (CDC). A producer in any language
-- calls :"schema".emit(topic, key, kind, headers, payload) in its transaction: the
-- message is written into the transaction's WAL as a logical decoding message (prefix
-- '<schema>.outbox', transactional, so a rollback discards it) and no row is stored.
-- The content is oncebox's encoding, version 1: a version byte, the metadata's length
-- (4 bytes, big-endian), the metadata (a JSON object) and the payload.
-- Idempotent: CREATE OR REPLACE.

CREATE OR REPLACE FUNCTION :"schema".emit(
    topic   text,
    key     text  DEFAULT NULL,
    kind    text  DEFAULT '',
    headers jsonb DEFAULT '{}',
    payload bytea DEFAULT ''
) RETURNS uuid
LANGUAGE plpgsql VOLATILE
-- The function's schema is its search path, so the body knows which outbox it writes for.
SET search_path = :"schema", pg_catalog
AS $emit$
DECLARE
    message_id uuid := gen_random_uuid();
    meta bytea;
BEGIN
    IF topic IS NULL OR topic = '' THEN
        RAISE EXCEPTION 'oncebox emit: the topic is empty' USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(coalesce(headers, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'oncebox emit: headers must be a JSON object of strings'
            USING ERRCODE = '22023';
    END IF;
    meta := convert_to(jsonb_build_object(
        'id', message_id, 'topic', topic, 'key', key, 'kind', coalesce(kind, ''),
        'headers', coalesce(headers, '{}'),
        'created_at', to_char(clock_timestamp() AT TIME ZONE 'UTC',
                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
    )::text, 'UTF8');
    PERFORM pg_logical_emit_message(
        true,
        current_schema() || '.outbox',
        '\x01'::bytea || int4send(length(meta)) || meta || coalesce(payload, ''));
    RETURN message_id;
END
$emit$;
