"""Writes unit-conversions.jsonl: the small dataset tuneloop ships for `make demo`.

300 prompt/completion records on one theme (converting quantities between metric and
imperial units), with answers in one fixed, checkable format: "<n> <unit> is <m> <unit>."
SmolLM2-135M does not answer this way out of the box and picks the format up within a
handful of LoRA steps, so base vs adapter generations differ visibly. Deterministic:
re-running rewrites identical bytes.

    python docs/examples/datasets/make_unit_conversions.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CONVERSIONS = (
    ("kilometres", "miles", lambda x: x * 0.621371),
    ("miles", "kilometres", lambda x: x * 1.609344),
    ("kilograms", "pounds", lambda x: x * 2.204623),
    ("pounds", "kilograms", lambda x: x * 0.453592),
    ("litres", "US gallons", lambda x: x * 0.264172),
    ("degrees Celsius", "degrees Fahrenheit", lambda x: x * 9 / 5 + 32),
    ("metres", "feet", lambda x: x * 3.280840),
    ("centimetres", "inches", lambda x: x * 0.393701),
)
PHRASINGS = (
    "Convert {n} {a} to {b}.",
    "How many {b} is {n} {a}?",
    "What is {n} {a} in {b}?",
    "{n} {a} in {b}, please.",
)
COUNT = 300


def records(count: int = COUNT, *, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)  # noqa: S311 -- reproducible data, not secrets
    rows = []
    for _ in range(count):
        source, target, convert = rng.choice(CONVERSIONS)
        amount = rng.choice(
            (rng.randint(1, 20), rng.randint(20, 500), round(rng.uniform(0.5, 50), 1))
        )
        prompt = rng.choice(PHRASINGS).format(n=amount, a=source, b=target)
        rows.append(
            {
                "prompt": f"Question: {prompt}\nAnswer:",
                "completion": f" {amount} {source} is {convert(amount):.2f} {target}.",
            }
        )
    return rows


def main() -> None:
    target = Path(__file__).with_name("unit-conversions.jsonl")
    target.write_text("".join(json.dumps(row) + "\n" for row in records()))
    print(f"wrote {COUNT} records to {target}")


if __name__ == "__main__":
    main()
