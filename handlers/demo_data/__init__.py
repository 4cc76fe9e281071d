"""What `tuneloop demo` feeds the loop, shipped in the wheel: its rule file and its dataset.

`docs/examples/demo/rules.yaml` and `docs/examples/datasets/unit-conversions.jsonl` are the
docs' copies; tests/unit/test_demo_data.py keeps them identical to these.
"""
