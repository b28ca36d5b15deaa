package outbox

import (
	"net/netip"
	"strings"
)

// reasonOwn is the refusal of kasa's own public addresses.
const reasonOwn = "kasa's own"

// OwnHosts are kasa's own public host names and networks (its load balancer's): a webhook URL
// naming them, or a name resolving into them, is refused under any policy, so a merchant cannot
// make kasa call itself.
type OwnHosts struct {
	names    []string
	prefixes []netip.Prefix
}

// NewOwnHosts reads CIDR networks, addresses, and host names (anything else; the configuration
// checks their spelling).
func NewOwnHosts(list []string) OwnHosts {
	var o OwnHosts
	for _, s := range list {
		s = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 { // addresses are checked unmapped
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			o.prefixes = append(o.prefixes, p.Masked())
		} else if a, err := netip.ParseAddr(s); err == nil {
			o.prefixes = append(o.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		} else if s != "" {
			o.names = append(o.names, s)
		}
	}
	return o
}

// name is whether host (lower case, no trailing dot) is one of the names.
func (o OwnHosts) name(host string) bool {
	for _, n := range o.names {
		if host == n {
			return true
		}
	}
	return false
}

// addr is whether a is in one of the networks, or carries an IPv4 address that is: on an
// IPv6-only network DNS64 answers kasa's IPv4 load balancer as 64:ff9b::<its address>.
func (o OwnHosts) addr(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	v4, embeds := embeddedIPv4(a)
	for _, p := range o.prefixes {
		if p.Contains(a) || (embeds && p.Contains(v4)) {
			return true
		}
	}
	return false
}

// Empty is whether there is nothing to refuse.
func (o OwnHosts) Empty() bool { return len(o.names) == 0 && len(o.prefixes) == 0 }
