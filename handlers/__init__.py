"""The driving side of tuneloop: Kafka in and out, the CLI, and the wiring (`app.py`)."""
