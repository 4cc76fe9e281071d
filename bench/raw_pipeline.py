"""The baseline of the worker benchmarks: the same Kafka work with nothing else.

`python -m bench.raw_pipeline BOOTSTRAP INPUT OUTPUT GROUP COUNT` joins consumer group GROUP
on topic INPUT from its beginning, and for every record it reads (`getmany`, in batches)
produces one record to OUTPUT (the input's key, value and headers), waits until the batch's
records are acknowledged, then commits the batch's offsets; it exits after COUNT records.
That is what any Kafka-in, Kafka-out service must do per event: consume it, produce one
record, commit. No decoding, no state. It runs in a process of its own, as the worker does,
so `bench/worker.py` reads its CPU time and its progress the same way.

It is some 30 times as fast as the worker, so a backlog the worker needs seconds for lasts it
a fraction of a second, too short to sample. When it has read to the end of the topic as it
was when it started, it seeks back to the beginning and reads it again, until COUNT: every
pass is the same Kafka work, record by record.
"""

from __future__ import annotations

import asyncio
import sys


async def pipeline(bootstrap: str, source: str, target: str, group: str, count: int) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    # faust's producer settings in the worker (handlers/faust_app.py): linger 5 ms
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await consumer.start()
    await producer.start()
    done = 0
    ends: dict[TopicPartition, int] = {}
    reached: dict[TopicPartition, int] = {}
    try:
        while done < count:
            batches = await consumer.getmany(timeout_ms=500)
            sent = [
                await producer.send(target, value=r.value, key=r.key, headers=list(r.headers))
                for records in batches.values()
                for r in records
            ]
            if not sent:
                continue
            await asyncio.gather(*sent)
            await consumer.commit()
            done += len(sent)
            if not ends:  # assigned now: the end of this pass
                ends = await consumer.end_offsets(list(consumer.assignment()))
            for partition, records in batches.items():
                reached[partition] = records[-1].offset + 1
            if all(reached.get(p, 0) >= end for p, end in ends.items()):
                reached.clear()
                await consumer.seek_to_beginning(*ends)
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    bootstrap, source, target, group, count = sys.argv[1:6]
    asyncio.run(pipeline(bootstrap, source, target, group, int(count)))
