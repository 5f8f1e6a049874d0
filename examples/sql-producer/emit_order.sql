-- A producer outside Rust, for the log-tailing relay's message mode (`relay.mode =
-- "cdc"`, `[cdc] source = "messages"`): places one order and emits its event into the
-- transaction's WAL with oncebox's `emit` function. No outbox row is written; the event
-- is published if and only if the order committed.
--
--   psql postgres://app@db/shop -v schema=oncebox \
--        -v order_id=o-1 -v customer=c-7 -v amount=4200 -f emit_order.sql
--
-- The customer is the ordering key: the relay publishes one customer's orders in the
-- order they committed.
BEGIN;

INSERT INTO shop_orders (id, customer, amount) VALUES (:'order_id', :'customer', :amount);

SELECT :"schema".emit(
  'orders', :'customer', 'OrderPlaced', '{}',
  convert_to(json_build_object('order_id', :'order_id', 'customer', :'customer',
                               'amount', :amount)::text, 'UTF8'));

COMMIT;
