"""Endpoints as every command line and program class of the project writes
them: ADDR:PORT and PROTO:ADDR:PORT, IPv6 addresses in brackets. One parser,
so that a rule of the redirect, a service and a backend of the load balancer
are read, checked and refused in the same words. Standard library only.

    >>> endpoint("[2001:2::17]:8080", "backend")
    (IPv6Address('2001:2::17'), 8080)
    >>> service("udp:198.18.0.17:53", "service")
    ('udp', IPv4Address('198.18.0.17'), 53)
    >>> text(ipaddress.ip_address("2001:2::17"), 8080)
    '[2001:2::17]:8080'
"""

import ipaddress
import re

from ebpf.errors import InputError

PROTOS = ("udp", "tcp")
ENDPOINT = r"(\[[0-9a-fA-F:.]+\]|[0-9.]+):(\d+)"  # a regex: ADDR and PORT, IPv6 in brackets
SERVICE = rf"(udp|tcp):{ENDPOINT}"  # PROTO, ADDR and PORT


def text(addr, port) -> str:
    """ADDR:PORT, an IPv6 address in brackets (as nginx and HAProxy take it too)."""
    return f"[{addr}]:{port}" if ":" in str(addr) else f"{addr}:{port}"


def checked(addr_text, port_text, what, whole):
    """(address, port) from their texts, or InputError saying what is wrong
    with `whole` (the text as given), which is a `what`."""
    try:
        addr = ipaddress.ip_address(addr_text.strip("[]"))
    except ValueError:
        raise InputError(f"bad {what} {whole!r}: {addr_text} is not an IPv4 or IPv6 address") from None
    if addr_text.startswith("[") != (addr.version == 6):
        raise InputError(f"bad {what} {whole!r}: IPv6 addresses go in brackets, IPv4 ones do not")
    if not 1 <= int(port_text) <= 65535:
        raise InputError(f"bad {what} {whole!r}: port {port_text} is out of range (1-65535)")
    return addr, int(port_text)


def endpoint(s, what="endpoint", want="ADDR:PORT"):
    """ADDR:PORT -> (address, port)."""
    m = re.fullmatch(ENDPOINT, s.strip())
    if not m:
        raise InputError(f"bad {what} {s!r}: want {want} (IPv6 in brackets)")
    return checked(*m.groups(), what, s)


def service(s, what="service", want="PROTO:ADDR:PORT"):
    """PROTO:ADDR:PORT -> (proto, address, port), PROTO udp or tcp."""
    m = re.fullmatch(SERVICE, s.strip())
    if not m:
        raise InputError(f"bad {what} {s!r}: want {want} (tcp or udp; IPv6 in brackets)")
    proto, addr, port = m.groups()
    return (proto, *checked(addr, port, what, s))
