package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// ErrMissingKey is matched when a request lacks what its key is made of (an
// API key header, say): the client's fault, so DefaultErrorHandler answers
// 400 Bad Request. The middleware hands it on wrapped with ErrKey, so both
// match.
var ErrMissingKey = errors.New("httplimit: the request lacks its rate limit key")

// Proxies says which reverse proxies to believe and which header they use to
// pass on the client's address. Only a proxy in Trusted is believed, and
// only the header named in Header is read: a header of another name may have
// come from the client untouched, so it is never looked at.
type Proxies struct {
	// Header is the header the trusted proxies set: "X-Forwarded-For" (the
	// default when empty), "Forwarded" (RFC 7239) or "X-Real-IP". Any other
	// value makes ClientIPBehind panic.
	//
	// X-Forwarded-For and Forwarded are lists that each proxy appends to.
	// They are read right to left, skipping trusted addresses; the first
	// untrusted one is the client, and entries further left, which the
	// client may have written, are never believed. When every entry is
	// trusted, the leftmost is the client. X-Real-IP is one address that
	// the proxy sets, replacing the client's: its last line is read.
	Header string
	// Trusted are the prefixes of your proxies. IPv4-mapped IPv6 prefixes
	// (::ffff:10.0.0.0/104) are taken as the IPv4 prefix they map
	// (10.0.0.0/8), since addresses are compared unmapped; one shorter than
	// /96, or an invalid prefix, makes ClientIPBehind panic.
	Trusted []netip.Prefix
	// UnixSocket trusts a peer that has no IP address: a connection over a
	// unix socket, whose RemoteAddr is "@", a path or empty. Set it when
	// your proxy talks to the service over a unix socket. Without it such a
	// request gets an error (500: the server is set up wrongly, not the
	// client).
	UnixSocket bool
}

// ClientIP returns a KeyFunc that keys requests by the client's IP address,
// as text (IPv4-mapped IPv6 addresses as IPv4, zones dropped).
//
// With no trustedProxies it is the address of the connection's peer, from
// r.RemoteAddr: headers are ignored, since any client can send them. With
// trustedProxies it is ClientIPBehind(Proxies{Trusted: trustedProxies}):
// X-Forwarded-For is read from a trusted peer. If your proxies set
// Forwarded or X-Real-IP instead, use ClientIPBehind and name that header:
// reading X-Forwarded-For behind a proxy that does not write it lets every
// client choose its own key.
//
// IPv6 clients often own a whole /64; key by a prefix in your own KeyFunc if
// that matters to you.
func ClientIP(trustedProxies ...netip.Prefix) KeyFunc {
	return ClientIPBehind(Proxies{Trusted: trustedProxies})
}

// ClientIPBehind returns a KeyFunc that keys requests by the client's IP
// address as the trusted proxies in p report it (see Proxies). A request
// whose peer is not trusted is keyed by the peer's address. An entry from a
// trusted proxy that is not an address is an error (the chain is
// misconfigured), except Forwarded's "unknown" and obfuscated identifiers
// ("_hidden"), which a proxy writes on purpose: the identifier, without a
// port, is then the key, so such clients share one limit; an address with
// an obfuscated port ("192.0.2.43:_abc") is the address. It panics on an
// invalid p: a programming error, caught at start-up.
func ClientIPBehind(p Proxies) KeyFunc {
	header := http.CanonicalHeaderKey(p.Header)
	if p.Header == "" {
		header = "X-Forwarded-For"
	}
	var read func(r *http.Request, isTrusted func(netip.Addr) bool) (string, error)
	switch header {
	case "X-Forwarded-For":
		read = readXForwardedFor
	case "Forwarded":
		read = readForwarded
	case "X-Real-Ip":
		read = readXRealIP
	default:
		panic(fmt.Sprintf("httplimit: Proxies.Header %q: must be X-Forwarded-For, Forwarded or X-Real-IP", p.Header))
	}
	trusted := make([]netip.Prefix, len(p.Trusted))
	for i, prefix := range p.Trusted {
		trusted[i] = normalizePrefix(prefix)
	}
	isTrusted := func(a netip.Addr) bool {
		for _, prefix := range trusted {
			if prefix.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseHostPort(r.RemoteAddr)
		switch {
		case err != nil && !p.UnixSocket:
			return "", fmt.Errorf("client IP: RemoteAddr %q: %w (a unix socket peer is trusted only with Proxies.UnixSocket)", r.RemoteAddr, err)
		case err == nil && !isTrusted(peer):
			return peer.String(), nil
		}
		client, err := read(r, isTrusted)
		if err != nil || client != "" {
			return client, err
		}
		if !peer.IsValid() {
			return "", fmt.Errorf("client IP: trusted unix socket peer sent no %s", header)
		}
		return peer.String(), nil
	}
}

// normalizePrefix masks p and turns an IPv4-mapped prefix into its IPv4 one.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	if !p.IsValid() {
		panic(fmt.Sprintf("httplimit: trusted proxy prefix %v: invalid", p))
	}
	if p.Addr().Is4In6() {
		if p.Bits() < 96 {
			panic(fmt.Sprintf("httplimit: trusted proxy prefix %v: an IPv4-mapped prefix shorter than /96 mixes IPv4 and IPv6 addresses; write the IPv4 or IPv6 prefix you mean", p))
		}
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// readXForwardedFor walks X-Forwarded-For (every line, last line first)
// right to left. It returns "" when the header says nothing. It splits
// nothing ahead: a client's line of commas costs no memory.
func readXForwardedFor(r *http.Request, isTrusted func(netip.Addr) bool) (string, error) {
	lines := r.Header.Values("X-Forwarded-For")
	var client netip.Addr
	for i := len(lines) - 1; i >= 0; i-- {
		for rest := lines[i]; ; {
			comma := strings.LastIndexByte(rest, ',')
			hop := strings.TrimSpace(rest[comma+1:])
			if hop != "" { // "a, , b" or an empty line: nothing was said
				addr, err := parseAddr(hop)
				if err != nil {
					return "", fmt.Errorf("client IP: X-Forwarded-For entry %q from a trusted proxy: %w", boundQuote(hop), err)
				}
				client = addr
				if !isTrusted(addr) {
					return client.String(), nil
				}
			}
			if comma < 0 {
				break
			}
			rest = rest[:comma]
		}
	}
	if !client.IsValid() {
		return "", nil
	}
	return client.String(), nil
}

// readForwarded walks the for= parameters of Forwarded (RFC 7239) right to
// left, one header line at a time, last line first. Each line is parsed on
// its own (parseForwardedLine): a line is never joined to the next, so a
// client's unclosed quote cannot reach into the element a trusted proxy
// appends. What a line holds left of a syntax error is unreadable, and
// reading stops there: the client is then the leftmost address read, and
// when none was read (the nearest proxy's own element is unreadable) the
// result is an error.
func readForwarded(r *http.Request, isTrusted func(netip.Addr) bool) (string, error) {
	lines := r.Header.Values("Forwarded")
	client := ""
	for i := len(lines) - 1; i >= 0; i-- {
		nodes, whole := parseForwardedLine(lines[i])
		for j := len(nodes) - 1; j >= 0; j-- {
			node := nodes[j]
			if name, hidden := hiddenNode(node); hidden {
				// The proxy hid the client on purpose; nothing left of it
				// can be believed.
				return name, nil
			}
			addr, err := parseAddr(withoutObfuscatedPort(node))
			if err != nil {
				return "", fmt.Errorf("client IP: Forwarded for=%q from a trusted proxy: %w", boundQuote(node), err)
			}
			client = addr.String()
			if !isTrusted(addr) {
				return client, nil
			}
		}
		if !whole {
			if client == "" {
				// The nearest trusted proxy's own element is unreadable:
				// the chain is misconfigured, and no key can be believed.
				return "", fmt.Errorf("client IP: Forwarded line %q from a trusted proxy: syntax error at its end", boundQuote(lines[i]))
			}
			break
		}
	}
	return client, nil
}

// hiddenNode reports a for= node that hides the client (RFC 7239 §6):
// "unknown", in any case, or an obfuscated identifier ("_" and more), and
// returns its name without the port a proxy may add: a port that differs
// per connection must not give one client a key per connection.
func hiddenNode(node string) (name string, hidden bool) {
	name, _, _ = strings.Cut(node, ":")
	switch {
	case strings.EqualFold(name, "unknown"):
		return "unknown", true
	case strings.HasPrefix(name, "_"):
		return name, true
	}
	return "", false
}

// parseForwardedLine parses one Forwarded header line: a comma-separated
// list (RFC 7230 §7, empty elements allowed) of elements, each pairs
// token=value (token or quoted-string, RFC 7230 §3.2.6) separated by ';'.
// It returns the for= values (unquoted) of the elements that have one, in
// order: an element without for= says nothing of the client. whole
// reports a line that is well-formed throughout. A line that is not yields
// only the elements after its last syntax error: the longest run of
// comma-separated parts at its end that each parse as a whole element.
// That is what a proxy appended to a client's broken line; quoted strings
// holding commas are lost there, and proxies write none (for=, by=,
// host= and proto= values never hold one). Work is linear in the line,
// and memory in its for= values: empty elements cost nothing.
func parseForwardedLine(line string) (nodes []string, whole bool) {
	if nodes, ok := parseForwardedList(line); ok {
		return nodes, true
	}
	var tail []string
	for rest := line; ; {
		comma := strings.LastIndexByte(rest, ',')
		p := forwardedParser{s: rest[comma+1:]}
		p.skipOWS()
		node, hasFor, ok := p.element()
		p.skipOWS()
		if !ok || !p.done() {
			break
		}
		if hasFor {
			tail = append(tail, node)
		}
		if comma < 0 {
			break
		}
		rest = rest[:comma]
	}
	slices.Reverse(tail)
	return tail, false
}

// parseForwardedList parses a whole line strictly; ok is false on any
// syntax error.
func parseForwardedList(line string) (nodes []string, ok bool) {
	p := forwardedParser{s: line}
	for {
		p.skipOWS()
		node, hasFor, ok := p.element()
		if !ok {
			return nil, false
		}
		if hasFor {
			nodes = append(nodes, node)
		}
		p.skipOWS()
		if p.done() {
			return nodes, true
		}
		if !p.consume(',') {
			return nil, false
		}
	}
}

// forwardedParser reads a Forwarded line from position pos of s.
type forwardedParser struct {
	s   string
	pos int
}

func (p *forwardedParser) done() bool { return p.pos == len(p.s) }

func (p *forwardedParser) consume(c byte) bool {
	if p.pos < len(p.s) && p.s[p.pos] == c {
		p.pos++
		return true
	}
	return false
}

func (p *forwardedParser) skipOWS() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

// element reads [pair] *(";" [pair]) up to a ',' or the end, and returns
// its for= value. A parameter named twice in one element is an error (RFC
// 7239 §4): which would count?
func (p *forwardedParser) element() (forNode string, hasFor, ok bool) {
	for {
		p.skipOWS()
		if p.pos < len(p.s) && p.s[p.pos] != ';' && p.s[p.pos] != ',' {
			name := p.token()
			if name == "" || !p.consume('=') {
				return "", false, false
			}
			var value string
			if p.pos < len(p.s) && p.s[p.pos] == '"' {
				v, ok := p.quotedString()
				if !ok {
					return "", false, false
				}
				value = v
			} else if value = p.token(); value == "" {
				return "", false, false
			}
			if strings.EqualFold(name, "for") {
				if hasFor {
					return "", false, false
				}
				forNode, hasFor = value, true
			}
		}
		p.skipOWS()
		if !p.consume(';') {
			return forNode, hasFor, true
		}
	}
}

// token reads an RFC 7230 token; "" when there is none.
func (p *forwardedParser) token() string {
	start := p.pos
	for p.pos < len(p.s) && isTokenChar(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos]
}

// quotedString reads a quoted-string and returns its value with the
// quoted-pairs undone; ok is false when it is not closed or holds a byte
// that qdtext and quoted-pair do not allow (controls other than HTAB, DEL).
// It copies nothing unless the value has a quoted-pair: an unclosed quote
// running to the end of a long line costs no memory.
func (p *forwardedParser) quotedString() (string, bool) {
	p.pos++ // the opening quote
	start, escaped := p.pos, false
	for p.pos < len(p.s) {
		c := p.s[p.pos]
		p.pos++
		switch {
		case c == '"':
			value := p.s[start : p.pos-1]
			if escaped {
				var b strings.Builder
				for i := 0; i < len(value); i++ {
					if value[i] == '\\' {
						i++ // a quoted-pair: the byte after it is the value's
					}
					b.WriteByte(value[i])
				}
				value = b.String()
			}
			return value, true
		case c == '\\':
			if p.pos == len(p.s) || !isQuotedTextChar(p.s[p.pos]) && p.s[p.pos] != '"' && p.s[p.pos] != '\\' {
				return "", false
			}
			escaped = true
			p.pos++
		case !isQuotedTextChar(c):
			return "", false
		}
	}
	return "", false // unclosed
}

// isQuotedTextChar reports qdtext: HTAB, SP, visible ASCII but '"' and
// '\', and obs-text.
func isQuotedTextChar(c byte) bool {
	return c == '\t' || c == ' ' || c >= 0x21 && c != '"' && c != '\\' && c != 0x7f
}

// isTokenChar reports a tchar of RFC 7230 §3.2.6.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// readXRealIP reads the last X-Real-IP line: the one the nearest proxy set.
func readXRealIP(r *http.Request, _ func(netip.Addr) bool) (string, error) {
	lines := r.Header.Values("X-Real-Ip")
	if len(lines) == 0 {
		return "", nil
	}
	value := strings.TrimSpace(lines[len(lines)-1])
	if value == "" {
		return "", nil
	}
	addr, err := parseAddr(value)
	if err != nil {
		return "", fmt.Errorf("client IP: X-Real-IP %q from a trusted proxy: %w", boundQuote(value), err)
	}
	return addr.String(), nil
}

// Header returns a KeyFunc that keys requests by the value of the named
// header (an API key, a tenant ID), with surrounding spaces trimmed. A
// request without it, or with only spaces, gets an error matching
// ErrMissingKey: DefaultErrorHandler answers 400 Bad Request. To let such
// requests through under another key, write a KeyFunc that falls back to
// ClientIP. It panics on an empty or invalid header name: a programming
// error, caught at start-up.
func Header(name string) KeyFunc {
	if !validHeaderName(name) {
		panic(fmt.Sprintf("httplimit: Header(%q): not a valid header name", name))
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("header %s: missing or empty: %w", name, ErrMissingKey)
		}
		return v, nil
	}
}

// validHeaderName reports whether name is a non-empty HTTP token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return false
		}
	}
	return true
}

// boundQuote shortens a value for an error message: a header is the
// client's, and an error must not grow with it.
func boundQuote(s string) string {
	const most = 64
	if len(s) > most {
		return s[:most] + "…"
	}
	return s
}

// parseHostPort parses a RemoteAddr: host:port, or a bare address.
func parseHostPort(s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), nil
	}
	return parseAddr(s)
}

// withoutObfuscatedPort returns a for= node without its port when that port
// is obfuscated (RFC 7239 §6: "_" then letters, digits, ".", "_" or "-"):
// "192.0.2.43:_abc" is 192.0.2.43, and "[2001:db8::1]:_p" [2001:db8::1].
func withoutObfuscatedPort(node string) string {
	i := strings.LastIndexByte(node, ':')
	if i < 0 || len(node) < i+3 || node[i+1] != '_' {
		return node
	}
	for _, c := range []byte(node[i+2:]) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return node
		}
	}
	return node[:i]
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
