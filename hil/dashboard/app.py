"""The dashboard's web application (Starlette): the page, one websocket of frames, login and
operator actions.

Routes:
    GET  /               the page (static/index.html; uPlot vendored in static/, no CDN)
    GET  /api/layout     scenario, panels, signal names, whether login is possible / done
    WS   /ws             frames (hil/dashboard/sampler.py) at most `rate_hz` per second
    POST /api/login      {"password"} -> session cookie + {"csrf"}; 403 when wrong or disabled
    POST /api/logout
    POST /api/action     {"op": promote|demote|rollback|acknowledge, "to", "reason"}, only with
                         a session and its X-HIL-CSRF header; sent to the safety process as the
                         signed control request `hil safety <op>` sends (control_client.py)

One sampling task serves every client: frames are read once per tick and only while at
least one client is connected; a client too slow to take a frame misses it (its queue holds
one frame), so no client can make the dashboard fall behind or grow its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from urllib.parse import urlparse

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from hil.dashboard.auth import COOKIE, SESSION_TTL_S, FAILED_LOGIN_DELAY_S, Auth

STATIC = Path(__file__).parent / "static"
OPS = ("promote", "demote", "rollback", "acknowledge")
MODES = ("shadow", "advisory", "limited", "full")
REATTACH_EVERY_S = 2.0


class Hub:
    """The attached run (its sampler and layout) and the connected clients' one-frame queues."""

    def __init__(self, attach, rate_hz: float, finder=None):
        self._attach = attach  # entry -> (sampler, hello dict)
        self.finder = finder  # () -> a live entry of the same scenario, or None
        self.period_s = 1.0 / rate_hz
        self.clients: set[asyncio.Queue] = set()
        self.sampler = self.hello = None
        self.frames = 0

    def attach(self, entry: dict) -> None:
        old = self.sampler
        self.sampler, self.hello = self._attach(entry)
        if old is not None:
            old.close()

    def _offer(self, msg: dict) -> None:
        for q in list(self.clients):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(msg)

    async def run(self) -> None:
        next_t, last_find = time.monotonic(), 0.0
        while True:
            now = time.monotonic()
            if not self.sampler.run_alive() and self.finder is not None and now - last_find > REATTACH_EVERY_S:
                last_find = now
                entry = await asyncio.to_thread(self.finder)
                if entry is not None and entry["pid"] != self.sampler.entry["pid"]:
                    await asyncio.to_thread(self.attach, entry)
                    self._offer({"type": "reload"})
            if self.clients:
                try:
                    frame = await asyncio.to_thread(self.sampler.frame)
                    self.frames += 1
                    self._offer(frame)
                except Exception as exc:  # noqa: BLE001  (a frame that cannot be read is skipped, said)
                    self._offer({"type": "error", "message": f"{type(exc).__name__}: {exc}"})
            next_t = max(next_t + self.period_s, time.monotonic())  # never bursts to catch up
            await asyncio.sleep(next_t - time.monotonic())


def build_app(hub: Hub, auth: Auth, control, allowed_hosts: list[str] | None = None) -> Starlette:
    """`control(msg) -> dict`: send one operator request to the run's safety process (blocking).
    allowed_hosts: the Host names the page answers to (a DNS-rebinding page of another site
    cannot reach it under its own name); None: any."""

    async def index(_request: Request):
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def layout(request: Request):
        return JSONResponse({**hub.hello, "auth_enabled": auth.enabled,
                             "logged_in": auth.logged_in(request.cookies.get(COOKIE))})

    async def ws_endpoint(ws: WebSocket):
        origin = ws.headers.get("origin")
        if origin and urlparse(origin).netloc != ws.headers.get("host"):
            await ws.close(code=1008)  # another site's page in the operator's browser: no data for it
            return
        await ws.accept()
        q: asyncio.Queue = asyncio.Queue(maxsize=1)
        hub.clients.add(q)
        try:
            while True:
                await ws.send_json(await q.get())
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            hub.clients.discard(q)

    async def login(request: Request):
        try:
            body = await request.json()
        except ValueError:
            body = {}
        got = auth.login(str(body.get("password", ""))) if isinstance(body, dict) else None
        if got is None:
            await asyncio.sleep(FAILED_LOGIN_DELAY_S)
            why = "wrong password" if auth.enabled else "operator actions are disabled (no password configured)"
            return JSONResponse({"ok": False, "error": why}, status_code=403)
        token, csrf = got
        resp = JSONResponse({"ok": True, "csrf": csrf})
        resp.set_cookie(COOKIE, token, max_age=int(SESSION_TTL_S), httponly=True, samesite="strict", path="/")
        return resp

    async def logout(request: Request):
        auth.logout(request.cookies.get(COOKIE))
        resp = JSONResponse({"ok": True})
        resp.delete_cookie(COOKIE, path="/")
        return resp

    async def action(request: Request):
        if not auth.check(request.cookies.get(COOKIE), request.headers.get("x-hil-csrf")):
            return JSONResponse({"ok": False, "error": "log in first (operator actions need a session)"},
                                status_code=401)
        try:
            body = await request.json()
        except ValueError:
            body = None
        op = body.get("op") if isinstance(body, dict) else None
        if op not in OPS:
            return JSONResponse({"ok": False, "error": f"op: {op!r} is not one of {OPS}"}, status_code=400)
        reason = f"dashboard: {str(body.get('reason') or 'operator').strip()[:200]}"
        msg: dict = {"op": op}
        if op == "demote":
            if body.get("to") not in MODES:
                return JSONResponse({"ok": False, "error": f"to: {body.get('to')!r} is not one of {MODES}"},
                                    status_code=400)
            msg.update(to=body["to"], reason=reason)
        elif op == "rollback":
            msg["reason"] = reason
        else:
            msg["by"] = "dashboard operator"
        try:
            res = await asyncio.to_thread(control, msg)
        except Exception as exc:  # noqa: BLE001  (no safety process, cannot sign: said to the operator)
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=502)
        return JSONResponse(res, status_code=200 if res.get("ok", True) else 409)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        task = asyncio.create_task(hub.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if hub.sampler is not None:
                hub.sampler.close()

    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    return Starlette(middleware=middleware, routes=[
        Route("/", index), Route("/api/layout", layout), WebSocketRoute("/ws", ws_endpoint),
        Route("/api/login", login, methods=["POST"]), Route("/api/logout", logout, methods=["POST"]),
        Route("/api/action", action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ], lifespan=lifespan)
