"""Which ``Host`` names the server answers: the DNS-rebinding check and ``--allowed-host``.

A web page on ``http://attacker.test`` can make its own name resolve, a moment later, to
``127.0.0.1`` (DNS rebinding). The browser then sends the page's requests to the server
on this machine and, both being "attacker.test" to it, lets the page read every answer:
the Origin check (:mod:`.origin`) sees the page's own origin and the ``Host`` it
addressed, which agree. What does not fit is the ``Host``: a browser always names the
host the page asked for, and an attacker cannot make a browser say ``localhost`` or
``127.0.0.1`` while the name it resolved was its own. So a server on a loopback address
answers only requests addressed to a loopback name, or to a name the operator gave
(``--allowed-host``, for a reverse proxy or a hosts-file alias), as Jupyter, Vite and
webpack-dev-server do.

A server on another address (``0.0.0.0``, a LAN address) is reached by names it cannot
know, so it checks the ``Host`` only when ``--allowed-host`` is given; then loopback names
and the given ones are served.

A request with no ``Host`` at all (an HTTP/1.0 client) is served: a browser always sends
one, so such a request is not a page's.

Kept free of the HTTP stack's imports, as :mod:`.origin`, so the command line can check
``--allowed-host`` without loading it.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

_LOCALHOST = "localhost"


def _name(host: str) -> str | None:
    """The host name in ``host`` (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), lower case, IPv6 unbracketed.

    None when it is not one: a path, a user, a bad port, or nothing.
    """
    try:
        parts = urlsplit(f"http://{host.strip()}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return parts.hostname.lower()


def is_loopback(name: str) -> bool:
    """``localhost``, an address in 127.0.0.0/8, or ``::1`` (a bare host name or address, no port)."""
    name = name.strip().lower().removeprefix("[").removesuffix("]")
    if name == _LOCALHOST:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_allowed(values: list[str]) -> tuple[str, ...]:
    """The ``--allowed-host`` values in lower case; ValueError naming the first that is not a bare host name.

    A bare name has no scheme, path or port (the check ignores the port), as ``example.com``,
    ``10.0.0.5`` or ``[fd00::1]``.
    """
    allowed = []
    for value in values:
        try:  # an IPv6 address may be given without brackets
            allowed.append(str(ipaddress.ip_address(value.strip())).lower())
            continue
        except ValueError:
            pass
        name = _name(value) if "://" not in value and "/" not in value else None
        if name is None or ":" in value.strip().rsplit("]", 1)[-1]:
            raise ValueError(f"--allowed-host {value!r} is not a host name; give a bare name or address without "
                             f"scheme or port (as example.com, 10.0.0.5 or [fd00::1])")
        allowed.append(name)
    return tuple(allowed)


def applies(bound: str, allowed: tuple[str, ...]) -> bool:
    """Whether a server listening on the address ``bound`` checks the ``Host`` of its requests."""
    return is_loopback(bound) or bool(allowed)


def served(host: str | None, *, allowed: tuple[str, ...]) -> bool:
    """Whether a request with the header ``Host: host`` (None: no header) may be answered, any port."""
    if host is None:
        return True
    name = _name(host)
    return name is not None and (is_loopback(name) or name in allowed)
