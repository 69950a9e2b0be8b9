"""REST and websocket handlers of the server extension; every one requires Jupyter's auth.

``GET  <base>/workbench/ranksets``                     every rank set with per-rank state
``POST <base>/workbench/ranksets/<id>/<action>``       interrupt | where | stop | trainer-pause|resume|stop
``DELETE <base>/workbench/ranksets/<id>``              forget a stale entry
``WS   <base>/workbench/ranksets/<id>/events``         history so far, then live event batches
"""

from __future__ import annotations

import asyncio
import json

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import web, websocket

from ..notebook import registry
from . import actions

ID = r"(?P<entry_id>[A-Za-z0-9_.-]+)"


class _Base(APIHandler):
    @property
    def monitor(self):
        return self.settings["workbench_monitor"]

    def _entry(self, entry_id: str) -> dict:
        entry = self.monitor.entry(entry_id)
        if entry is None:
            raise web.HTTPError(404, f"no running rank set {entry_id!r} (it stopped, or its kernel is gone)")
        return entry


class RankSetsHandler(_Base):
    @web.authenticated
    async def get(self):
        loop = asyncio.get_running_loop()
        entries = await loop.run_in_executor(None, self.monitor.entries)
        described = await asyncio.gather(*(loop.run_in_executor(None, self.monitor.describe, e) for e in entries))
        self.finish(json.dumps({"ranksets": list(described)}))


class RankSetHandler(_Base):
    @web.authenticated
    async def delete(self, entry_id: str):
        entry = registry.read(entry_id)
        if entry is not None and not entry["stale"] and not entry.get("stopped_by"):
            raise web.HTTPError(409, "this rank set is running: stop it first (its kernel is alive)")
        registry.remove(entry_id)
        self.monitor.gone.pop(entry_id, None)
        self.set_status(204)
        self.finish()


_QUEUED = {"ray": "Ray placement group"}  # what waits, by launcher (a Slurm job otherwise)


class ActionHandler(_Base):
    @web.authenticated
    async def post(self, entry_id: str, action: str):
        entry = self._entry(entry_id)
        if entry.get("stopped_by"):
            raise web.HTTPError(409, f"this rank set was already {entry['stopped_by']}")
        queue = entry.get("queue")
        if queue:
            raise web.HTTPError(
                409,
                f"this rank set has no ranks yet: {_QUEUED.get(entry.get('launcher'), 'Slurm job')} "
                f"{queue.get('job_id')} is {queue.get('state')} ({queue.get('reason') or 'no reason given'}); "
                "`%distrain stop` in its notebook cancels it",
            )
        body = self.get_json_body() or {}
        ranks = body.get("ranks")
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, actions.run_action, self.monitor, entry, action, ranks)
        except actions.ActionError as exc:
            raise web.HTTPError(400, str(exc)) from None
        except Exception as exc:  # the controller or a rank did not answer
            raise web.HTTPError(502, f"{action} failed: {type(exc).__name__}: {exc}") from None
        self.finish(json.dumps(result))


class EventsHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    """History so far, then every new batch of this rank set's events, as JSON text frames."""

    async def get(self, entry_id: str):
        if self.current_user is None:  # no token / cookie: refused before the upgrade
            raise web.HTTPError(403, "this websocket needs Jupyter's token")
        monitor = self.settings["workbench_monitor"]
        entry = monitor.entry(entry_id)
        if entry is None:
            raise web.HTTPError(404, f"no running rank set {entry_id!r}")
        self.reader = monitor.reader(entry)
        if self.reader is None:
            raise web.HTTPError(404, "this rank set has no event stream to read")
        self.loop = asyncio.get_running_loop()
        return await super().get(entry_id)

    def open(self, entry_id: str):
        history = self.reader.history()
        self.write_message(json.dumps({"type": "history", "events": history}))
        self.reader.listeners.add(self._push)

    def _push(self, batch):  # on the reader's thread
        self.loop.call_soon_threadsafe(self._send, batch)

    def _send(self, batch):
        try:
            self.write_message(json.dumps({"type": "events", "events": batch}))
        except websocket.WebSocketClosedError:
            self.reader.listeners.discard(self._push)

    def on_message(self, message):
        pass

    def on_close(self):
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.listeners.discard(self._push)


def handlers(base_url: str) -> list:
    root = url_path_join(base_url, "workbench", "ranksets")
    return [
        (root, RankSetsHandler),
        (url_path_join(root, ID), RankSetHandler),
        (url_path_join(root, ID, "events"), EventsHandler),
        (url_path_join(root, ID, r"(?P<action>[a-z-]+)"), ActionHandler),
    ]
