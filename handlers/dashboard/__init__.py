"""The operator's window: a read-only web dashboard of one worker (issue 15, item 4).

- `board.py` is what the pages show: rings of the newest decision records, jobs and dead
  letters, fed by `tailing.py` (the audit, output and dead-letter topics) and by the worker's
  own job observations; it tells live pages of each change (server-sent events).
- `pages.py` renders server-side HTML (escaped f-strings, no build step, no framework).
- `routes.py` is the aiohttp handlers, all GET: nothing here can launch or change anything.

The composition root (`handlers/app.py`) builds one `Dashboard` per worker with
`install_dashboard`; the worker's web server mounts its `Dashboard.routes()` table.
"""

from handlers.dashboard.routes import Dashboard, install_dashboard

__all__ = ["Dashboard", "install_dashboard"]
