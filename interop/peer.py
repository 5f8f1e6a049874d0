"""A client in another language for oncebox's interop tests: reads what oncebox sent
and checks it with the CloudEvents SDK's binding helpers, or sends what a foreign
producer would. Driven by the Rust tests (crates/oncebox-nats/tests/interop.rs).

    peer.py nats-read URL SUBJECT COUNT    one JSON line per event read, as the SDK sees it
    peer.py nats-write URL SUBJECT         the foreign producer's cases, in order
"""

import asyncio
import json
import sys

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat


def event_json(event, raw_headers):
    attributes = {
        name: (value.isoformat() if hasattr(value, "isoformat") else value)
        for name, value in event.get_attributes().items()
    }
    return json.dumps({"attributes": attributes, "headers": raw_headers})


async def nats_read(url, subject, count):
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    sub = await js.subscribe(subject, ordered_consumer=True)
    for _ in range(count):
        message = await sub.next_msg(timeout=20)
        headers = dict(message.headers or {})
        # NATS's binary mode is HTTP's header rule under the same ce- prefix.
        event = ce_http.from_binary(
            ce_http.HTTPMessage(headers=headers, body=message.data), JSONFormat()
        )
        print(event_json(event, headers), flush=True)
    await client.close()


async def nats_write(url, subject):
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    base = {"ce-specversion": "1.0", "ce-source": "/python", "ce-type": "order.placed"}
    cases = [
        ("uuid", {**base, "ce-id": "0190b7a4-7f3e-7c4a-9a51-2c1d3e4f5a6b"}),
        ("order-42-v1", {**base, "ce-id": "order-42-v1"}),
        ("duplicate", {**base, "ce-id": "order-42-v1"}),
        ("missing", dict(base)),
        ("empty", {**base, "ce-id": ""}),
        (
            "encoded",
            {
                **base,
                "ce-id": "encoded-1",
                "ce-subject": "caf%C3%A9%20au%20lait",
                "ce-time": "2026-11-21T13%3A05%3A09Z",
            },
        ),
    ]
    for payload, headers in cases:
        await js.publish(subject, payload.encode(), headers=headers)
    await client.close()


def main():
    command, url, subject, *rest = sys.argv[1:]
    if command == "nats-read":
        asyncio.run(nats_read(url, subject, int(rest[0])))
    elif command == "nats-write":
        asyncio.run(nats_write(url, subject))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
