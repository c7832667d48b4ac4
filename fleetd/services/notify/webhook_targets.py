"""Where a webhook may post: only to global unicast addresses, unless the admin allowed a network
(`webhooks_allow_targets`). A URL's host is checked when the webhook is created and again at every
delivery, after name resolution; the delivery then connects to the address that was checked (the
name is not resolved a second time, so a rebinding DNS answer cannot switch it), while TLS still
verifies the certificate against the host name.

Numeric hosts are read the way the C library reads them (`inet_aton`): `2130706433`, `0x7f.1`,
`127.1` and `017700000001` are all 127.0.0.1, and each is refused as such. A host is first put
in the form the resolver is given (Python's IDNA codec, which `socket.getaddrinfo` applies to a
text host): `①②⑦.0.0.1` and `127。0。0。1` are 127.0.0.1 to it, and so to this check. An IPv6
address that carries an IPv4 one (mapped, IPv4-compatible `::a.b.c.d`, translated, 6to4, NAT64,
Teredo) is judged by that IPv4 address too."""

import ipaddress
import re
import socket
import urllib.parse

MAX_ADDRESSES = 16  # addresses of one name that are checked (and tried) at most

# Networks that are not global although Python's `is_global` may say so, or that embed an IPv4
# address whose own rank decides (NAT64).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network(
    "::/96"
)  # deprecated (RFC 4291 2.5.5.1); :: and ::1 are not such
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT (RFC 2765)
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
_NUMBER = re.compile(r"^(0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*)$")


class TargetRefused(ValueError):
    """A webhook target that fleetd will not post to; the message says why (without the URL)."""


def _legacy_ipv4(host):
    """An IPv4Address for the numeric forms inet_aton accepts (1 to 4 parts, each decimal, 0x hex
    or 0 octal; the last part fills the remaining bytes), or None for anything else."""
    parts = host.split(".")
    if host.endswith("."):  # a trailing dot is still a numeric host to the resolver
        parts.pop()
    if not 1 <= len(parts) <= 4 or not all(_NUMBER.match(p) for p in parts):
        return None
    values = []
    for part in parts:
        if part.startswith("0x"):
            values.append(int(part[2:] or "0", 16))
        elif part.startswith("0") and len(part) > 1:
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for v in head:
        number = number * 256 + v
    return ipaddress.IPv4Address(number * 256 ** (4 - len(head)) + last)


def literal_address(host):
    """The IP address a URL's host spells (any IPv4 spelling, IPv6 with or without a zone), or None
    when it is a name."""
    host = host.lower()
    if ":" in host or "%" in host:
        try:
            return ipaddress.ip_address(urllib.parse.unquote(host).split("%", 1)[0])
        except ValueError:
            raise TargetRefused("the host is not a valid IPv6 address") from None
    return _legacy_ipv4(host)


def _embedded_ipv4(address):
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64, Teredo client), or None."""
    if address.version != 6:
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if (
        address in _NAT64
        or address in _IPV4_TRANSLATED
        or (address in _IPV4_COMPATIBLE and int(address) > 1)
    ):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _is_global(address):
    if (
        address.is_multicast
        or address.is_unspecified
        or address.is_loopback
        or address.is_link_local
    ):
        return False
    if address.version == 6 and address in _SITE_LOCAL:
        return False
    return address.is_global


def refusal(address, allowed):
    """Why fleetd will not post to `address` (a few words: "127.0.0.1, a loopback address"), or None
    when it may: a global unicast address (and any IPv4 address it embeds), or one in an `allowed`
    network."""
    embedded = _embedded_ipv4(address)
    if any(address in net or (embedded is not None and embedded in net) for net in allowed):
        return None
    for candidate in (embedded, address):
        if candidate is not None and not _is_global(candidate):
            spelled = str(address) if candidate is address else f"{address} (that is {candidate})"
            return f"{spelled}, {_rank(candidate)}"
    return None


def _rank(address):
    for name, words in (
        ("loopback", "a loopback address"),
        ("link_local", "a link-local address"),
        ("multicast", "a multicast address"),
        ("unspecified", "an unspecified address"),
        ("private", "a private or reserved address"),
    ):
        if getattr(address, f"is_{name}"):
            return words
    if address.version == 6 and address in _SITE_LOCAL:
        return "a site-local address"
    return "a shared or reserved address"


def _resolve(host, port):
    """The addresses a name resolves to (at most MAX_ADDRESSES, in the resolver's order)."""
    found = []
    for _family, _type, _proto, _name, sockaddr in socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM
    ):
        text = sockaddr[0]
        if not isinstance(
            text, str
        ):  # an IPv6 address of a Python built without IPv6: (flow info, bytes)
            raise ValueError(f"{host} resolves to an address with no text form")
        address = ipaddress.ip_address(text.split("%", 1)[0])
        if address not in found:
            found.append(address)
        if len(found) >= MAX_ADDRESSES:
            break
    return found


def _host_and_port(url):
    """The URL's host as the resolver reads it (see resolver_host) and its port."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused("not a URL with a valid host and port") from None
    return resolver_host(host), port


def resolver_host(host):
    """`host` as `socket.getaddrinfo` is given it: an IPv6 literal as it is, any other host through
    Python's IDNA codec (nameprep maps `①` to `1` and full-width letters to ASCII, and `。`, `．`,
    `｡` separate labels as `.` does). TargetRefused when the codec refuses it (the resolver
    would)."""
    if ":" in host or host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise TargetRefused(
            "the URL must name a host that the resolver can read (IDNA refuses this one)"
        ) from None


def _is_local_name(host):
    name = host.lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost")


def _addresses(host, port):
    """The addresses a URL's host stands for: the one it spells, 127.0.0.1 for localhost names
    (RFC 6761: never asked of DNS), or those the name resolves to (OSError when it does not)."""
    address = literal_address(host)
    if address is not None:
        return [address]
    if _is_local_name(host):
        return [ipaddress.IPv4Address("127.0.0.1")]
    try:
        return _resolve(host, port)
    except (UnicodeError, ValueError):
        raise OSError("the host name cannot be resolved") from None


def _refuse_any(host, addresses, allowed):
    for address in addresses:
        problem = refusal(address, allowed)
        if problem:
            where = "the host is" if literal_address(host) is not None else f"{host} resolves to"
            raise TargetRefused(
                f"{where} {problem}; webhooks post only to global addresses unless the "
                f"setting webhooks_allow_targets allows its network"
            )


def check_url(url, allowed):
    """At create time: TargetRefused when the URL's host is an address (in any spelling) or a
    localhost name that fleetd will not post to. Other names are not resolved here: a request
    never waits on DNS, and every delivery resolves the name and checks its addresses (pin)."""
    host, _port = _host_and_port(url)
    address = literal_address(host)
    if address is None and _is_local_name(host):
        address = ipaddress.IPv4Address("127.0.0.1")
    if address is not None:
        _refuse_any(host, [address], allowed)


def pin(url, allowed):
    """At delivery: (host, port, [addresses]) to connect to, every one of them checked;
    TargetRefused when any address the host has is refused (a name with one private address among
    public ones is not trusted), OSError when the name does not resolve."""
    host, port = _host_and_port(url)
    addresses = _addresses(host, port)
    if not addresses:
        raise OSError("the host name resolves to no address")
    _refuse_any(host, addresses, allowed)
    return host, port, addresses
