"""The worker's one web server and what it serves.

`server.py` is the aiohttp server (created by the composition root, `handlers/app.py`, and
run inside the faust App so that it shares the worker's event loop); the other modules each
give it one route table: `health.py` (`/healthz`, `/readyz`), `metrics.py` (`/metrics`),
`ingress.py` (`POST /events`, the HTTP CloudEvents sink).
"""
