"""Rewrite the TrainJob builder's golden files: `python -m tests.unit.kubernetes.update_golden`.

Run it after an intended change to `runtimes/kubernetes/manifests.py`, then review the diff
(`git diff tests/unit/kubernetes/golden`) before committing. The test
(`test_manifests.py`) only compares, so it cannot pass by rewriting what it checks.
"""

from __future__ import annotations

import sys

from tests.unit.kubernetes.golden_cases import CASES, golden_file, render


def main() -> int:
    for case in sorted(CASES):
        path = golden_file(case)
        text = render(case)
        before = path.read_text() if path.exists() else None
        if text != before:
            path.write_text(text)
        print(f"{'unchanged' if text == before else 'rewritten'}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
