"""A client in another language for oncebox's interop tests: reads what oncebox sent
and checks it with the CloudEvents SDK's binding helpers, or sends what a foreign
producer would. Driven by the Rust tests (crates/oncebox-*/tests/interop.rs).

    peer.py nats-read URL SUBJECT COUNT      one JSON line per event read, as the SDK sees it
    peer.py nats-write URL SUBJECT           the foreign producer's cases, in order
    peer.py amqp-read URL QUEUE COUNT        (pika) the same, from a RabbitMQ queue
    peer.py amqp-write URL EXCHANGE TOPIC    (pika) the foreign producer's cases, in order
    peer.py kafka-read SERVERS TOPIC COUNT   (confluent-kafka) the same, from a topic
    peer.py kafka-write SERVERS TOPIC        (confluent-kafka) the foreign producer's cases
    peer.py redis-read URL STREAM COUNT      (redis-py) the entries' fields, one JSON line
                                             each (no CloudEvents binding for Redis exists)
    peer.py redis-write URL STREAM           (redis-py) the foreign producer's cases
    peer.py sqs-read ENDPOINT QUEUE_URL COUNT
                                             (boto3) one JSON line per event read with the
                                             SDK's Kafka binding (SQS has none; oncebox
                                             writes Kafka's ce_ names as attributes)
    peer.py sqs-write ENDPOINT QUEUE_URL     (boto3) the foreign producer's cases, in one
                                             FIFO group
"""

import asyncio
import json
import sys

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat


def event_json(event, raw_headers, **extra):
    attributes = {
        name: (value.isoformat() if hasattr(value, "isoformat") else value)
        for name, value in event.get_attributes().items()
    }
    return json.dumps(
        {"attributes": attributes, "headers": raw_headers, **extra}, default=plain
    )


def plain(value):
    """JSON for the native values a client hands over (bytes, datetime)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


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


def amqp_read(url, queue, count):
    import time

    import pika
    from cloudevents.core.bindings import amqp as ce_amqp

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    deadline = time.monotonic() + 20
    read = 0
    while read < count:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            if time.monotonic() > deadline:
                sys.exit(f"no message in {queue} within 20 s")
            time.sleep(0.1)
            continue
        headers = dict(properties.headers or {})
        # RabbitMQ stands in for AMQP 1.0: its headers are the application properties,
        # its content_type property the content-type one.
        message = ce_amqp.AMQPMessage(
            properties=(
                {"content-type": properties.content_type}
                if properties.content_type
                else {}
            ),
            application_properties=headers,
            application_data=body,
        )
        event = ce_amqp.from_binary(message, JSONFormat())
        print(
            event_json(
                event,
                headers,
                content_type=properties.content_type,
                message_id=properties.message_id,
            ),
            flush=True,
        )
        read += 1
    connection.close()


def amqp_write(url, exchange, topic):
    from datetime import datetime, timezone

    import pika
    from cloudevents.core.bindings import amqp as ce_amqp
    from cloudevents.core.bindings import rabbitmq as ce_rabbitmq
    from cloudevents.core.v1.event import CloudEvent

    time = datetime(2026, 11, 21, 13, 5, 9, 123000, tzinfo=timezone.utc)

    def sdk(event_id, binding=ce_amqp):
        event = CloudEvent(
            attributes={
                "id": event_id,
                "source": "/python",
                "type": "order.placed",
                "time": time,
                "datacontenttype": "text/plain",
            },
            data=None,
        )
        if binding is ce_rabbitmq:
            message = ce_rabbitmq.to_binary(event, JSONFormat())
            return message.headers, message.content_type
        message = ce_amqp.to_binary(event, JSONFormat())
        return message.application_properties, message.properties["content-type"]

    base = {
        "cloudEvents_specversion": "1.0",
        "cloudEvents_source": "/python",
        "cloudEvents_type": "order.placed",
    }
    cases = [
        # The SDK's AMQP binding: time as an integer of milliseconds (AMQP 1.0's
        # timestamp), content type as the content_type property.
        ("uuid", *sdk("0190b7a4-7f3e-7c4a-9a51-2c1d3e4f5a6b")),
        ("order-42-v1", *sdk("order-42-v1")),
        ("duplicate", *sdk("order-42-v1")),
        ("missing", dict(base), None),
        ("empty", {**base, "cloudEvents_id": ""}, None),
        # The SDK's RabbitMQ binding (knative's): ce- headers, all strings.
        ("knative", *sdk("knative-1", ce_rabbitmq)),
        # AMQP 0-9-1's own timestamp type (seconds), as pika writes a datetime.
        ("timestamp", {**base, "cloudEvents_id": "timestamp-1", "cloudEvents_time": time}, None),
        # A byte array that is not UTF-8 (pika sends bytes as AMQP's byte array).
        ("not-utf8", {**base, "cloudEvents_id": "latin-1", "x-note": b"caf\xe9"}, None),
    ]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    for payload, headers, content_type in cases:
        channel.basic_publish(
            exchange,
            topic,
            payload.encode(),
            pika.BasicProperties(
                headers=headers, content_type=content_type, delivery_mode=2
            ),
            mandatory=True,
        )
    connection.close()


def kafka_read(servers, topic, count):
    import time
    import uuid

    from cloudevents.core.bindings import kafka as ce_kafka
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"interop-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    read = 0
    while read < count:
        if time.monotonic() > deadline:
            sys.exit(f"no message in {topic} within 30 s")
        record = consumer.poll(0.5)
        if record is None:
            continue
        if record.error():
            sys.exit(f"kafka: {record.error()}")
        headers = {name: value for name, value in record.headers() or []}
        event = ce_kafka.from_binary(
            ce_kafka.KafkaMessage(headers=headers, key=record.key(), value=record.value()),
            JSONFormat(),
        )
        print(event_json(event, headers, key=record.key()), flush=True)
        read += 1
    consumer.close()


def kafka_write(servers, topic):
    from datetime import datetime, timezone

    from cloudevents.core.bindings import kafka as ce_kafka
    from cloudevents.core.v1.event import CloudEvent
    from confluent_kafka import Producer

    def sdk(event_id):
        event = CloudEvent(
            attributes={
                "id": event_id,
                "source": "/python",
                "type": "order.placed",
                "subject": "order-42",
                "time": datetime(2026, 11, 21, 13, 5, 9, 123000, tzinfo=timezone.utc),
                "datacontenttype": "text/plain",
            },
            data=None,
        )
        return ce_kafka.to_binary(event, JSONFormat()).headers

    base = {"ce_specversion": "1.0", "ce_source": "/python", "ce_type": "order.placed"}
    cases = [
        # The SDK's Kafka binding: content-type header, ce_ attributes.
        ("uuid", sdk("0190b7a4-7f3e-7c4a-9a51-2c1d3e4f5a6b")),
        ("order-42-v1", sdk("order-42-v1")),
        ("duplicate", sdk("order-42-v1")),
        ("missing", dict(base)),
        ("empty", {**base, "ce_id": ""}),
        # Kafka header values are bytes: one that is not UTF-8.
        ("not-utf8", {**base, "ce_id": "latin-1", "x-note": b"caf\xe9"}),
    ]
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    for payload, headers in cases:
        # One key, one partition: the cases arrive in order.
        producer.produce(topic, payload.encode(), key=b"order-42", headers=list(headers.items()))
    if producer.flush(30) != 0:
        sys.exit("kafka: messages left unsent")


def redis_read(url, stream, count):
    import redis

    client = redis.Redis.from_url(url)
    for _, fields in client.xrange(stream, count=count):
        print(json.dumps({name.decode(): value for name, value in fields.items()}, default=plain))
    client.close()


def redis_write(url, stream):
    import redis

    # Kafka's naming, as oncebox's entries: ce_ fields, the payload in `data`.
    base = {"ce_specversion": "1.0", "ce_source": "/python", "ce_type": "order.placed"}
    sdk_like = {
        **base,
        "ce_subject": "order-42",
        "ce_time": "2026-11-21T13:05:09.123Z",
        "content-type": "text/plain",
    }
    cases = [
        ("uuid", {**sdk_like, "ce_id": "0190b7a4-7f3e-7c4a-9a51-2c1d3e4f5a6b"}),
        ("order-42-v1", {**sdk_like, "ce_id": "order-42-v1"}),
        ("duplicate", {**sdk_like, "ce_id": "order-42-v1"}),
        ("missing", dict(base)),
        ("empty", {**base, "ce_id": ""}),
        # Field values are bytes to Redis: one that is not UTF-8.
        ("not-utf8", {**base, "ce_id": "latin-1", "x-note": b"caf\xe9"}),
    ]
    client = redis.Redis.from_url(url)
    for payload, fields in cases:
        client.xadd(stream, {**fields, "data": payload.encode()})
    client.close()


def sqs_client(endpoint):
    import boto3

    # Local servers take any credentials; the region only shapes URLs.
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="interop",
        aws_secret_access_key="interop",
    )


def sqs_attribute(value):
    if value["DataType"].startswith("Binary"):
        return value["BinaryValue"]
    return value["StringValue"]


def sqs_read(endpoint, queue_url, count):
    import time

    from cloudevents.core.bindings import kafka as ce_kafka

    client = sqs_client(endpoint)
    deadline = time.monotonic() + 30
    read = 0
    while read < count:
        if time.monotonic() > deadline:
            sys.exit(f"no message in {queue_url} within 30 s")
        answer = client.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        for message in answer.get("Messages", []):
            attributes = {
                name: sqs_attribute(value)
                for name, value in message.get("MessageAttributes", {}).items()
            }
            headers = {
                name: value if isinstance(value, bytes) else value.encode()
                for name, value in attributes.items()
            }
            event = ce_kafka.from_binary(
                ce_kafka.KafkaMessage(headers=headers, key=None, value=message["Body"].encode()),
                JSONFormat(),
            )
            print(
                event_json(
                    event,
                    attributes,
                    body=message["Body"],
                    group=message.get("Attributes", {}).get("MessageGroupId"),
                    dedup=message.get("Attributes", {}).get("MessageDeduplicationId"),
                ),
                flush=True,
            )
            client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            read += 1


def sqs_write(endpoint, queue_url):
    def text(value):
        return {"DataType": "String", "StringValue": value}

    base = {
        "ce_specversion": text("1.0"),
        "ce_source": text("/python"),
        "ce_type": text("order.placed"),
    }
    sdk_like = {
        **base,
        "ce_subject": text("order-42"),
        "ce_time": text("2026-11-21T13:05:09.123Z"),
        "content-type": text("text/plain"),
    }
    cases = [
        ("uuid", {**sdk_like, "ce_id": text("0190b7a4-7f3e-7c4a-9a51-2c1d3e4f5a6b")}),
        ("order-42-v1", {**sdk_like, "ce_id": text("order-42-v1")}),
        ("duplicate", {**sdk_like, "ce_id": text("order-42-v1")}),
        ("missing", dict(base)),
        ("empty", {**base, "ce_id": {"DataType": "String", "StringValue": ""}}),
        # A Binary attribute that is not UTF-8.
        (
            "not-utf8",
            {**base, "ce_id": text("latin-1"), "x-note": {"DataType": "Binary", "BinaryValue": b"caf\xe9"}},
        ),
    ]
    client = sqs_client(endpoint)
    for n, (payload, attributes) in enumerate(cases):
        try:
            client.send_message(
                QueueUrl=queue_url,
                MessageBody=payload,
                MessageAttributes=attributes,
                MessageGroupId="order-42",
                MessageDeduplicationId=f"python-{n}",
            )
        except client.exceptions.ClientError as error:
            sys.exit(f"sqs: {payload}: {error}")


def main():
    command, url, subject, *rest = sys.argv[1:]
    if command == "nats-read":
        asyncio.run(nats_read(url, subject, int(rest[0])))
    elif command == "nats-write":
        asyncio.run(nats_write(url, subject))
    elif command == "amqp-read":
        amqp_read(url, subject, int(rest[0]))
    elif command == "amqp-write":
        amqp_write(url, subject, rest[0])
    elif command == "kafka-read":
        kafka_read(url, subject, int(rest[0]))
    elif command == "kafka-write":
        kafka_write(url, subject)
    elif command == "redis-read":
        redis_read(url, subject, int(rest[0]))
    elif command == "redis-write":
        redis_write(url, subject)
    elif command == "sqs-read":
        sqs_read(url, subject, int(rest[0]))
    elif command == "sqs-write":
        sqs_write(url, subject)
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
