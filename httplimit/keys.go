package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns a KeyFunc that keys requests by the client's IP address,
// as text (IPv4-mapped IPv6 addresses as IPv4, zones dropped).
//
// With no trustedProxies it is the address of the connection's peer, from
// r.RemoteAddr: headers are ignored, since any client can send them.
//
// When the peer is in one of trustedProxies (your load balancers and reverse
// proxies), the client is found in the headers those proxies set:
// X-Forwarded-For is read right to left (every X-Forwarded-For line, in
// order), skipping addresses in trustedProxies, and the first one outside
// them is the client; entries further left were written by the client and
// are never believed. When every entry is trusted, the leftmost is the
// client. Without X-Forwarded-For, X-Real-IP is used; without either, the
// peer. An entry that is not an IP address (with or without a port) is an
// error: a trusted proxy wrote it, so the chain is misconfigured.
//
// IPv6 clients often own a whole /64; key by a prefix in your own KeyFunc if
// that matters to you.
func ClientIP(trustedProxies ...netip.Prefix) KeyFunc {
	trusted := make([]netip.Prefix, len(trustedProxies))
	for i, p := range trustedProxies {
		trusted[i] = p.Masked()
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseHostPort(r.RemoteAddr)
		if err != nil {
			return "", fmt.Errorf("client IP: RemoteAddr %q: %w", r.RemoteAddr, err)
		}
		if !isTrusted(peer) {
			return peer.String(), nil
		}
		if lines := r.Header.Values("X-Forwarded-For"); len(lines) > 0 {
			hops := strings.Split(strings.Join(lines, ","), ",")
			var client netip.Addr
			for i := len(hops) - 1; i >= 0; i-- {
				hop := strings.TrimSpace(hops[i])
				if hop == "" {
					continue // "a, , b" or an empty line: nothing was said
				}
				addr, err := parseAddr(hop)
				if err != nil {
					return "", fmt.Errorf("client IP: X-Forwarded-For entry %q from trusted proxy %v: %w", hop, peer, err)
				}
				client = addr
				if !isTrusted(addr) {
					break
				}
			}
			if client.IsValid() {
				return client.String(), nil
			}
		}
		if real := strings.TrimSpace(r.Header.Get("X-Real-IP")); real != "" {
			addr, err := parseAddr(real)
			if err != nil {
				return "", fmt.Errorf("client IP: X-Real-IP %q from trusted proxy %v: %w", real, peer, err)
			}
			return addr.String(), nil
		}
		return peer.String(), nil
	}
}

// Header returns a KeyFunc that keys requests by the value of the named
// header (an API key, a tenant ID), with surrounding spaces trimmed. A
// request without it, or with only spaces, gets an error: the middleware
// answers it through the ErrorHandler (500 by default). To let such requests
// through under another key, write a KeyFunc that falls back to ClientIP.
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("header %s: missing or empty", name)
		}
		return v, nil
	}
}

// parseHostPort parses a RemoteAddr: host:port, or a bare address.
func parseHostPort(s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), nil
	}
	return parseAddr(s)
}

// parseAddr parses an address as proxies write it: 192.0.2.1, 2001:db8::1,
// [2001:db8::1], or any of them with a port.
func parseAddr(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), nil
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return normalize(a), nil
		}
	}
	return netip.Addr{}, errors.New("not an IP address")
}

func normalize(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}
