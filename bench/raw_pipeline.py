"""The baseline of the worker benchmarks: the same Kafka work with nothing else.

`python -m bench.raw_pipeline BOOTSTRAP INPUT OUTPUT GROUP COUNT` joins consumer group GROUP
on topic INPUT from its beginning, and for every record it reads (`getmany`, in batches)
produces one record to OUTPUT (the input's key, value and headers), waits until the batch's
records are acknowledged, then commits the batch's offsets; it exits after COUNT records.
That is what any Kafka-in, Kafka-out service must do per event: consume it, produce one
record, commit. No decoding, no state. It runs in a process of its own, as the worker does,
so `bench/worker.py` reads its CPU time and its progress the same way.
"""

from __future__ import annotations

import asyncio
import sys


async def pipeline(bootstrap: str, source: str, target: str, group: str, count: int) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

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
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    bootstrap, source, target, group, count = sys.argv[1:6]
    asyncio.run(pipeline(bootstrap, source, target, group, int(count)))
