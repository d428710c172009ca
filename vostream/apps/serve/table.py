"""Who is connected to the viewer server and which session each client owns or watches.

- :class:`Client`: one connection's state and its outbox (control messages waiting for the sender task).
- :class:`SessionTable`: the open sessions, the connected clients, which clients belong to which session, and the
  moves between them (attach, detach, a fresh frame slot, state broadcasts).

Thread-safety: event-loop thread only.  Pipeline threads reach it only through ``loop.call_soon_threadsafe``
(:func:`waker` and the session's notify callback); a client's slot is the one object they share (it has its own
lock).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vostream.apps.serve.protocol import encode
from vostream.apps.serve.session import Session

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

    from vostream.sinks.websocket import ClientSlot

#: control messages a client may have waiting; one that reads nothing at all is dropped, never buffered for
OUTBOX_LIMIT = 256


@dataclass
class Client:
    """One connection's state (event-loop thread only, except the slot)."""

    ws: ServerConnection
    cid: int
    slot: ClientSlot | None = None
    session: Session | None = None
    owner: bool = False
    hello: bool = False
    outbox: deque[bytes] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: float = 0.0
    last_refill: float = 0.0
    refused: int = 0
    last_refused_reply: float = 0.0
    closing: bool = False
    view: tuple[int, int] | None = None  # the client's display size (``view``); carried over to fresh slots

    def send(self, message: dict[str, object] | bytes) -> None:
        """Queue ``message`` for the sender task.  No backpressure: past :data:`OUTBOX_LIMIT` waiting messages
        the connection is closed (1008, "client too slow") instead of growing."""
        data = message if isinstance(message, bytes) else encode(message)
        if len(self.outbox) >= OUTBOX_LIMIT:  # a client that reads nothing at all: drop it, never grow
            self.closing = True
            asyncio.ensure_future(self.ws.close(1008, "client too slow"))
            return
        self.outbox.append(data)
        self.wake.set()


def waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A thread-safe ``event.set`` for pipeline threads; a no-op once the loop has closed."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:
            pass

    return wake


class SessionTable:
    """The server's sessions and clients.  ``counters`` counts messages, errors sent and refused handshakes (the
    HTTP routes and the connections add to it)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.clients: dict[int, Client] = {}
        self.members: dict[str, set[int]] = {}  # session id -> the clients that own or watch it
        self.opening = 0  # opens under way: each holds a session slot (max_sessions) until it ends
        self.counters = {"messages": 0, "errors": 0, "refused_handshakes": 0}
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the server's start
        self._next_cid = 0

    def connect(self, ws: ServerConnection, tokens: float, now: float) -> Client:
        """Register a new connection; its rate limiter starts with ``tokens``, refilled from ``now``."""
        self._next_cid += 1
        client = Client(ws, self._next_cid, tokens=tokens, last_refill=now)
        self.clients[client.cid] = client
        return client

    def error(self, client: Client, code: str, message: str, ref: str | None = None) -> None:
        self.counters["errors"] += 1
        client.send({"t": "error", "code": code, "message": message, "ref": ref})

    def new_slot(self, client: Client, inflight: int) -> ClientSlot:
        """A frame slot for ``client`` that wakes its sender task."""
        from vostream.sinks.websocket import ClientSlot

        loop = self.loop
        assert loop is not None
        slot = ClientSlot(inflight, wake=waker(loop, client.wake))
        slot.view = client.view
        return slot

    def running(self) -> int:
        """Sessions that have not ended."""
        return sum(1 for s in self.sessions.values() if not s.ended)

    def owner_of(self, session: Session) -> Client | None:
        return next(
            (
                c
                for cid in self.members.get(session.id, ())
                if (c := self.clients.get(cid)) is not None and c.owner
            ),
            None,
        )

    def attach(self, client: Client, session: Session, owner: bool) -> None:
        client.session, client.owner = session, owner
        self.members.setdefault(session.id, set()).add(client.cid)
        client.send(session.opened(watcher=not owner))
        assert client.slot is not None  # every client has one from its hello on
        session.hub.add(client.slot)
        self.broadcast_state(session)

    async def detach(self, client: Client, reason: str) -> None:
        """Take ``client`` out of its session.  An owner's leaving closes the session: its watchers get ``closed``
        (with ``reason``) and keep their connection, each with a fresh slot."""
        session = client.session
        if session is None:
            return
        client.session = None
        self.fresh_slot(client, session)
        members = self.members.get(session.id, set())
        members.discard(client.cid)
        if client.owner:
            client.owner = False
            for cid in list(members):
                other = self.clients.get(cid)
                if other is not None:
                    other.session = None
                    self.fresh_slot(other, session)  # the watcher may open or watch another session
                    other.send({"t": "closed", "reason": reason or "owner left"})
            self.members.pop(session.id, None)
            self.sessions.pop(session.id, None)
            await asyncio.to_thread(session.close)
        else:
            self.broadcast_state(session)

    async def drop(self, session: Session) -> None:
        """Close a session that has no owner left (cannot normally happen)."""
        self.sessions.pop(session.id, None)
        self.members.pop(session.id, None)
        await asyncio.to_thread(session.close)

    def fresh_slot(self, client: Client, session: Session) -> None:
        """Take ``client``'s slot out of ``session``'s hub (which closes it) and give the client a new, empty one:
        a closed slot takes no frames, so a client left with it would see nothing from its next session."""
        if client.slot is None:
            return
        session.hub.remove(client.slot)
        client.slot = self.new_slot(client, client.slot.inflight_limit)

    def broadcast_state(self, session: Session) -> None:
        state = encode(session.state())
        for cid in self.members.get(session.id, ()):
            client = self.clients.get(cid)
            if client is not None:
                client.send(state)

    def on_session_event(self, session: Session, kind: str) -> None:
        """A session's notify callback, on the loop: its clients get its new state (and its error, if it failed)."""
        if kind == "end" and session.error:
            for cid in self.members.get(session.id, ()):
                client = self.clients.get(cid)
                if client is not None:
                    self.error(client, "source_error", f"session {session.id} stopped: {session.error}")
        self.broadcast_state(session)

    async def close_all(self) -> None:
        """Close every session (shutdown)."""
        sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            await asyncio.to_thread(s.close)


__all__ = ["OUTBOX_LIMIT", "Client", "SessionTable", "waker"]
