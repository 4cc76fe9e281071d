"""Trigger rules: the rule-file language and the engine that decides launches.

    loading.py      paths -> RuleSet (the only file I/O)
    parsing.py      YAML text -> RuleSet, problems as FILE:LINE:COL: message
    durations.py    `90s`, `6h`, `2d`
    expressions.py  CEL compiled once, evaluated per event (fastpath.py: the simple subset in
                    Python with CEL's semantics)
    templating.py   `${ CEL }` in launch specs, type-checked
    model.py        Rule, Selector, Join, LaunchTemplate, RuleSet (frozen values)
    state.py        KeyState: one key's memory, JSON-safe
    engine.py       route / evaluate / tick / observe: pure decisions -> DecisionRecords
    simulation.py   replays events through the engine on a simulated clock

The reference for rule authors is docs/rules.md.
"""
