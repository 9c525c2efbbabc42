"""Client requests that hil intercepts in asyncua: writes, reads, subscriptions, sessions.

Mechanism: `GuardedInternalServer` (an asyncua InternalServer, passed to
`Server(iserver=...)`) creates a `GuardedSession` for every client connection. asyncua's
UaProcessor calls the session's `write`, `read`, `create_subscription`,
`create_monitored_items` and `activate_session`; the overrides here run before asyncua's
own services:

- write: every WriteValue aimed at hil's namespace is decided here (`WriteGuard.check`):
  non-Value attribute, sensor, applied value, status or folder -> BadNotWritable; anonymous
  session while users exist -> BadUserAccessDenied; IndexRange on a scalar ->
  BadIndexRangeInvalid; null, array, or a value the node's DataType cannot represent (the
  conversions of adapters/opcua_types.py: a Float, Int32 ... to a Double node is fine, a
  fraction to an integer node is not) -> BadTypeMismatch; non-finite, beyond the data type
  or outside the node's EU range -> BadOutOfRange (a float32 within its round-off of an EU
  bound is clamped to it). The accepted
  values of one request go to the process image in one atomic `write_inputs`, then to the
  nodes (so subscriptions see them at once). Writes to other namespaces go to asyncua's
  attribute service (which checks AccessLevel for non-admin users). Every outcome is
  counted per session (client address, user).
- read: the served values are refreshed from the image first, so a read is never older
  than the last loop publish; anonymous sessions read UserAccessLevel = CurrentRead on
  actuators when users exist (they may not write).
- create_subscription: the publishing interval is revised up to
  `min_publishing_interval_ms` (asyncua would grant 0 ms = publish on every change).
- create_monitored_items: a requested queue size of 0 is revised to 1 (latest value).
- activate_session: refused (BadSecurityModeRejected) over a None channel when None is not
  allowed.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field

from asyncua import ua
from asyncua.common.utils import ServiceError
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.internal_server import InternalServer
from asyncua.server.internal_session import InternalSession, SessionState

from adapters.opcua_security import channel_allowed, rlog
from adapters.opcua_types import convert
from hil.tagmap.opcua import NodeInfo

log = logging.getLogger("hil.opcua")
MAX_LOGGED_REJECTIONS = 20  # per session; later ones are only counted
FLOAT32_EPS = 2.0 ** -23  # relative spacing of float32 values (round-off accepted at an EU bound)
Bad = ua.StatusCodes


@dataclass
class SessionStats:
    """What one client session did: accepted writes and rejections by status name."""

    client: str
    user: str | None = None
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"client": self.client, "user": self.user, "accepted": self.accepted,
                "rejected": dict(self.rejected)}


class WriteGuard:
    """Validates client writes against the node map and applies them to the image.

    `adapter` provides: `section`, `ns_index`, `image`, `nodes_by_id` (NodeId -> NodeInfo),
    `own_node_ids`, `apply_commands(list[(NodeInfo, float)])` (async) and `refresh()` (async).
    Counters: per open session, and per client host and user once sessions close (bounded by
    the number of distinct clients, however often command-line tools reconnect).
    """

    def __init__(self, adapter):
        self.adapter = adapter
        self.sessions: dict[int, SessionStats] = {}
        self.clients: dict[tuple[str, str | None], SessionStats] = {}
        self.accepted_total = 0
        self.rejected_total = 0
        self.rejected_by_code: Counter = Counter()
        self.sessions_activated = 0  # sessions activated (first activation only)
        self.reads = 0  # Read service calls
        self.values_read = 0  # attributes read by them
        self.subscriptions = 0  # subscriptions created
        self.monitored_items = 0  # monitored items created (Good results)

    # ---- bookkeeping ----
    def stats(self, session) -> SessionStats:
        key = id(session)
        st = self.sessions.get(key)
        if st is None:
            st = self.sessions[key] = SessionStats(client=_client_name(session.name))
        return st

    def close(self, session) -> SessionStats | None:
        """Fold a closing session's counts into its client's; returns them (None if done)."""
        st = self.sessions.pop(id(session), None)
        if st is None:
            return None
        host = st.client.rsplit(":", 1)[0]
        agg = self.clients.setdefault((host, st.user), SessionStats(client=host, user=st.user))
        agg.accepted += st.accepted
        agg.rejected.update(st.rejected)
        return st

    def counters(self) -> dict:
        return {
            "accepted": self.accepted_total,
            "rejected": self.rejected_total,
            "rejected_by_code": dict(self.rejected_by_code),
            "sessions": self.sessions_activated,
            "reads": self.reads,
            "values_read": self.values_read,
            "subscriptions": self.subscriptions,
            "monitored_items": self.monitored_items,
            "open_sessions": [s.as_dict() for s in self.sessions.values()],
            "closed_sessions_by_client": [s.as_dict() for s in self.clients.values()],
        }

    # ---- decisions ----
    def check(self, wv: ua.WriteValue, user: User | None) -> tuple[int, NodeInfo | None, float]:
        """(status code, node, value in plant units) for one WriteValue in our namespace."""
        a = self.adapter
        info: NodeInfo | None = a.nodes_by_id.get(wv.NodeId)
        if info is None:
            known = wv.NodeId in a.own_node_ids
            return (Bad.BadNotWritable if known else Bad.BadNodeIdUnknown), None, 0.0
        if wv.AttributeId != ua.AttributeIds.Value or not info.writable:
            return Bad.BadNotWritable, info, 0.0
        if a.section.users and (user is None or user.name is None):
            return Bad.BadUserAccessDenied, info, 0.0
        if wv.IndexRange:
            return Bad.BadIndexRangeInvalid, info, 0.0
        dv = wv.Value
        if dv is None or (dv.StatusCode is not None and not dv.StatusCode.is_good()):
            return Bad.BadWriteNotSupported, info, 0.0
        var = dv.Value
        if var is None or var.is_array or var.Value is None:
            return Bad.BadTypeMismatch, info, 0.0
        code, v = convert(info.data_type, var.VariantType, var.Value)
        if code != Bad.Good:
            return code, info, 0.0
        if info.data_type == "Boolean":
            return Bad.Good, info, info.eu_high if v else info.eu_low
        x = float(v)
        lo, hi = info.eu_low, info.eu_high
        if lo <= x <= hi:
            return Bad.Good, info, x
        if var.VariantType == ua.VariantType.Float or info.data_type == "Float":
            # a float32 cannot hold every bound (a REAL 0.1 is 0.1000000015): accept within
            # float32 round-off of a bound, clamped to it
            tol = max(abs(lo), abs(hi)) * FLOAT32_EPS
            if lo - tol <= x < lo:
                return Bad.Good, info, lo
            if hi < x <= hi + tol:
                return Bad.Good, info, hi
        return Bad.BadOutOfRange, info, 0.0

    async def write(self, session: "GuardedSession", params: ua.WriteParameters, user) -> list[ua.StatusCode]:
        a = self.adapter
        st = self.stats(session)
        results: list[ua.StatusCode | None] = [None] * len(params.NodesToWrite)
        accepted: list[tuple[int, NodeInfo, float]] = []
        others: list[int] = []
        for i, wv in enumerate(params.NodesToWrite):
            if wv.NodeId.NamespaceIndex != a.ns_index:
                others.append(i)
                continue
            code, info, value = self.check(wv, user)
            if code == Bad.Good:
                accepted.append((i, info, value))
                continue
            results[i] = ua.StatusCode(code)
            self._reject(st, code, wv, info)
        if accepted:
            try:
                await a.apply_commands([(info, value) for _, info, value in accepted])
                code = Bad.Good
            except Exception:  # the image is gone or broken: tell the client, keep serving
                log.exception("OPC UA write to the process image failed")
                code = Bad.BadInternalError
            for i, _, _ in accepted:
                results[i] = ua.StatusCode(code)
            if code == Bad.Good:
                st.accepted += len(accepted)
                self.accepted_total += len(accepted)
        if others:
            sub = ua.WriteParameters()
            sub.NodesToWrite = [params.NodesToWrite[i] for i in others]
            for i, res in zip(others, await InternalSession.write(session, sub)):
                results[i] = res
        return results  # type: ignore[return-value]

    def _reject(self, st: SessionStats, code: int, wv: ua.WriteValue, info: NodeInfo | None) -> None:
        name = ua.StatusCode(code).name
        st.rejected[name] += 1
        self.rejected_by_code[name] += 1
        self.rejected_total += 1
        n = sum(st.rejected.values())
        if n <= MAX_LOGGED_REJECTIONS:
            what = info.signal if info is not None else wv.NodeId.to_string()
            var = wv.Value.Value if wv.Value is not None else None
            shown = f"{var.VariantType.name} {var.Value!r}" if var is not None else "no value"
            rlog.warning("write", "OPC UA write refused (%s): %s <- %s from %s%s", name, what, shown, st.client,
                         f" user {st.user}" if st.user else "")
            if n == MAX_LOGGED_REJECTIONS:
                log.warning("further refused writes of %s are only counted", st.client)


def _client_name(name) -> str:
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)


class GuardedSession(InternalSession):
    guard: WriteGuard

    async def write(self, params: ua.WriteParameters) -> list[ua.StatusCode]:
        return await self.guard.write(self, params, self.user)

    async def read(self, params: ua.ReadParameters) -> list[ua.DataValue]:
        adapter = self.guard.adapter
        self.guard.reads += 1
        self.guard.values_read += len(params.NodesToRead or ())
        await adapter.refresh()
        results = await super().read(params)
        if adapter.section.users and getattr(self.user, "name", None) is None:
            # anonymous sessions are read-only when users exist: say so in UserAccessLevel
            for i, rv in enumerate(params.NodesToRead):
                if rv.AttributeId == ua.AttributeIds.UserAccessLevel and rv.NodeId in adapter.nodes_by_id:
                    results[i] = ua.DataValue(ua.Variant(ua.AccessLevel.CurrentRead.mask, ua.VariantType.Byte))
        return results

    async def create_subscription(self, params, callback, request_callback=None):
        floor = self.guard.adapter.section.min_publishing_interval_ms
        req = params.RequestedPublishingInterval
        if req is None or not math.isfinite(req) or req < floor:
            params.RequestedPublishingInterval = floor
        elif req > 3_600_000.0:
            params.RequestedPublishingInterval = 3_600_000.0
        result = await super().create_subscription(params, callback, request_callback)
        self.guard.subscriptions += 1
        return result

    async def create_monitored_items(self, params: ua.CreateMonitoredItemsParameters):
        await self.guard.adapter.refresh()  # the initial notification must be current
        for item in params.ItemsToCreate:
            rp = item.RequestedParameters
            if rp.QueueSize == 0:
                rp.QueueSize = 1
        results = await super().create_monitored_items(params)
        self.guard.monitored_items += sum(1 for r in results if r.StatusCode.is_good())
        return results

    def activate_session(self, params, peer_certificate):
        if not channel_allowed(self.guard.adapter.section, peer_certificate):
            rlog.warning("none-channel", "refused a session from %s over SecurityPolicy None (not allowed)",
                         self.name)
            raise ServiceError(Bad.BadSecurityModeRejected)
        first = self.state == SessionState.Created
        result = super().activate_session(params, peer_certificate)
        st = self.guard.stats(self)
        st.user = getattr(self.user, "name", None)
        if first:
            self.guard.sessions_activated += 1
        return result

    async def close_session(self, delete_subs: bool = True) -> None:
        st = self.guard.close(self)
        if st is not None and (st.accepted or st.rejected):
            log.info("OPC UA session %s closed: %d writes accepted, refused %s", st.client, st.accepted,
                     dict(st.rejected) or "none")
        await super().close_session(delete_subs)


class GuardedInternalServer(InternalServer):
    """asyncua InternalServer whose client sessions are `GuardedSession`s.

    `standard_cache`: a file (adapters/opcua_stdcache.py) to read asyncua's standard address
    space from instead of building it, and to write it to after building it; None (the
    default): built every time, as asyncua does. `standard_space_note` says which happened.
    """

    guard: WriteGuard | None = None
    standard_cache = None
    standard_space_note = "built"

    async def load_standard_address_space(self, shelf_file=None) -> None:
        if shelf_file is not None or self.standard_cache is None:
            await super().load_standard_address_space(shelf_file)
            return
        from adapters import opcua_stdcache

        why = opcua_stdcache.load_into(self.aspace, self.standard_cache)
        if why is None:
            self.standard_space_note = f"read from {self.standard_cache}"
            return
        await super().load_standard_address_space(None)
        self.standard_space_note = f"built ({why}); " + opcua_stdcache.store(self.aspace, self.standard_cache)

    def create_session(self, name, user=User(role=UserRole.Anonymous), external=False):
        if self.guard is None:
            raise ServiceError(Bad.BadServerNotConnected)
        session = GuardedSession(self, self.aspace, self.subscription_service, name, user=user, external=external)
        session.guard = self.guard
        return session
