"""A Lua script called with little more than the bytes it sends: the index's hot path.

redis-py's ``Script.__call__`` spends about 70 µs of CPU a call on this kind of machine, of
which sending the command and reading the reply are about 25: the rest is its generic path
(a connection checked out through a deprecation shim, timing hooks, the packing of every key
though the keys are the same on every call). An index script runs two or three times per job
in each process that touches the job, so that overhead was a fifth of a worker's CPU.

Here the command's head (``EVALSHA``, the sha, the number of keys, the keys) is packed once;
a call packs its arguments, sends on a connection of the client's pool and reads the reply.
What redis-py does that matters is kept: the connection's own retry (a failed connection is
disconnected and the call tried again, as often as the client is configured to), and a
script the server does not know (``NOSCRIPT``: Redis restarted or flushed its scripts) is
loaded and run once more. A pipeline's call goes through redis-py's ``Script``, unchanged.
``one_trip`` sends two calls together, for a step that is two scripts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

Arg = str | int | float | bytes


def _bulk(value: Arg) -> bytes:
    """One RESP bulk string, encoded as redis-py's ``Encoder`` would (UTF-8, numbers by
    ``repr``)."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        data = repr(value).encode()
    else:
        raise redis.DataError(f"invalid script argument {value!r}: str, bytes or a number")
    return b"$%d\r\n%s\r\n" % (len(data), data)


class LeanScript:
    """``script(keys=..., args=...)`` as with redis-py's ``Script``. ``keys``: the ones every
    call passes first (packed once); a call may add more after them."""

    def __init__(self, client: redis.Redis, source: str, keys: Sequence[str]) -> None:
        self.script: Script = client.register_script(source)
        self._client = client
        self._keys = list(keys)
        self._fixed = b"".join(_bulk(key) for key in self._keys)
        self._head = b""
        self._head_sha = ""

    def __call__(self, keys: Sequence[str] | None = None, args: Sequence[Arg] = (),
                 client: Any = None) -> Any:
        keys = self._keys if keys is None else keys
        fixed = len(self._keys)
        if (client is not None and client is not self._client) or list(
                keys[:fixed]) != self._keys:
            return self.script(keys=keys, args=list(args), client=client)
        extra = keys[fixed:]
        try:
            return self._send(extra, args)
        except NoScriptError:
            self.script.sha = self._client.script_load(self.script.script)
            return self._send(extra, args)

    def _packed(self, extra: Sequence[str], args: Sequence[Arg]) -> bytes:
        sha = self.script.sha
        if self._head_sha != sha:  # built once, again only when the sha is reloaded
            self._head, self._head_sha = _bulk("EVALSHA") + _bulk(sha), sha
        keys = len(self._keys) + len(extra)
        return b"".join([b"*%d\r\n" % (3 + keys + len(args)), self._head, _bulk(keys),
                         self._fixed, *(_bulk(key) for key in extra),
                         *(_bulk(arg) for arg in args)])

    def _send(self, extra: Sequence[str], args: Sequence[Arg]) -> Any:
        return _sent(self._client, [self._packed(extra, args)])[0]

    def packed(self, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
        """The call as sent, its keys this script's own and then any more."""
        if list(keys[:len(self._keys)]) != self._keys:
            raise ValueError("a call sent with another takes the script's own keys first")
        return self._packed(keys[len(self._keys):], args)


Call = tuple[LeanScript, Sequence[str], Sequence[Arg]]


def one_trip(first: Call, second: Call) -> tuple[Any, Any]:
    """Two scripts' calls (script, keys, args) on one client, sent together and answered in
    order: one round trip. Each runs whole and the first before the second, but another
    client's command may run between them. An error reply comes back in its call's place
    (the exception, not raised) so the other's answer is not lost; a script the server does
    not know (``NOSCRIPT``) is loaded and that call alone sent again."""
    scripts = (first[0], second[0])
    client = scripts[0]._client
    if scripts[1]._client is not client:
        raise ValueError("one round trip is one client's")
    replies = _sent(client, [script.packed(keys, args) for script, keys, args in (first, second)],
                    keep_errors=True)
    for i, (script, keys, args) in enumerate((first, second)):
        if isinstance(replies[i], NoScriptError):
            script.script.sha = client.script_load(script.script.script)
            try:
                replies[i] = script._send(keys[len(script._keys):], args)
            except redis.ResponseError as exc:
                replies[i] = exc
    return replies[0], replies[1]


def _sent(client: redis.Redis, packed: list[bytes], *, keep_errors: bool = False) -> list[Any]:
    """Send the commands, read their replies in order. ``keep_errors``: an error reply is
    returned in its place; else the first one is raised, once every reply is read (the
    connection stays clean)."""
    pool = client.connection_pool
    connection = pool.get_connection()

    def call() -> list[Any]:
        connection.send_packed_command(packed)  # type: ignore[no-untyped-call]
        replies: list[Any] = []
        for _ in packed:
            try:
                replies.append(connection.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies

    def failed(_: Exception) -> None:
        connection.disconnect()  # type: ignore[no-untyped-call]

    try:
        replies: list[Any] = connection.retry.call_with_retry(call, failed)
    except BaseException:
        # Cut off between the send and the reply (an interrupt, a timeout): the reply may
        # still arrive, and the next call on this connection would read it as its own.
        connection.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(connection)
    if not keep_errors:  # an error reply, read whole: the connection is clean
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
    return replies
