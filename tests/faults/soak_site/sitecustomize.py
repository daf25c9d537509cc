"""What every process of the chaos soak loads as it starts (the soak alone puts this folder
on ``PYTHONPATH``): the soak's DNS, and the protocol of its slow blob store.

The DNS misbehaves as a real one can, for two families of names; every other name goes to
the system's resolver (``tests.faults.soak_names``):

- ``<anything>.slow-dns.test``: the lookup does not answer for ``SLOW_S``, then fails, as a
  name whose servers never reply (``getaddrinfo`` has no timeout of its own);
- ``<anything>.rebind.test``: to the API (``tierq api``) it answers ``ALLOWED``, an address
  the soak's operator allows webhooks to; to every other process (a dispatcher's delivery)
  it answers loopback, where nothing may be called: a name whose owner switched its record
  between the check and the connection.

``slowfile://`` is ``tests.slow_store``'s: every process that opens the blob store (the
API's result reads, the workers' writes, the dispatcher's pruning) must know it.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from tests.faults.soak_names import ALLOWED, INSIDE, REBIND, SLOW_DNS

SLOW_S = 30.0

_system_getaddrinfo = socket.getaddrinfo


def _getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else str(host or "")
    if name.endswith(SLOW_DNS):
        time.sleep(SLOW_S)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    if name.endswith(REBIND):
        answer = ALLOWED if sys.argv[1:2] == ["api"] else INSIDE
        return _system_getaddrinfo(answer, port, *args, **kwargs)
    return _system_getaddrinfo(host, port, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo

import tests.slow_store  # noqa: E402,F401  (registers slowfile://)
