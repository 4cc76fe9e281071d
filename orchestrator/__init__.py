"""The core of tuneloop: values, rules, decisions, naming and tracking.

Everything here is pure: no Kafka, faust, Kubernetes or torch imports (the import-linter
contract in `.importlinter` enforces it), no clock reads and no randomness. The adapters in
`handlers/` drive it; the adapters in `runtimes/` are driven by it through `ports`.
"""
