-- A producer outside Rust: places one order on PostgreSQL and announces it through
-- oncebox's outbox table, in one transaction, so the event goes out if and only if the
-- order committed. `oncebox relay` publishes it.
--
--   oncebox --store-url postgres://app@db/shop migrate
--   psql postgres://app@db/shop -v schema=oncebox \
--        -v order_id=o-1 -v customer=c-7 -v amount=4200 -f place_order.sql
--
-- `schema` is oncebox's schema (`store.schema`, default `oncebox`); `shop_orders` is the
-- service's own table, found on its search_path. The customer is the ordering key: the
-- relay publishes one customer's orders in the order they committed.
BEGIN;

INSERT INTO shop_orders (id, customer, amount) VALUES (:'order_id', :'customer', :amount);

-- oncebox's enqueue statement (the oncebox-postgres crate docs, "Producing from other
-- languages"): the advisory lock on the key, taken before the row's `seq` is allocated,
-- makes rows of one key take their `seq` in commit order.
WITH guard AS MATERIALIZED (
  SELECT true FROM pg_advisory_xact_lock(
    1869505387,
    hashtext(:'customer') # (quote_ident(:'schema') || '.outbox')::regclass::oid::int4)
)
INSERT INTO :"schema".outbox (id, topic, key, kind, payload)
SELECT gen_random_uuid(), 'orders', :'customer', 'OrderPlaced',
       convert_to(json_build_object('order_id', :'order_id', 'customer', :'customer',
                                    'amount', :amount)::text, 'UTF8')
FROM guard;

COMMIT;
