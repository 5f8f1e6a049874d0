"""A producer outside Rust: places orders on SQLite and announces each through
oncebox's outbox table, the order row and its event in one transaction, so an event
goes out if and only if its order committed. `oncebox relay` publishes the events.

    oncebox --store-url sqlite://shop.db migrate
    python3 place_order.py shop.db 1000 20      # 1000 orders of 20 customers

Only the standard library is needed. Each customer is the ordering key of its orders:
the relay publishes one customer's orders in the order they committed.
"""

import json
import sqlite3
import sys
import time
import uuid

# oncebox's outbox row: times are milliseconds since the Unix epoch; `available_at` is
# when the row may be published (now); headers are a JSON object of strings.
ENQUEUE = """
INSERT INTO oncebox_outbox (id, topic, key, kind, headers, payload, created_at, available_at)
VALUES (?, ?, ?, ?, '{}', ?, ?, ?)
"""


def place_order(db, order_id, customer, amount):
    """Writes the order and its OrderPlaced event in one transaction."""
    now = int(time.time() * 1000)
    event = json.dumps({"order_id": order_id, "customer": customer, "amount": amount})
    with db:  # commits both rows, or rolls both back on an exception
        db.execute(
            "INSERT INTO shop_orders (id, customer, amount) VALUES (?, ?, ?)",
            (order_id, customer, amount),
        )
        db.execute(
            ENQUEUE,
            (str(uuid.uuid4()), "orders", customer, "OrderPlaced", event.encode(), now, now),
        )


def main():
    path, count, customers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    db = sqlite3.connect(path, timeout=30)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS shop_orders "
        "(id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount INTEGER NOT NULL)"
    )
    placed = {}
    for i in range(count):
        customer = f"c{i % customers}"
        placed[customer] = placed.get(customer, 0) + 1
        # The order id carries the customer's order number, so a reader can check order.
        place_order(db, f"{customer}-{placed[customer]}", customer, 100 + i)
    db.close()


if __name__ == "__main__":
    main()
