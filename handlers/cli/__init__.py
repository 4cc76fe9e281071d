"""The `tuneloop` command line. `main.py` assembles the commands from one module per area."""
