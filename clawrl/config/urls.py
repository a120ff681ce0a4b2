"""Server URLs as the config compares them: `engine.vllm.urls` names each vLLM replica once.

Two spellings of one server (`http://LOCALHOST:8001/`, `http://127.0.0.1:8001`) are one replica:
the scheme and host are lower-cased, `localhost` is 127.0.0.1, the scheme's default port is
written out, and a trailing slash goes. A replica named twice would get twice its share of the
requests and load every version twice; it is refused at start instead (`clawrl serve` exits 2).
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
LOOPBACK = frozenset({"127.0.0.1", "localhost"})


def normal_url(url: str) -> str:
    """`url` in the one spelling the config compares; ValueError for what is not an http(s) URL."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"{url!r}: a vLLM server's URL has no query, fragment or user")
    host = "127.0.0.1" if parts.hostname in LOOPBACK else parts.hostname.lower()
    if ":" in host:  # an IPv6 address goes back in brackets
        host = f"[{host}]"
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError as exc:  # a port past 65535, or not a number
        raise ValueError(f"{url!r}: {exc}") from None
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def repeated_urls(urls: list[str]) -> list[tuple[str, str]]:
    """Each URL of `urls` that names a server an earlier one names, with that earlier one."""
    seen: dict[str, str] = {}
    repeats = []
    for url in urls:
        key = normal_url(url)
        if key in seen:
            repeats.append((url, seen[key]))
        else:
            seen[key] = url
    return repeats


def is_loopback(url: str) -> bool:
    return urlsplit(normal_url(url)).hostname == "127.0.0.1"
