package outbox

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/net/idna"
)

// A merchant chooses the URL kasa calls, so without a policy a webhook is a way into kasa's own
// network: its loopback, the cloud's metadata service, private services. CheckWebhookURL applies
// the policy to a URL at registration; the sender applies it again to every address it dials,
// because a name can resolve elsewhere later (DNS rebinding).

// ErrWebhookURL is the error class of CheckWebhookURL's answers.
var ErrWebhookURL = errors.New("webhook url refused")

// AddressError says why an address is refused.
type AddressError struct {
	Addr   netip.Addr
	Reason string // "loopback", "private", ...
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("%s is %s", e.Addr, phrase(e.Reason))
}

// Policy is where webhooks may go.
type Policy struct {
	// AllowPrivate lets webhooks go to loopback, private and link-local addresses (local
	// development and tests).
	AllowPrivate bool
	Own          OwnHosts // refused under any policy
}

// urlError is a refusal worded for the merchant's field.
type urlError struct{ msg string }

func (e *urlError) Error() string        { return e.msg }
func (e *urlError) Is(target error) bool { return target == ErrWebhookURL }

// CheckWebhookURL reports why kasa would refuse to call raw; nil when it would call it. The URL
// must be absolute http(s) with a host and no credentials in it, and must not name one of kasa's
// own hosts. Unless the policy allows private addresses, its host must not be a loopback,
// private, link-local, shared (CGNAT), multicast, reserved or unspecified address, in any
// spelling (http://2130706433/ and http://[::ffff:127.0.0.1]/ are 127.0.0.1), nor "localhost".
// Other names are resolved when kasa dials them, not here: an answer now says nothing about the
// next one. The error's text is for the merchant.
func CheckWebhookURL(raw string, p Policy) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return &urlError{"must be an http(s) URL"}
	}
	// Credentials in a URL are kept and shown as it is (delivery logs, admin answers); the
	// signature is how a merchant authenticates kasa.
	if u.User != nil {
		return &urlError{"must not carry credentials (user:password@): authenticate kasa by the Kasa-Signature header"}
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return &urlError{"must have a port from 1 to 65535"}
		}
	}
	// The HTTP client maps a name that is not ASCII to its IDNA form before it dials
	// ("１２７。0。0。1" is 127.0.0.1): the checks read that form.
	host := u.Hostname()
	if !ascii(host) {
		if host, err = idna.Lookup.ToASCII(host); err != nil {
			return &urlError{"must have a valid host name"}
		}
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if p.Own.name(host) {
		return &urlError{"must not point at kasa itself (" + host + ")"}
	}
	if a, ok := literal(host); ok && p.Own.addr(a) {
		return &urlError{fmt.Sprintf("must not point at kasa itself (%s)", a.WithZone("").Unmap())}
	}
	if p.AllowPrivate {
		return nil
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return &urlError{"must not point at a loopback address (localhost)"}
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		var ok bool
		if addr, ok = inetAton(host); !ok {
			return nil // a name: checked at dial time
		}
		if reason := refused(addr); reason == "" {
			// Parsers disagree on these spellings; only the usual one is unambiguous.
			return &urlError{"must give an IP address in its usual form (" + addr.String() + ")"}
		}
	}
	if reason := refused(addr); reason != "" {
		return &urlError{fmt.Sprintf("must not point at %s (%s)", phrase(reason), addr.WithZone("").Unmap())}
	}
	return nil
}

func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// literal is host as an address, when it is one in any spelling.
func literal(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, true
	}
	return inetAton(host)
}

// phrase names a refusal's kind of address: "a loopback address", "kasa's own address".
func phrase(reason string) string {
	if reason == reasonOwn {
		return "one of kasa's own addresses"
	}
	return article(reason) + " " + reason + " address"
}

func article(word string) string {
	if strings.IndexByte("aeiou", word[0]) >= 0 {
		return "an"
	}
	return "a"
}

// inetAton reads host as the IPv4 forms C resolvers and some proxies accept besides the dotted
// quad: 1 to 4 parts, each decimal, octal (leading 0) or hex (0x), the last filling the
// remaining bytes (http://2130706433/ and http://127.1/ are 127.0.0.1).
func inetAton(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 0, 32) // base 0: 0x.. hex, 0.. octal, else decimal
		if err != nil || p == "" {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	// The last part fills the remaining bytes: a.b.c.d, a.b.(16 bits), a.(24 bits), (32 bits).
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// Refused ranges beyond what netip's predicates name, and the address families that embed an
// IPv4 address (checked as that address).
var (
	refusedPrefixes = []struct {
		p      netip.Prefix
		reason string
	}{
		{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"}, // "this network": Linux dials 0.x as local
		{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT)"},
		{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
		{netip.MustParsePrefix("192.0.2.0/24"), "reserved"},
		{netip.MustParsePrefix("198.18.0.0/15"), "reserved"},
		{netip.MustParsePrefix("198.51.100.0/24"), "reserved"},
		{netip.MustParsePrefix("203.0.113.0/24"), "reserved"},
		{netip.MustParsePrefix("240.0.0.0/4"), "reserved"}, // and 255.255.255.255
		{netip.MustParsePrefix("::/96"), "reserved"},       // IPv4-compatible, deprecated
		{netip.MustParsePrefix("100::/64"), "reserved"},    // discard-only
		{netip.MustParsePrefix("2001:db8::/32"), "reserved"},
		{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64"}, // a site's own translator, to any IPv4 it routes
		{netip.MustParsePrefix("2001::/32"), "Teredo"},           // tunnels to an IPv4 address it hides
		{netip.MustParsePrefix("fec0::/10"), "site-local"},       // deprecated, still routed inside some sites
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// CheckAddr says whether kasa may send a webhook to addr (nil) or why not (*AddressError).
func CheckAddr(addr netip.Addr) error {
	if reason := refused(addr); reason != "" {
		return &AddressError{Addr: addr.WithZone("").Unmap(), Reason: reason}
	}
	return nil
}

// refused is why addr is refused, or "".
func refused(addr netip.Addr) string {
	a := addr.WithZone("").Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	}
	for _, r := range refusedPrefixes {
		if r.p.Contains(a) {
			return r.reason
		}
	}
	// Addresses that carry an IPv4 address are judged by it.
	if v4, ok := embeddedIPv4(a); ok {
		if reason := refused(v4); reason != "" {
			return reason + " (embedded IPv4)"
		}
	}
	return ""
}

// embeddedIPv4 is the IPv4 address a NAT64 (64:ff9b::/96) or 6to4 (2002::/16) address carries:
// a NAT64 gateway or a 6to4 relay delivers to that address.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// dialControl is a net.Dialer's Control: it runs after the name was resolved, on the very
// address about to be connected to, so no resolver answer can slip past it.
func (p Policy) dialControl(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook dial: unexpected address %q", address)
	}
	if p.Own.addr(ap.Addr()) {
		return &AddressError{Addr: ap.Addr().WithZone("").Unmap(), Reason: reasonOwn}
	}
	if p.AllowPrivate {
		return nil
	}
	return CheckAddr(ap.Addr())
}
