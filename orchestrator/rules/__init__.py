"""Trigger rules: the rule-file language and the engine that decides launches.

    loading.py      paths -> RuleSet (the only file I/O)
    parsing.py      YAML text -> RuleSet, problems as FILE:LINE:COL: message
    durations.py    `90s`, `6h`, `2d`
    expressions.py  CEL compiled once, evaluated per event (fastpath.py: the simple subset in
                    Python with CEL's semantics)
    templating.py   `${ CEL }` in launch specs, type-checked
    model.py        Rule, Selector, Join, LaunchTemplate, RuleSet (frozen values)
    state.py        KeyState: one key's memory, JSON-safe
    engine.py       route / evaluate / tick / observe: pure decisions -> DecisionRecords;
                    the event-time loop that calls each concern below
    matching.py     which rules an event reaches, under which key
    arrival.py      duplicates, re-deliveries, lateness; holding events until due
    windows.py      count, sum and join windows; whether a condition holds
    launching.py    the gates: debounce, cooldown, concurrency, budget
    rendering.py    the job a launch starts, from the launch templates
    timers.py       waiting launches whose time has come; next_wakeup
    pruning.py      dropping what can never matter again
    records.py      the decision records one rule writes for one key
    simulation.py   replays events through the engine on a simulated clock

The reference for rule authors is docs/rules.md.
"""
