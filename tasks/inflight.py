"""Which of a few task ids still have a message in the broker: the reaper's lost-message check.

kombu's Redis consume is not atomic (BRPOP pops the message, a second round trip adds it to
the `unacked` hash), so a consumer killed in between loses the message. A message that still
exists is in one of its queue's priority lists or in `unacked`; this module looks in both.

Cost: the lists are scanned inside Redis by a Lua script, CHUNK messages per call (a few
milliseconds each, so Redis never stalls), and only the task ids found come back.
Admission control caps a stage's backlog (admission_max_*_backlog, 10,000 by default), and
the reaper asks only about a bounded batch of suspects. The scan walks each list from its
tail (index 0, where LPUSH adds) towards its head (where BRPOP takes): pushes during the scan
shift messages towards higher indexes (seen twice, never skipped) and pops take from the end
not yet read, so a message that stays in the list all along is always seen. One taken during
the scan is in `unacked` by the time that hash is read, after the lists.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from celery import Celery

CHUNK = 250  # messages per Lua call: a few ms of Redis time each (Redis serves others between)
MAX_SCAN = 200_000  # messages per check; past this the answer is "unknown", never "lost"

# KEYS[1]: a queue list; ARGV: start, stop, then the task ids asked about. The first `"id"` key
# of a message is Celery's protocol-2 header (the body before it is base64, and "root_id" or
# "parent_id" do not match a quote before `id`).
# Returns {number of messages read, ids found among them}.
_SCAN_LUA = """
local want = {}
for i = 3, #ARGV do want[ARGV[i]] = true end
local items = redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])
local found = {}
for _, m in ipairs(items) do
  local id
  local at = string.find(m, '"id": "', 1, true)  -- plain find: far cheaper than a pattern
  local close = at and string.find(m, '"', at + 7, true)
  if close then
    id = string.sub(m, at + 7, close - 1)
  else
    id = string.match(m, '"id":%s*"([^"]+)"')
  end
  if id and want[id] then found[#found + 1] = id; want[id] = nil end
end
return {#items, found}
"""


def supported(broker_url: str) -> bool:
    """Only Redis loses a message on consume; RabbitMQ's delivery is atomic (nothing to check)."""
    return broker_url.startswith(("redis://", "rediss://"))


def live_task_ids(
    app: Celery, queue: str, task_ids: Iterable[str], held_for_s: float | None = None, at: float | None = None
) -> set[str] | None:
    """The subset of `task_ids` with a message waiting in `queue` or delivered but unacked.

    `held_for_s`: an unacked message delivered longer ago than this, and not a countdown
    still running, does not count: its consumer died before starting it (kombu returns such
    messages only after the visibility timeout, hours later); `at` is "now" as a Unix time.
    None when the broker cannot tell (not Redis, or more than MAX_SCAN messages): treat every
    id as possibly alive then.
    """
    wanted = set(task_ids)
    if not wanted or not supported(app.conf.broker_url):
        return None if wanted else set()
    with app.connection_for_read() as conn:
        # kombu's Redis Channel: its list and hash names are internals the stubs do not declare.
        channel: Any = conn.default_channel
        client = channel.client
        keys = [channel._q_for_pri(queue, pri) for pri in channel.priority_steps]
        found = _scan_lists(client, keys, wanted)
        if found is None:
            return None
        index = channel.unacked_index_key
        held = _unacked_ids(client, channel.unacked_key, index, held_for_s, at or time.time())
    return found | (wanted & held)


def _scan_lists(client: Any, keys: list[str], wanted: set[str]) -> set[str] | None:
    script = client.register_script(_SCAN_LUA)
    found: set[str] = set()
    scanned = 0
    for key in dict.fromkeys(keys):  # priority steps can map to the same list
        start = 0
        while wanted - found:
            if scanned >= MAX_SCAN:
                return None
            n, ids = script(keys=[key], args=[start, start + CHUNK - 1, *(wanted - found)])
            found.update(i.decode() if isinstance(i, bytes) else i for i in ids)
            scanned += n
            start += CHUNK
            if n < CHUNK:
                break
    return found


def _unacked_ids(client: Any, key: str, index_key: str, held_for_s: float | None, now: float) -> set[str]:
    """Task ids of delivered, unacked messages (reserved by a worker, or waiting for an ETA)."""
    delivered = dict(client.zscan_iter(index_key, count=500))
    ids: set[str] = set()
    for tag, raw in client.hscan_iter(key, count=500):
        headers = json.loads(raw)[0].get("headers") or {}
        at = delivered.get(tag, now)  # not indexed yet: kombu writes both in one pipeline
        if held_for_s is None or now - at <= held_for_s or _eta_ahead(headers.get("eta"), now - held_for_s):
            ids.add(str(headers.get("id")))
    return ids


def _eta_ahead(eta: str | None, than: float) -> bool:
    """A retry countdown holds its message unacked until the ETA: that consumer is not dead."""
    if not eta:
        return False
    when = datetime.fromisoformat(eta)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp() > than
