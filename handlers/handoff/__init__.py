"""`tuneloop handoff`: promoted adapters from the completion topic into vLLM servers.

    consumer.py      `run_handoff`: the consumer group on the completion topic, the wiring
    service.py       `HandoffService`: accept an event; one task per serving target
    vllm.py          `VllmClient`: load, list, complete, unload (vLLM's statuses and bodies)
    ledger_topic.py  `KafkaLedger`: the ledger on a compacted topic

The decisions are the pure core's (`orchestrator/handoff/`); docs/inference.md tells the
story and shows vLLM's flags.
"""
