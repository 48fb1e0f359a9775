"""Whether the Hugging Face Hub can be reached, asked once before ``--online`` needs it.

Without a network the Hub libraries retry for half a minute and then report the file as
"not found". :func:`unreachable` answers in a few seconds instead: the Hub's host (``HF_ENDPOINT``,
else huggingface.co), or the proxy the environment names for it (``HTTPS_PROXY`` ...), does not
resolve or does not accept a connection. The caller then falls back to the local cache, and
otherwise says the network is unreachable (:class:`HubUnreachable`, exit 1), naming the host.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
import urllib.request

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 5.0


class HubUnreachable(RuntimeError):
    """The network to the Hub is down (a runtime error: exit 1, not the input's fault)."""


def _endpoint() -> tuple[str, str, int]:
    """(scheme, host, port) of the Hub the libraries will ask."""
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    scheme = url.scheme or "https"
    try:
        port = url.port or (443 if scheme == "https" else 80)
    except ValueError:  # a port out of range: the libraries fail on it too
        port = 443
    return scheme, url.hostname or "huggingface.co", port


def _route() -> tuple[str, int, str]:
    """(host, port, what) of the first hop: the proxy for the Hub's scheme, else the Hub itself."""
    scheme, host, port = _endpoint()
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        try:
            proxy_port = url.port or 8080
        except ValueError:
            proxy_port = 8080
        return url.hostname or "", proxy_port, f"proxy {url.hostname}:{proxy_port} (for {host})"
    return host, port, f"{host}:{port}"


def unreachable(timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the Hub (or its proxy) opens; else why not, naming the host."""
    host, port, what = _route()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"network unreachable: cannot resolve {what} ({getattr(exc, 'strerror', None) or exc})"
    reasons = []
    for family, kind, proto, _, address in infos[:4]:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                return None
        except OSError as exc:
            reasons.append(exc.strerror or ("timed out" if isinstance(exc, TimeoutError) else type(exc).__name__))
    return f"network unreachable: no connection to {what} ({reasons[0] if reasons else 'no address'})"


NETWORK_ERRORS = ("ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException",
                  "NetworkError", "gaierror", "TimeoutError", "ProxyError")


def network_cause(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a failed connection rather than a missing file."""
    seen = 0
    while exc is not None and seen < 10:
        if type(exc).__name__ in NETWORK_ERRORS or isinstance(exc, (ConnectionError, socket.gaierror)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
