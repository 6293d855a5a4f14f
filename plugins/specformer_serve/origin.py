"""Which web pages may spend the server's compute: the ``Origin`` check and ``--allow-origin``.

A browser lets any page POST a "simple" request (``Content-Type: text/plain``) to any
address, the server's included, without asking it first; only reading the answer is
blocked. So a page a user merely visits could make a keyless server on their machine
generate. Two rules close that: a POST must say ``application/json`` (which a browser
never sends cross-origin without a preflight the server does not grant), and a request
that carries an ``Origin`` (browsers add it to every POST) must come from the server's own
address (the playground at ``/``), or from an origin the operator allowed. Clients that are
not browsers (curl, SDKs, lm_eval) send no ``Origin`` and are not affected.

Kept free of the HTTP stack's imports, so the command line can check ``--allow-origin``
without loading it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

#: The ``--allow-origin`` value that lets every origin in.
ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize(origin: str) -> str | None:
    """``scheme://host:port`` in lower case with the default port spelled out, or None when ``origin`` is not one.

    An origin is exactly a scheme, a host and an optional port: no path, query, user or
    fragment (what browsers send, and what ``--allow-origin`` must look like).
    """
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:  # a port that is not a number or out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query \
            or parts.fragment or parts.username is not None or parts.password is not None:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # an IPv6 literal keeps its brackets, as in a Host header
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def check_allowed(values: list[str]) -> tuple[str, ...]:
    """The ``--allow-origin`` values, normalized; ValueError naming the first that is not ``*`` or an origin."""
    allowed = []
    for value in values:
        if value.strip() == ANY:
            allowed.append(ANY)
            continue
        normal = normalize(value)
        if normal is None:
            raise ValueError(f"--allow-origin {value!r} is not an origin; give scheme://host[:port] "
                             f"(as https://example.com or http://localhost:3000), or * for any")
        allowed.append(normal)
    return tuple(allowed)


def same_or_allowed(origin: str, *, host: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request whose ``Origin`` is ``origin``, sent to ``Host: host``, may be served.

    Same origin means the origin's host and port are the ones the browser addressed (the
    ``Host`` header, whose port defaults to the origin scheme's own).
    """
    if ANY in allowed:
        return True
    normal = normalize(origin)
    if normal is None:  # "null" (a sandboxed frame, a file:// page) or garbage: no address to trust
        return False
    if normal in allowed:
        return True
    scheme = normal.split("://", 1)[0]
    addressed = normalize(f"{scheme}://{host}") if host else None
    return addressed is not None and addressed == normal


def is_json(content_type: str | None) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``), in any case."""
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"
