// settings.go: how messages name a setting, shared by main.go, which
// parses them, and the stages that check their own settings or find one
// missing at run time; and the types of settings that hold more than a
// number or a word. It uses nothing of any other file, so every file may
// use it.

package main

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// envName is the environment fallback of a flag: DATABASE_URL for
// -database-url, OUTBOXD_RELAY_BATCH for -relay-batch.
func envName(flagName string) string {
	if flagName == "database-url" {
		return "DATABASE_URL"
	}
	return "OUTBOXD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// setting names a flag and its environment variable, for messages, so
// that an operator finds it whichever way they configure outboxd.
func setting(name string) string { return fmt.Sprintf("-%s (%s)", name, envName(name)) }

// maxRetention bounds every retention window, configured or advertised by
// a receiver: ten years is "keep", and a larger value is a typo.
const maxRetention = 10 * 365 * 24 * time.Hour

// prefixList is a setting holding network prefixes, written as a
// comma-separated list of CIDR prefixes or single addresses (a /32 or a
// /128): -trusted-proxies.
type prefixList []netip.Prefix

func (l *prefixList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Set replaces the list with the one s writes; an empty s empties it.
func (l *prefixList) Set(s string) error {
	var list prefixList
	for _, field := range strings.Split(s, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		p, err := netip.ParsePrefix(field)
		if err != nil {
			a, aerr := netip.ParseAddr(field)
			if aerr != nil {
				return fmt.Errorf("%q is neither an address nor a CIDR prefix", field)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		list = append(list, p.Masked())
	}
	*l = list
	return nil
}

// contains reports whether a is in one of the prefixes; an IPv4 address
// written as IPv6 (::ffff:10.0.0.1) is taken as the IPv4 one.
func (l prefixList) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range l {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
