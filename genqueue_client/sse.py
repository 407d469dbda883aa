"""Server-Sent Events: decode a stream's lines into events, and follow one across reconnects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from genqueue_client.models import Event


@dataclass
class Decoder:
    """The WHATWG event-stream rules the server's frames need: `id`, `event`, `data` (joined by
    newlines), comments ignored, a blank line ends a frame. One per connection."""

    alive: bool = False  # an event or a heartbeat came: the connection is a working stream
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, lines: Iterable[str]) -> Iterator[Event]:
        for line in lines:
            event = self.line(line)
            if event is not None:
                yield event

    def line(self, line: str) -> Event | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.alive = True  # a heartbeat comment
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None  # `retry` and unknown fields: the client's own reconnect policy applies

    def _dispatch(self) -> Event | None:
        data, event, frame_id = "\n".join(self._data), self._event, self._id
        self._data, self._event, self._id = [], "", None
        if not data:
            return None
        body = json.loads(data)
        if not isinstance(body, dict):
            return None
        self.alive = True
        body.setdefault("type", event)
        if frame_id is not None and frame_id.isdigit():
            body["id"] = int(frame_id)
        return Event.from_json(body)
